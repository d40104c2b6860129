"""Tests of the cost model and the heuristic that picks a decomposition with it."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_streamk.cost_model import (
    DEFAULT_COST,
    CostModelError,
    CostParams,
    calibrate,
    candidates,
    choose,
    critical_features,
    predicted_time,
)
from tvm_streamk.decomposition import DecompositionError, plan

STREAM_K_FAMILY = ("stream_k", "hybrid", "split_k")
HAND = CostParams(c_iter=1.0, c_seg=4.0, c_fix=3.0, c_block=1.0)


def test_data_parallel_waves():
    # Blocks 0 and 1 run 1 + 4 + 4 = 9 units each; block 2 follows on the first free slot.
    p = plan(3, 4, 2, policy="data_parallel")
    assert predicted_time(p, cost=HAND) == 18.0
    assert critical_features(p, cost=HAND) == (8.0, 2.0, 0.0, 2.0)


def test_stream_k_owner_waits_for_its_peer():
    # Block 1 writes tile 1's partial at 1 + (4 + 2) + 3 = 10; block 0 reaches the fixup at
    # 1 + (4 + 4) + (4 + 2) = 15, so no wait, then reads one partial: 18.
    p = plan(3, 4, 2, policy="stream_k")
    assert predicted_time(p, cost=HAND) == 18.0
    # With expensive partials the owner waits: the writer finishes at 1 + 6 + 20 = 27 > 1 + 14.
    slow = CostParams(c_seg=4.0, c_fix=20.0, c_block=1.0)
    assert predicted_time(p, cost=slow) == 27.0 + 20.0


def test_split_k_owner_waits_for_all_splits():
    # One tile, 8 panels in 2 splits of 4: both blocks reach 1 + 4 + 4 = 9; the writer adds 3 (12),
    # the owner waits for it and reads one partial: 15.
    p = plan(1, 8, 4, policy="split_k", splits=2)
    assert predicted_time(p, cost=HAND) == 15.0


def test_atomic_fixup_zeroes_first_and_never_waits():
    # The prologue zeroes tile 1 (1 + 4 = 5); then each block runs its segments and every
    # segment of tile 1 adds 3 for its atomic accumulate: 5 + 1 + (4 + 4) + (4 + 2) + 3 = 23.
    p = plan(3, 4, 2, policy="stream_k")
    assert predicted_time(p, cost=HAND, fixup="atomic") == 23.0
    assert critical_features(p, cost=HAND, fixup="atomic") == (6.0, 3.0, 1.0, 2.0)
    slow = CostParams(c_seg=4.0, c_fix=20.0, c_block=1.0)
    assert predicted_time(p, cost=slow, fixup="atomic") == 5.0 + 1.0 + 8.0 + 6.0 + 20.0


def test_an_sm_below_saturation_runs_at_its_occupancy_law():
    # One tile of 8 panels on an SM whose saturation is 4 blocks: latency-bound (exponent 1)
    # the lone block runs an iteration in 4 units; with exponent 0.5 in 4 ** 0.5 = 2.
    p = plan(1, 8, 1, 4, policy="data_parallel")
    bound = CostParams(c_seg=0.0, c_fix=0.0, c_block=0.0)
    assert predicted_time(p, cost=bound, saturation=4) == 32.0
    half = CostParams(c_seg=0.0, c_fix=0.0, c_block=0.0, occupancy_exponent=0.5)
    assert predicted_time(p, cost=half, saturation=4) == 16.0
    # At saturation the law does not apply: four tiles, four blocks, one unit per iteration
    # each, shared by the four.
    four = plan(4, 8, 1, 4, policy="data_parallel")
    assert predicted_time(four, cost=half, saturation=4) == predicted_time(
        four, cost=bound, saturation=4
    )


def test_the_owner_pays_one_hand_off_and_the_other_partials_at_their_bytes():
    # One tile of 8 panels split in 4 on 4 SMs: the owner reads 3 partials. At read_fraction 1
    # each costs c_fix (3 x 3); at 0.25 the first costs c_fix and the other two a quarter each.
    p = plan(1, 8, 4, policy="split_k", splits=4)
    whole = predicted_time(p, cost=HAND)
    cheap = predicted_time(
        p, cost=CostParams(c_seg=4.0, c_fix=3.0, c_block=1.0, read_fraction=0.25)
    )
    assert whole - cheap == pytest.approx(2 * 3.0 * 0.75)


def test_unknown_fixup():
    with pytest.raises(
        CostModelError, match=r"fixup must be one of \['atomic', 'workspace', 'separate'\]"
    ):
        predicted_time(plan(3, 4, 2, policy="stream_k"), fixup="reduce")
    with pytest.raises(CostModelError, match="found 'reduce'"):
        plan(3, 4, 2, fixup="reduce")


def test_num_sms_override_and_requirement():
    p = plan(4, 4, None, policy="data_parallel")
    assert predicted_time(p, num_sms=2, cost=HAND) == 2 * 9.0
    assert predicted_time(p, num_sms=4, cost=HAND) == 9.0
    with pytest.raises(CostModelError, match="pass num_sms="):
        predicted_time(p)


@pytest.mark.parametrize("num_sms", [132, 108, 7])
@pytest.mark.parametrize("blocks_per_sm", [1, 2])
@pytest.mark.parametrize("waves", [1, 2, 5])
@pytest.mark.parametrize("panels", [4, 64, 512])
def test_heuristic_picks_data_parallel_on_full_waves(num_sms, blocks_per_sm, waves, panels):
    tiles = num_sms * blocks_per_sm * waves
    p = plan(tiles, panels, num_sms, blocks_per_sm)
    assert p.policy == "data_parallel"
    assert f"{waves} full wave(s)" in p.reason


@pytest.mark.parametrize(
    ("tiles", "panels", "num_sms"),
    [
        (133, 64, 132),  # one tile more than a wave
        (109, 128, 108),
        (3, 64, 2),  # three tiles on two SMs, long K
        (4, 512, 132),  # very few tiles, long K
        (1, 512, 108),
        (200, 128, 132),
    ],
)
@pytest.mark.parametrize("fixup", ["workspace", "atomic"])
def test_heuristic_picks_stream_k_family_when_quantisation_bound(tiles, panels, num_sms, fixup):
    p = plan(tiles, panels, num_sms, fixup=fixup)
    assert p.policy in STREAM_K_FAMILY
    assert "x)" in p.reason and "data_parallel" in p.reason
    dp = plan(tiles, panels, num_sms, policy="data_parallel")
    assert predicted_time(p, fixup=fixup) < predicted_time(dp, fixup=fixup)


def test_atomic_fixup_affords_more_peers():
    # The workspace owner reads its peers' partials one after another, which caps the useful
    # split; atomic accumulation has no such serial step, so Stream-K over every SM wins.
    workspace = plan(4, 512, 132, fixup="workspace")
    atomic = plan(4, 512, 132, fixup="atomic")
    assert (workspace.policy, workspace.splits) == ("split_k", 9)
    assert (atomic.policy, atomic.grid) == ("stream_k", 132)


def test_heuristic_keeps_data_parallel_when_overheads_dominate():
    # One extra tile but only four panels: a second short wave beats any fixup.
    p = plan(133, 4, 132)
    assert p.policy == "data_parallel"
    assert "outweigh the quantisation loss" in p.reason


def test_heuristic_margin():
    # Stream-K saves block launches here but less than the margin asks.
    assert plan(4096, 16, 108).policy == "data_parallel"
    eager = CostParams(min_gain=0.0)
    assert plan(4096, 16, 108, cost=eager).policy != "data_parallel"


def test_ties_prefer_the_more_data_parallel_plan():
    # The two-tile hybrid and Stream-K cut the same segments here; the hybrid keeps its
    # data-parallel waves.
    scored = {(c.policy, c.variant): predicted_time(c) for c in candidates(4096, 512, num_sms=132)}
    assert scored[("hybrid", "two_tile")] == scored[("stream_k", None)]
    assert choose(4096, 512, 132).variant == "two_tile"


def test_candidates_skip_degenerate_hybrids_and_wide_splits():
    policies = [(c.policy, c.splits, c.variant) for c in candidates(133, 64, 132)]
    assert ("hybrid", 1, "two_tile") not in policies  # the same as stream_k here
    assert not any(p == "split_k" for p, _, _ in policies)  # 266 blocks > 2 waves of 132
    few = [c.splits for c in candidates(2, 64, 132) if c.policy == "split_k"]
    assert few == list(range(2, 17))


def test_reason_is_never_empty():
    for args in [(264, 64, 132), (133, 64, 132), (133, 4, 132), (1, 1, 1), (7, 3, 5)]:
        assert plan(*args).reason


def test_choose_rejects_a_foreign_cost():
    with pytest.raises(DecompositionError, match="CostParams"):
        plan(8, 8, 4, cost={"c_seg": 1.0})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"c_iter": 0.0}, "c_iter must be positive"),
        ({"c_fix": -1.0}, "c_fix must be a finite non-negative number"),
        ({"c_seg": float("nan")}, "c_seg must be a finite"),
        ({"min_gain": 1.0}, r"min_gain must be in \[0, 1\)"),
        ({"occupancy_exponent": 1.5}, r"occupancy_exponent must be a number in \[0, 1\]"),
        ({"read_fraction": -0.1}, r"read_fraction must be a number in \[0, 1\]"),
    ],
)
def test_cost_params_reject(kwargs, message):
    with pytest.raises(CostModelError, match=message):
        CostParams(**kwargs)


def _calibration_plans():
    shapes = [(5, 8, 4), (9, 16, 4), (3, 32, 2), (17, 4, 6), (12, 24, 5), (2, 64, 8), (30, 6, 7)]
    out = []
    for tiles, panels, sms in shapes:
        out.append(plan(tiles, panels, sms, policy="data_parallel"))
        out.append(plan(tiles, panels, sms, policy="stream_k"))
        if tiles > sms and tiles % sms:
            out.append(plan(tiles, panels, sms, policy="hybrid", variant="one_tile"))
        if tiles * 2 <= panels * tiles:
            out.append(plan(tiles, panels, sms, policy="split_k", splits=2))
    return out


@pytest.mark.parametrize("fixup", ["workspace", "atomic"])
def test_calibrate_recovers_known_constants(fixup):
    truth = CostParams(c_iter=1.0, c_seg=9.0, c_fix=2.5, c_block=4.0)
    seconds_per_unit = 2e-7
    data = [
        (p, predicted_time(p, cost=truth, fixup=fixup) * seconds_per_unit)
        for p in _calibration_plans()
    ]
    fit = calibrate(data, fixup=fixup)
    np.testing.assert_allclose(fit.vector(), truth.vector(), rtol=1e-6)
    assert fit.seconds_per_unit == pytest.approx(seconds_per_unit, rel=1e-6)
    assert fit.min_gain == DEFAULT_COST.min_gain


def test_calibrate_tolerates_noise():
    truth = CostParams(c_iter=1.0, c_seg=5.0, c_fix=8.0, c_block=1.5)
    rng = np.random.default_rng(0)
    data = [
        (p, predicted_time(p, cost=truth) * 1e-7 * (1 + 0.01 * rng.standard_normal()))
        for p in _calibration_plans()
    ]
    fit = calibrate(data)
    np.testing.assert_allclose(fit.vector()[:3], truth.vector()[:3], rtol=0.25)
    # Predictions matter more than the constants: they stay within a few percent.
    for p, seconds in data:
        assert predicted_time(p, cost=fit) * fit.seconds_per_unit == pytest.approx(
            seconds, rel=0.05
        )


def test_calibrate_says_what_is_missing():
    only_dp = [(plan(t, 8, 4, policy="data_parallel"), 1e-6 * t) for t in range(1, 9)]
    with pytest.raises(CostModelError, match=r"no measurement exercises \['c_fix'\]"):
        calibrate(only_dp)
    with pytest.raises(CostModelError, match="at least 4 measurements"):
        calibrate(only_dp[:2])
    bad = [(p, -1.0) for p, _ in only_dp]
    with pytest.raises(CostModelError, match="positive finite seconds"):
        calibrate(bad)

"""``tvm_streamk.explain``: report fields checked by hand, read back from schedules, and errors."""

import json
import math

import numpy as np
import pytest

import tvm_streamk
from tests.helpers import OPENCL
from tvm_streamk import cost_model, pocl, workloads
from tvm_streamk.analysis import writeback_tile_shape
from tvm_streamk.explain import ExplainError, explain


def test_hand_checked_stream_k_plan():
    # 3 tiles x 4 panels over 2 blocks: block 0 runs tile 0 whole and tile 1 panels [0, 2),
    # block 1 runs tile 1 panels [2, 4) and tile 2 whole. Tile 1 is split between 2 blocks.
    e = explain(tvm_streamk.plan(3, 4, 2, policy="stream_k"), tile_shape=(32, 32), print_=False)
    s = e.stats
    assert (s.label, s.grid, s.waves) == ("stream_k", 2, 1)
    assert s.iterations_per_block == (6, 6)
    assert s.segments_per_block == (2, 2)
    assert (s.split_tiles, s.max_peers, s.workspace_slots) == (1, 2, 4)
    # Atomic fix-up: no workspace; the prologue zeroes the one split 32x32 fp32 tile.
    assert (s.workspace_bytes, s.zeroed_bytes) == (0, 32 * 32 * 4)
    b = e.baseline_stats
    assert (b.label, b.grid, b.waves, b.split_tiles, b.zeroed_bytes) == (
        "data_parallel",
        3,
        2,
        0,
        0,
    )
    assert b.iterations_per_block == (4, 4)
    # Default constants (c_block 1, c_iter 1, c_seg 6, c_fix 6). Data-parallel: two waves of
    # 1 + 4 + 6 = 22. Stream-K: the prologue (c_block + c_seg = 7), then each block
    # 1 + (4 + 6) + (2 + 6 + 6) = 25.
    assert (s.predicted_units, b.predicted_units) == (32.0, 22.0)
    assert e.speedup == pytest.approx(22 / 32)


def test_workspace_fixup_counts_two_slots_per_block_and_the_counters():
    p = tvm_streamk.plan(3, 4, 2, policy="stream_k")
    e = explain(p, tile_shape=(32, 32), fixup="workspace", print_=False)
    # Two fp32 32x32 slots per block of the grid of 2, and one int32 counter per tile, zeroed.
    assert e.stats.workspace_slots == 4
    assert (e.stats.workspace_bytes, e.stats.zeroed_bytes) == (4 * 32 * 32 * 4 + 3 * 4, 3 * 4)
    assert e.stats.predicted_units == cost_model.predicted_time(p, fixup="workspace")
    # Nothing split, nothing allocated.
    even = tvm_streamk.plan(4, 4, 2, policy="stream_k")
    e = explain(even, tile_shape=(32, 32), fixup="workspace", print_=False)
    assert (e.stats.workspace_bytes, e.stats.zeroed_bytes) == (0, 0)


@pytest.mark.usefixtures("opencl")
@pytest.mark.parametrize("fixup,out_dtype", [("workspace", "float16"), ("atomic", "float32")])
def test_workspace_bytes_match_what_the_built_kernel_allocates(fixup, out_dtype):
    # With fp16 outputs the workspace (fp32 partials) and output element sizes differ; atomics
    # cannot merge through the cast, so that case is fp32.
    func = workloads.gemm(96, 64, 40, in_dtype="float16", out_dtype=out_dtype)
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, fixup=fixup, target=OPENCL)
    e = explain(sch, print_=False)
    assert (e.fixup, e.accumulator_bytes) == (fixup, 4)
    assert e.output_bytes == np.dtype(out_dtype).itemsize
    # The global buffers the host function allocates between launches, as PoCL runs them.
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    allocated = sum(math.prod(w.shape) * np.dtype(w.dtype).itemsize for w in kernel.workspaces)
    assert e.stats.workspace_bytes == allocated
    assert (allocated > 0) == (fixup == "workspace")


def test_split_k_without_sm_count_has_no_waves_or_prediction():
    e = explain(tvm_streamk.plan(3, 4, None, policy="split_k", splits=2), print_=False)
    assert (e.stats.grid, e.stats.split_tiles, e.stats.max_peers) == (6, 3, 2)
    assert e.stats.waves is None and e.stats.predicted_units is None and e.speedup is None
    assert e.stats.workspace_bytes is None
    assert "pass tile_shape=" in str(e)


def test_heuristic_reason_is_reported():
    p = tvm_streamk.plan(133, 64, 132, policy="heuristic", fixup="atomic")
    text = str(explain(p, tile_shape=(128, 128), print_=False))
    assert p.reason and p.reason.split()[0] in text
    assert "132 SMs x 1 block(s)/SM = 132 slots" in text
    assert "133 tiles of 128x128 x 64 K-panels" in text


def test_report_and_dict_agree():
    e = explain(tvm_streamk.plan(3, 4, 2, policy="stream_k"), tile_shape=(32, 32), print_=False)
    d = json.loads(json.dumps(e.as_dict()))
    assert d["policy"] == "stream_k" and d["slots"] == 2 and d["tile_shape"] == [32, 32]
    assert d["plan"]["grid"] == 2 and d["data_parallel"]["grid"] == 3
    assert d["plan"]["iterations_per_block"] == [6, 6]
    assert d["predicted_speedup"] == pytest.approx(22 / 32)
    rows = {line.split("  ")[1].strip(): line.split() for line in str(e).splitlines()[7:]}
    assert rows["grid (blocks)"][-2:] == ["2", "3"]
    assert rows["zeroed bytes (prologue)"][-4:] == ["4,096", "B", "0", "B"]
    assert rows["predicted speed-up"][-2:] == ["0.69x", "1.00x"]


def test_prints_unless_asked_not_to(capsys):
    explain(tvm_streamk.plan(3, 4, 2, policy="stream_k"))
    assert "Stream-K decomposition" in capsys.readouterr().out
    explain(tvm_streamk.plan(3, 4, 2, policy="stream_k"), print_=False)
    assert capsys.readouterr().out == ""


def test_from_a_schedule():
    # 96 x 64 in 32 x 32 tiles = 6 tiles of 5 panels (K = 40, bk = 8), 30 iterations over 4
    # blocks: [0, 7) [7, 15) [15, 22) [22, 30). Tiles 1 and 4 are split.
    func = workloads.gemm(96, 64, 40)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=OPENCL)
    e = explain(sch, print_=False)
    assert e.plan.work == plan.work
    assert (e.function, e.block, e.fixup, e.tile_shape) == ("main", "C_update", "atomic", (32, 32))
    assert (e.stats.split_tiles, e.stats.max_peers) == (2, 2)
    assert e.stats.iterations_per_block == (7, 8)
    assert e.stats.zeroed_bytes == 2 * 32 * 32 * 4
    assert "for block 'C_update' of 'main'" in str(e)
    # The IRModule and the PrimFunc carry the same decision.
    assert explain(sch.mod, print_=False).as_dict() == e.as_dict()
    assert explain(sch.mod["main"], print_=False).stats == e.stats


def test_tile_shape_and_element_sizes_come_from_the_kernel():
    func = workloads.batched_gemm(2, 64, 64, 16, in_dtype="int8")
    sch = workloads.reference_schedule(func, bm=64, tm=8)
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=OPENCL)
    e = explain(sch, print_=False)
    assert e.tile_shape == (1, 64, 32)
    assert (e.accumulator_bytes, e.output_bytes) == (4, 4)
    assert e.stats.zeroed_bytes == e.stats.split_tiles * 64 * 32 * 4
    # An explicit tile shape overrides the one read from the write-back.
    assert explain(sch, tile_shape=(8, 8), print_=False).tile_shape == (8, 8)


def test_writeback_tile_shape_of_uneven_edges_is_the_full_tile():
    func = workloads.gemm(70, 50, 29)
    sch = workloads.reference_schedule(func, bm=64, bn=16, tm=8, tn=2)
    site = tvm_streamk.analysis.analyze(sch.mod["main"], "C_update")
    assert writeback_tile_shape(sch.mod["main"], site) == (64, 16)


def test_refuses_a_schedule_without_a_decision():
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64))
    with pytest.raises(ExplainError, match="no block carries a Stream-K decision"):
        explain(sch, print_=False)


def test_refuses_a_fixup_that_contradicts_the_kernel():
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64))
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=OPENCL)
    with pytest.raises(ExplainError, match="records fixup='atomic'"):
        explain(sch, fixup="workspace", print_=False)
    with pytest.raises(ExplainError, match="records num_sms=3"):
        explain(sch, num_sms=5, print_=False)
    with pytest.raises(ExplainError, match="no block named 'C'"):
        explain(sch, block="C", print_=False)


def test_refuses_bad_arguments():
    p = tvm_streamk.plan(3, 4, 2, policy="stream_k")
    with pytest.raises(ExplainError, match="tile_shape"):
        explain(p, tile_shape=(32, 0), print_=False)
    with pytest.raises(ExplainError, match="fixup"):
        explain(p, fixup="magic", print_=False)
    with pytest.raises(ExplainError, match="apply to kernels"):
        explain(p, block="C_update", print_=False)
    with pytest.raises(ExplainError, match="found int"):
        explain(3, print_=False)

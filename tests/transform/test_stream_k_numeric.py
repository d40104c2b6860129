"""Stream-K kernels run on PoCL against float64 numpy, output poisoned with NaN before each run.

Tolerances: fp32 accumulation of K products of values in [-1, 1] (fp16-rounded for fp16 inputs)
stays within 1e-5 of float64 relative to the largest output; int8 x int8 -> int32 is exact.
"""

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule

import tvm_streamk
from tests.helpers import A100, FP32_TOL, OPENCL
from tests.kernels import GEMM_CASES, gemv_schedule
from tvm_streamk import pocl, workloads
from tvm_streamk._compat import dlight
from tvm_streamk.analysis import first_site

pytestmark = pytest.mark.usefixtures("opencl")


def _run(func, sch, layout="NN"):
    args = workloads.random_args(func)
    assert np.isnan(args[-1]).all() or (args[-1] == -12345).all()
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    return out, workloads.reference(func, args, layout=layout)


@pytest.mark.parametrize("M,N,K,num_sms,what", GEMM_CASES, ids=[c[-1] for c in GEMM_CASES])
def test_stream_k_fp32(M, N, K, num_sms, what):
    func = workloads.gemm(M, N, K)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=num_sms, target=OPENCL)
    assert plan.policy == "stream_k"
    out, ref = _run(func, sch)
    assert workloads.relative_error(out, ref) <= FP32_TOL


def test_case_grid_exercises_what_it_claims():
    by_name = {c[-1]: c for c in GEMM_CASES}

    def plan_of(case):
        M, N, K, sms, _ = case
        tiles = -(-M // 32) * -(-N // 32)
        return tvm_streamk.plan(tiles, -(-K // 8), sms, policy="stream_k")

    shared = plan_of(by_name["tiles < grid: every tile shared by two blocks"])
    assert shared.tiles < shared.grid and all(shared.peers(t) == 2 for t in range(shared.tiles))
    even = plan_of(by_name["tiles == grid: no split tile"])
    assert even.tiles == even.grid and not even.split_tiles
    plus_one = plan_of(by_name["tiles == grid + 1"])
    assert plus_one.tiles == plus_one.grid + 1
    spanning = plan_of(by_name["one block spans five tiles"])
    assert max(len(w) for w in spanning.work) >= 3
    seven = plan_of(by_name["seven blocks share one tile"])
    assert seven.tiles == 1 and seven.peers(0) == 7


def test_stream_k_fp16_inputs_fp32_accumulation():
    func = workloads.gemm(96, 64, 48, in_dtype="float16")
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms=5, target=OPENCL)
    out, ref = _run(func, sch)
    assert workloads.relative_error(out, ref) <= FP32_TOL


def test_stream_k_int8_is_exact():
    func = workloads.gemm(64, 96, 40, in_dtype="int8")
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms=5, target=OPENCL)
    out, ref = _run(func, sch)
    np.testing.assert_array_equal(out, ref.astype(np.int64))


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_stream_k_dlight_int8_is_exact(fixup):
    # dlight's SIMT int8 schedule: its staged operands are read as gathered byte vectors
    # (tvm_streamk.pocl.byte_gathers), which PoCL refused before.
    func = workloads.gemm(37, 70, 100, in_dtype="int8")
    with A100:
        mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul())(tvm.IRModule({"main": func}))
    sch = Schedule(mod)
    block = first_site(mod["main"]).block.name_hint
    plan = tvm_streamk.stream_k(sch, block, num_sms=3, fixup=fixup, target=A100, blocks_per_sm=1)
    assert plan.split_tiles, plan
    out, ref = _run(func, sch)
    np.testing.assert_array_equal(out, ref.astype(np.int64))


@pytest.mark.parametrize("layout", ["NT", "TN"])
def test_stream_k_layouts(layout):
    func = workloads.gemm(64, 96, 40, layout=layout)
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=OPENCL)
    out, ref = _run(func, sch, layout=layout)
    assert workloads.relative_error(out, ref) <= FP32_TOL


def test_stream_k_batched_gemm():
    func = workloads.batched_gemm(3, 64, 32, 24)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=OPENCL)
    assert plan.tiles == 6
    out, ref = _run(func, sch)
    assert workloads.relative_error(out, ref) <= FP32_TOL


def test_stream_k_grouped_tile_order_and_two_blocks_per_sm():
    func = workloads.gemm(128, 96, 40)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=3, blocks_per_sm=2, group=2, target=OPENCL)
    assert plan.grid == 6
    out, ref = _run(func, sch)
    assert workloads.relative_error(out, ref) <= FP32_TOL


def test_repeated_launches_reuse_the_zeroing_prologue():
    func = workloads.gemm(96, 96, 40)
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=OPENCL)
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    for _ in range(3):
        args = workloads.random_args(func)
        out = kernel.run(*args)[-1]
        assert workloads.relative_error(out, workloads.reference(func, args)) <= FP32_TOL


POLICIES = [
    dict(policy="data_parallel"),
    dict(policy="split_k", splits=3),
    dict(policy="stream_k"),
    dict(policy="hybrid", variant="one_tile"),
    dict(policy="hybrid", variant="two_tile"),
    dict(policy="heuristic"),
]


@pytest.mark.parametrize("kwargs", POLICIES, ids=lambda k: "-".join(map(str, k.values())))
def test_policies_with_atomic_fixup(kwargs):
    # 11 tiles of 6 panels on 4 SMs: two full waves plus three tiles, so hybrids have both parts.
    func = workloads.gemm(352, 32, 48)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=OPENCL, **kwargs)
    if kwargs["policy"] != "heuristic":
        assert plan.policy == kwargs["policy"]
    out, ref = _run(func, sch)
    assert workloads.relative_error(out, ref) <= FP32_TOL


def test_split_k_not_dividing_the_panels_on_a_long_k():
    # 3 splits of 256 panels: every block's range lies in one tile. Barriers sit in the segment
    # loop, whose bound must not be a Select here (PoCL crashed on that form).
    func = workloads.gemm(64, 64, 2048)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=2, policy="split_k", splits=3, fixup="atomic", target=OPENCL
    )
    assert plan.panels % plan.splits != 0
    out, ref = _run(func, sch)
    assert workloads.relative_error(out, ref) <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_hybrid_with_blocks_that_get_no_stream_k_work(fixup):
    # 5 tiles of one panel on 4 SMs: one left-over tile, one iteration, so three of the four
    # blocks have an empty Stream-K range and go straight to their data-parallel tile.
    func = workloads.gemm(160, 32, 8)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(
        sch,
        "C_update",
        num_sms=4,
        policy="hybrid",
        variant="one_tile",
        fixup=fixup,
        target=OPENCL,
    )
    assert sum(lo >= hi for lo, hi in (plan.block_range(b, 0) for b in range(plan.grid))) == 3
    out, ref = _run(func, sch)
    assert workloads.relative_error(out, ref) <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_hybrid_without_stream_k_tiles(fixup):
    # 8 tiles on 4 SMs: whole waves, so the two-tile hybrid has no Stream-K tile and every
    # block's unit 0 is empty. The kernel walks its data-parallel units only (no unit loop).
    func = workloads.gemm(256, 32, 24)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=4, policy="hybrid", variant="two_tile", fixup=fixup, target=OPENCL
    )
    assert plan.sk_tiles == 0 and plan.units() == 3
    assert all(lo >= hi for lo, hi in (plan.block_range(b, 0) for b in range(plan.grid)))
    lowered = tvm_streamk.lower(sch.mod, OPENCL)["main"].script()
    assert "for sk_unit in range(1, 3)" in lowered
    out, ref = _run(func, sch)
    assert workloads.relative_error(out, ref) <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_stream_k_gemv(fixup):
    # 7 row tiles of 64 K-panels on 3 SMs: few tiles, long K, the case split reductions fix.
    func, sch = gemv_schedule(200, 4096)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=3, fixup=fixup, target=OPENCL)
    assert (plan.tiles, plan.panels, plan.grid) == (7, 64, 3) and plan.split_tiles
    out, ref = _run(func, sch)
    assert workloads.relative_error(out, ref) <= FP32_TOL

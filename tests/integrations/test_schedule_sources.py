"""Stream-K on schedules TVM wrote: dlight's GPU ``Matmul`` rule, a MetaSchedule design space.

Each kernel is rewritten by ``stream_k`` (atomic fix-up), checked for the Stream-K structure in the
lowered IR (the tile band replaced by persistent ``blockIdx.x`` loops of the plan's grid: the
zero prologue and the Stream-K kernel), and run on PoCL against float64 numpy with its output
poisoned with NaN. Tolerance: fp32 accumulation over K <= 512 products of values in [-1, 1] stays
within 1e-5 of float64, relative to the largest output (``max|out - ref| / max|ref|``).

The update block is found from the IR (the one block that reduces and has no ``T.init`` left),
not from the names the schedule generators give it.
"""

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir import dlight as dl

import tvm_streamk
from tests.helpers import A100, FP32_TOL, H100, block_idx_extents
from tests.kernels import MS_SMS, meta_schedule_samples, update_block
from tvm_streamk import pocl, workloads
from tvm_streamk.decision import record as ann
from tvm_streamk.errors import StreamKError

pytestmark = pytest.mark.usefixtures("opencl")


def _assert_stream_k_structure(sch: Schedule, plan: tvm_streamk.Plan, target) -> None:
    lowered = tvm_streamk.lower(sch, target)
    # Every blockIdx loop is now the persistent grid: a zero prologue (when tiles are split) and
    # the Stream-K kernel. The original tile band (often blockIdx.y x blockIdx.x) is gone.
    kernels = 2 if plan.split_tiles else 1
    assert block_idx_extents(lowered) == [("blockIdx.x", plan.grid)] * kernels
    assert plan.grid < plan.tiles * plan.panels
    # The update block survives inside the persistent loop, under its new panel range.
    assert sch.get(update_block(sch)).name_hint in lowered.script()


def _run(sch: Schedule, func: tvm.tirx.PrimFunc) -> float:
    """Run on PoCL; return ``max|out - ref| / max|ref|`` against float64 numpy."""
    args = workloads.random_args(func)
    assert np.isnan(args[-1]).all()
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    a, b = (np.asarray(x, dtype=np.float64) for x in args[:2])
    return workloads.relative_error(out, a @ b)


# dlight


DLIGHT_SMS = 5
# dlight's fp32 Matmul on the A100 tag tiles 32 (M) x 64 (N) per block with 16-wide K panels.
DLIGHT_CASES = {
    "256x192x512": (256, 192, 512),
    "uneven-200x136x300": (200, 136, 300),
    # 6 tiles on 5 SMs: data-parallel runs a second wave for one tile.
    "quantised-96x128x512": (96, 128, 512),
}


@pytest.fixture(scope="module", params=DLIGHT_CASES.values(), ids=DLIGHT_CASES.keys())
def dlight_kernel(request):
    M, N, K = request.param
    with A100:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul())(workloads.relax_matmul(M, N, K))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert func.attrs["tirx.is_scheduled"], "dlight's Matmul rule did not apply"
    sch = Schedule(func)
    # One block per SM: the grid the assertions reason about (tests/transform/test_occupancy.py
    # covers the default, the built kernel's resident blocks).
    plan = tvm_streamk.stream_k(
        sch, update_block(sch), num_sms=DLIGHT_SMS, blocks_per_sm=1, fixup="atomic", target=A100
    )
    return func, sch, plan


def test_dlight_matmul_lowers_to_stream_k(dlight_kernel):
    _, sch, plan = dlight_kernel
    assert plan.policy == "stream_k" and plan.grid == DLIGHT_SMS
    _assert_stream_k_structure(sch, plan, A100)


def test_dlight_matmul_stream_k_is_correct_on_pocl(dlight_kernel):
    func, sch, _ = dlight_kernel
    assert _run(sch, func) <= FP32_TOL


def test_dlight_quantised_tile_count_is_evened_out():
    with A100:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul())(workloads.relax_matmul(96, 128, 512))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    sch = Schedule(func)
    plan = tvm_streamk.stream_k(
        sch, update_block(sch), num_sms=DLIGHT_SMS, blocks_per_sm=1, target=A100
    )
    assert (plan.tiles, plan.grid) == (6, 5)
    # Data-parallel needs two waves of whole tiles; Stream-K gives every block under two tiles
    # of K-panels, within one panel of each other.
    per_block = plan.iterations_per_block
    assert max(per_block) - min(per_block) <= 1
    assert max(per_block) < 2 * plan.panels
    assert plan.split_tiles


# MetaSchedule

MS_FUNC = workloads.gemm(192, 128, 256)
# A point of MultiLevelTiling's SSSRRSRS space, i and j split [blockIdx, vthread, threadIdx,
# inner, inner] and k split [panel, inner, inner]: 3 x 2 = 6 blockIdx tiles (one past a wave of
# 4 SMs), 8 x 16 = 128 threads (the H100 tag allows 1024, PoCL's OpenCL device at most 256
# work-items per group, so the sample is chosen to fit both), 8 K-panels of 32.
MS_TILE_DECISIONS = ([3, 2, 8, 2, 2], [2, 1, 16, 2, 2], [8, 4, 8])


@pytest.fixture(scope="module")
def ms_samples() -> dict[int, Schedule]:
    return meta_schedule_samples(MS_FUNC, MS_TILE_DECISIONS)


@pytest.mark.parametrize("depth", [0, 2], ids=["plain", "pipelined-2-stages"])
def test_meta_schedule_sample_stream_k(ms_samples, depth):
    assert depth in ms_samples, f"no valid sample of pipeline depth {depth}: {list(ms_samples)}"
    sch = ms_samples[depth].copy()
    plan = tvm_streamk.stream_k(
        sch, update_block(sch), num_sms=MS_SMS, blocks_per_sm=1, fixup="atomic", target=H100
    )
    assert (plan.tiles, plan.panels, plan.grid) == (6, 8, MS_SMS)
    _assert_stream_k_structure(sch, plan, H100)
    assert _run(sch, MS_FUNC) <= FP32_TOL


def test_group_on_a_fused_band_is_refused_by_the_primitive(ms_samples):
    # MultiLevelTiling binds its tiles to one fused blockIdx loop: there are no tile rows.
    sch = ms_samples[0].copy()
    block = update_block(sch)
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(sch, block, num_sms=MS_SMS, group=2, target=H100)
    assert info.value.condition == "group"
    assert "one-dimensional tile band (6,)" in str(info.value)
    assert not ann.has_decision(sch.get(block).annotations)

"""The separate fix-up (issue 33, item 1): partials to a workspace, a second kernel merges them.

Run on PoCL against float64 numpy with poisoned outputs for every policy on the reference and
dlight schedules, a fused fp16 epilogue and GEMV; its structure (no counters, no fences, a
second kernel after the persistent one), its refusals and the cost model's price. Oclgrind
(tests/backends/test_oclgrind.py) shows it needs no documented exception, ptxas
(tests/transform/test_ptxas.py) its registers.
"""

import numpy as np
import pytest

import tvm_streamk
from tests.helpers import A100, FP32_TOL, OPENCL, block_idx_extents
from tests.kernels import dlight_matmul, gemv_schedule
from tvm_streamk import cost_model, decomposition, fixup_registry, pocl, workloads
from tvm_streamk._compat import Schedule, dlight
from tvm_streamk.analysis import first_site
from tvm_streamk.errors import StreamKError

POLICIES = [
    {"policy": "stream_k"},
    {"policy": "hybrid", "variant": "one_tile"},
    {"policy": "hybrid", "variant": "two_tile"},
    {"policy": "split_k", "splits": 3},
    {"policy": "heuristic"},
]
IDS = ["-".join(map(str, p.values())) for p in POLICIES]


def _check(sch, func, reference=None, tolerance=FP32_TOL):
    args = workloads.random_args(func)
    assert np.isnan(args[-1].astype(np.float32)).all()
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    ref = reference(args) if reference else workloads.reference(func, args)
    assert workloads.relative_error(out.astype(np.float64), ref) <= tolerance


@pytest.mark.usefixtures("opencl")
@pytest.mark.parametrize("decision", POLICIES, ids=IDS)
def test_reference_schedule(decision):
    # 2 x 3 tiles of 32 x 32 (the last row and column predicated), 7 panels, on 4 blocks.
    func = workloads.gemm(45, 70, 53)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=4, fixup="separate", target=OPENCL, **decision
    )
    assert plan.split_tiles or decision["policy"] == "heuristic"
    _check(sch, func)


@pytest.mark.usefixtures("opencl")
@pytest.mark.parametrize("fixup", ["separate", "workspace", "atomic"])
@pytest.mark.parametrize("shape", [(9, 9, 5), (16, 16, 8), (17, 17, 8)], ids=str)
def test_aligned_split_k_with_a_tile_order(shape, fixup):
    """The knob fuzz's find: an aligned split-K (2 splits of 2 panels) keeps the band's loops
    in row-major order, and the separate fix-up's second kernel found each tile's coordinates
    in the grouped order asked for (group=2): partials merged into the wrong tiles (9 x 9 x 5:
    14 outputs never written; 16 x 16 x 8: relative error 1.3). The group does not apply to
    the aligned nest, for any fix-up."""
    func = workloads.gemm(*shape)
    sch = workloads.reference_schedule(func, bm=8, bn=8, bk=4, tm=2, tn=2)
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=1, fixup=fixup, target=A100, policy="split_k", splits=2, group=2
    )
    assert plan.aligned_splits == 2, plan
    assert "group=2 not applied" in plan.reason, plan.reason
    _check(sch, func)


@pytest.mark.usefixtures("opencl")
def test_dlight_schedule_and_gemv():
    func = dlight_matmul(57, 100, 44, dlight.gpu.Matmul(), A100)
    sch = Schedule(func)
    block = first_site(sch.mod["main"]).block.name_hint
    plan = tvm_streamk.stream_k(sch, block, num_sms=4, fixup="separate", target=OPENCL)
    assert plan.split_tiles
    _check(sch, func, lambda args: args[0].astype(np.float64) @ args[1])
    func, sch = gemv_schedule(70, 512)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=5, fixup="separate", target=OPENCL)
    assert plan.split_tiles
    _check(sch, func)


@pytest.mark.usefixtures("opencl")
def test_fused_fp16_epilogue():
    func = workloads.gemm(
        96, 64, 200, in_dtype="float16", out_dtype="float16", epilogue="bias_relu"
    )
    sch = workloads.reference_schedule(func)
    block = first_site(sch.mod["main"]).block.name_hint
    tvm_streamk.stream_k(sch, block, num_sms=5, fixup="separate", target=OPENCL)
    _check(sch, func, tolerance=2.0**-10 + FP32_TOL)


def test_a_second_kernel_and_no_hand_off():
    func = workloads.gemm(45, 70, 53)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=4, fixup="separate", target=OPENCL)
    lowered = tvm_streamk.lower(sch.mod, OPENCL)
    script = lowered["main"].script()
    # The persistent kernel on its grid, then one block per tile that may be split.
    assert ("blockIdx.x", plan.grid) in block_idx_extents(lowered)
    assert ("blockIdx.x", plan.tiles) in block_idx_extents(lowered)
    for absent in ("sk_arrivals", "sk_last", "atomic", "fence"):
        assert absent not in script, absent
    # Slots as the workspace fix-up's, nothing zeroed.
    need = fixup_registry.footprint(plan, "separate", 32 * 32, 4, 4)
    assert need.zeroed_bytes == 0 and need.workspace_bytes == plan.workspace_slots * 32 * 32 * 4


@pytest.mark.usefixtures("opencl")
@pytest.mark.parametrize("num_sms", [3, "device"])
def test_run_time_tile_counts_and_grids(num_sms):
    # One dynamic-M build at three M: the second kernel launched over the run-time tile count,
    # finding each tile's peers by the closed forms on the grid the host computed.
    func = workloads.gemm("m", 40, 56)
    sch = workloads.reference_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=num_sms, blocks_per_sm=1, fixup="separate", target=OPENCL
    )
    kernel = pocl.compile(sch.mod, "tvm_streamk")
    assert len(kernel.launches) == 2, kernel
    for m in (1, 37, 100):
        args = workloads.random_args(sch.mod["main"], m=m)
        out = kernel.run_repeated(*args, launches=2, poison_outputs=True)[-1][-1]
        ref = workloads.reference(sch.mod["main"], args)
        assert workloads.relative_error(out, ref) <= FP32_TOL, m


def test_refusals_name_the_alternative():
    sch = workloads.reference_schedule(workloads.grouped_gemm(3, 24, 24), bm=8, bn=8, bk=8)
    with pytest.raises(StreamKError, match="tile count only the device knows"):
        tvm_streamk.stream_k(sch, "C_update", num_sms=4, fixup="separate", target=OPENCL)
    # "auto" keeps the workspace fix-up where it applies (separate ranks after it).
    sch = workloads.reference_schedule(workloads.gemm(64, 40, 56))
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, deterministic=True, target=OPENCL)
    assert tvm_streamk.explain(sch, print_=False).fixup == "workspace"


def test_the_model_prices_the_second_kernel():
    """Its peers never wait for each other, but the tile's merge runs after the whole
    persistent kernel, in a launch of its own."""
    p = decomposition.plan(3, 4, num_sms=2, policy="stream_k")
    cost = cost_model.CostParams(c_seg=4.0, c_fix=3.0, c_block=1.0)
    separate = cost_model.predicted_time(p, cost=cost, fixup="separate")
    workspace = cost_model.predicted_time(p, cost=cost, fixup="workspace")
    # 6 iterations, 2 segments and a partial per block (1 + 6 + 2*4 + 3 = 18), then one wave
    # of the second kernel for the split tile: a block, a segment and its 2 peers' partials.
    assert separate == 18.0 + 1.0 + 4.0 + 2 * 3.0
    assert workspace != separate


@pytest.mark.usefixtures("opencl")
def test_batch_invariant_bits_equal_the_workspace_fixups():
    """Batch-invariant (issue 32), the second kernel sums each tile's chunks in chunk order, as
    the workspace fix-up's last arriver does: the same bits, at every M and decomposition."""
    rng = np.random.default_rng(33)
    a_all = rng.uniform(-1, 1, (129, 392)).astype(np.float32)
    b = rng.uniform(-1, 1, (392, 40)).astype(np.float32)
    rows = []
    for m, fixup, knobs in [
        (1, "workspace", {"policy": "data_parallel", "num_sms": 2}),
        (7, "separate", {"policy": "stream_k", "num_sms": 5}),
        (129, "separate", {"policy": "split_k", "splits": 3, "num_sms": 2}),
        (64, "separate", {"policy": "data_parallel", "num_sms": 3}),
        # 8 tiles on 7 blocks: the hybrid's Stream-K region holds no tile, and its
        # data-parallel tiles must still reach the second kernel, which merges every tile.
        (33, "separate", {"policy": "hybrid", "variant": "two_tile", "num_sms": 7}),
    ]:
        sch = workloads.reference_schedule(workloads.gemm(m, 40, 392))
        plan = tvm_streamk.stream_k(
            sch, "C_update", fixup=fixup, target=OPENCL, batch_invariant=True, **knobs
        )
        assert plan.policy != "hybrid" or plan.sk_tiles < plan.tiles
        args = [a_all[:m].copy(), b, np.full((m, 40), np.nan, np.float32)]
        out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
        assert workloads.relative_error(out, args[0].astype(np.float64) @ b) <= FP32_TOL
        rows.append(out[0].view(np.int32))
    assert all((r == rows[0]).all() for r in rows[1:])

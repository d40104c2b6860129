"""Batch invariance (issue 32): a row of the output has the same bits whatever M, the grid, the
SM count or the decomposition, with ``batch_invariant=True``.

Every kernel runs on PoCL against float64 numpy with its output poisoned (NaN); then the row
each one computed for the same inputs is compared bit for bit with the first kernel's. The
inputs of a smaller M are the leading rows of the largest M's, so the rows compared are the
same products. The test that the comparison can fail: without the mode, Stream-K and split-K
rows differ from data-parallel's (as issue 32 measured on the landed main).
"""

import numpy as np
import pytest
import tvm

import tvm_streamk
from tests.helpers import A100, FP32_TOL, OPENCL
from tests.kernels import (
    FRAGMENT_TARGETS,
    dlight_fp16_matmul,
    dlight_matmul,
    fragment_update_block,
)
from tvm_streamk import pocl, ptxas, workloads
from tvm_streamk._compat import Schedule, dlight
from tvm_streamk.analysis import first_site
from tvm_streamk.decision import decode
from tvm_streamk.decomposition import chunks
from tvm_streamk.errors import StreamKError

pytestmark = pytest.mark.usefixtures("opencl")

N, K = 40, 392  # 49 panels of 8: four chunks of 13, 13, 13 and 10 panels
M_VALUES = (1, 2, 7, 64, 129, 1000)
# (policy knobs, SMs): every decomposition, on grids of 2, 3, 5 and 7 compute units.
DECOMPOSITIONS = [
    ({"policy": "data_parallel"}, 2),
    ({"policy": "stream_k"}, 2),
    ({"policy": "stream_k"}, 3),
    ({"policy": "stream_k"}, 5),
    ({"policy": "stream_k"}, 7),
    ({"policy": "split_k", "splits": 3}, 2),
    ({"policy": "split_k", "splits": 4}, 5),
    ({"policy": "hybrid", "variant": "one_tile"}, 3),
    ({"policy": "hybrid", "variant": "two_tile"}, 5),
    ({"policy": "heuristic"}, 7),
]


def _inputs(in_dtype="float32", epilogue=None):
    """The largest M's arguments (output poisoned); a smaller M takes their leading rows."""
    func = workloads.gemm(max(M_VALUES), N, K, in_dtype=in_dtype, epilogue=epilogue)
    return workloads.random_args(func, np.random.default_rng(32))


def _rows_of(args, m):
    out = np.full((m, *args[-1].shape[1:]), np.nan, args[-1].dtype)
    return [args[0][:m].copy(), *args[1:-1], out]


def _run(sch: Schedule, func, args) -> np.ndarray:
    assert np.isnan(args[-1].astype(np.float32)).all()
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    ref = workloads.reference(func, args)
    assert workloads.relative_error(out, ref) <= FP32_TOL
    return out


def _reference_kernel(m, knobs, sms, batch_invariant=True, **gemm):
    func = workloads.gemm(m, N, K, **gemm)
    sch = workloads.reference_schedule(func)
    block = first_site(sch.mod["main"]).block.name_hint
    plan = tvm_streamk.stream_k(
        sch, block, num_sms=sms, target=OPENCL, batch_invariant=batch_invariant, **knobs
    )
    return func, sch, plan


def _bits(row: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(row).view(np.uint8)


def test_chunk_grid_depends_on_the_panels_alone():
    assert (chunks.chunk_panels(49), chunks.chunk_count(49, 13)) == (13, 4)
    assert [chunks.chunk_range(j, 13, 49) for j in range(4)] == [
        (0, 13), (13, 26), (26, 39), (39, 49)
    ]  # fmt: skip
    # Fewer panels than chunks: one panel each.
    assert (chunks.chunk_panels(3), chunks.chunk_count(3, 1)) == (1, 3)


@pytest.mark.parametrize("m", M_VALUES)
def test_rows_are_bitwise_equal_across_m_grids_and_policies(m):
    args = _inputs()
    # The anchor: data-parallel at M = 1 on one compute unit.
    func, sch, _ = _reference_kernel(1, {"policy": "data_parallel"}, 1)
    anchor = _run(sch, func, _rows_of(args, 1))[0]
    for knobs, sms in DECOMPOSITIONS:
        func, sch, plan = _reference_kernel(m, knobs, sms)
        # The plan counts chunks: every split point is a chunk boundary.
        assert plan.panels == 4, plan
        out = _run(sch, func, _rows_of(args, m))
        assert (_bits(out[0]) == _bits(anchor)).all(), (m, knobs, sms, plan.label)


def test_without_the_mode_the_same_comparison_fails():
    """The bitwise comparison above can fail: without ``batch_invariant`` Stream-K on 5 SMs and
    split-K in 3 round row 0 differently from data-parallel (issue 32's measurement)."""
    args = _inputs()
    func, sch, _ = _reference_kernel(1, {"policy": "data_parallel"}, 1, batch_invariant=False)
    anchor = _run(sch, func, _rows_of(args, 1))[0]
    differ = 0
    for knobs, sms in [({"policy": "stream_k"}, 5), ({"policy": "split_k", "splits": 3}, 2)]:
        func, sch, _ = _reference_kernel(7, knobs, sms, batch_invariant=False)
        out = _run(sch, func, _rows_of(args, 7))
        differ += int((_bits(out[0]) != _bits(anchor)).any())
    assert differ == 2


@pytest.mark.parametrize(
    "in_dtype,epilogue",
    [("float16", None), ("bfloat16", None), ("float32", "bias_relu"), ("float16", "bias_relu")],
)
def test_low_precision_inputs_and_a_fused_epilogue(in_dtype, epilogue):
    args = _inputs(in_dtype, epilogue)
    rows = []
    for m, knobs, sms in [
        (1, {"policy": "data_parallel"}, 2),
        (64, {"policy": "stream_k"}, 7),
        (129, {"policy": "split_k", "splits": 2}, 3),
        (1000, {"policy": "hybrid"}, 5),
    ]:
        func, sch, _ = _reference_kernel(m, knobs, sms, in_dtype=in_dtype, epilogue=epilogue)
        rows.append(_run(sch, func, _rows_of(args, m))[0])
    assert all((_bits(r) == _bits(rows[0])).all() for r in rows[1:])


def test_hybrids_of_small_tiles_build_and_keep_the_bits():
    """The knob fuzz's find: a batch-invariant hybrid over the reference schedule's 16 x 8 x 4
    tiles stopped in TVM's FlattenBuffer ("Divide by zero") on every grid and either variant
    where the chunks divide the panels evenly: K = 256 is 64 panels of 4, four chunks of 16
    (the other tests' K = 392 leaves a shorter last chunk, and built). Its staging offsets held
    two remainders of a unit by the chunk count, one through the block's range read back
    (:func:`tvm_streamk.transform._ir.opaque_bind`), one through the variable, and TVM 0.27's
    ``iter_map_simplify`` divides by zero on their difference. The bits must be
    data-parallel's."""
    tiles = {"bm": 16, "bn": 8, "bk": 4, "tm": 2, "tn": 2}
    k = 256
    args = workloads.random_args(workloads.gemm(129, N, k), np.random.default_rng(33))
    rows = []
    for m, knobs, sms in [
        (1, {"policy": "data_parallel"}, 1),
        (64, {"policy": "hybrid", "variant": "one_tile"}, 3),
        (129, {"policy": "hybrid", "variant": "two_tile"}, 5),
        (64, {"policy": "hybrid"}, 1),
        # 20 tiles on 20 blocks: no Stream-K tile, one unit of whole tiles walked, its range
        # bound before the walk (_ir.reads_ranges_per_unit): the chunk as the remainder.
        (64, {"policy": "hybrid", "variant": "one_tile"}, 20),
    ]:
        func = workloads.gemm(m, N, k)
        sch = workloads.reference_schedule(func, **tiles)
        plan = tvm_streamk.stream_k(
            sch, "C_update", num_sms=sms, target=OPENCL, batch_invariant=True, **knobs
        )
        assert plan.panels == 4, plan
        rows.append(_run(sch, func, _rows_of(args, m))[0])
        if ptxas.available():
            lib = tvm.compile(sch.mod, target=A100, tir_pipeline="tvm_streamk")
            assert ptxas.resources(lib.mod.imports[0].inspect_source(), "sm_80"), knobs
    assert all((_bits(r) == _bits(rows[0])).all() for r in rows[1:])


def test_hybrids_of_one_panel_chunks_build_and_keep_the_bits():
    """A knob-fuzz campaign's find (seed 75): 9 x 1 x 5 in 8 x 8 x 4 tiles, two panels in two
    chunks of one, stopped in TVM's FlattenBuffer ("Divide by zero") under either hybrid:
    TVM's simplifier turned the chunk written as the unit less its tile's first chunk back
    into the remainder. The chunk and the tile's coordinates are read back as symbols now."""
    args = workloads.random_args(workloads.gemm(9, 1, 5), np.random.default_rng(75))
    rows = []
    for knobs, sms in [
        ({"policy": "data_parallel"}, 1),
        ({"policy": "hybrid", "variant": "one_tile"}, 1),
        ({"policy": "hybrid", "variant": "two_tile"}, 1),
        ({"policy": "hybrid", "variant": "one_tile", "fixup": "separate"}, 1),
    ]:
        func = workloads.gemm(9, 1, 5)
        sch = workloads.reference_schedule(func, bm=8, bn=8, bk=4, tm=2, tn=2)
        plan = tvm_streamk.stream_k(
            sch, "C_update", num_sms=sms, target=OPENCL, batch_invariant=True, **knobs
        )
        assert (plan.panels, plan.tiles) == (2, 2), plan
        rows.append(_run(sch, func, [a.copy() for a in args]))
    assert all((_bits(r) == _bits(rows[0])).all() for r in rows[1:])


@pytest.mark.parametrize(
    "sms, policy",
    [
        ("device", "stream_k"),
        # The run-time choice: a build that, without the mode, launches the kernel as written
        # for data-parallel counts, whose panels are summed in one pass, not chunk by chunk.
        (7, "heuristic"),
    ],
)
def test_one_run_time_m_build_gives_the_static_builds_bits(sms, policy):
    func = workloads.gemm("m", N, K)
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=sms, target=OPENCL, policy=policy, batch_invariant=True
    )
    args = _inputs()
    rows = [_run(sch, func, _rows_of(args, m))[0] for m in (1, 7, 129, 1000)]
    static_func, static_sch, _ = _reference_kernel(64, {"policy": "stream_k"}, 5)
    rows.append(_run(static_sch, static_func, _rows_of(args, 64))[0])
    assert all((_bits(r) == _bits(rows[0])).all() for r in rows[1:])


def test_dlight_schedule():
    """dlight's matmul schedule (for an A100, built for OpenCL): its own panel depth gives its
    own chunk grid, the same at every M it schedules (M = 1 is dlight's GEMV rule's)."""
    k, n = 512, 64
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (1000, k)).astype("float32")
    b = rng.uniform(-1, 1, (k, n)).astype("float32")
    rows = []
    for m, knobs, sms in [
        (2, {"policy": "data_parallel"}, 2),
        (7, {"policy": "stream_k"}, 3),
        (64, {"policy": "stream_k"}, 5),
        (129, {"policy": "heuristic"}, 7),
    ]:
        func = dlight_matmul(m, k, n, dlight.gpu.Matmul(), A100)
        sch = Schedule(func.with_attr("global_symbol", "main"))
        block = first_site(sch.mod["main"]).block.name_hint
        tvm_streamk.stream_k(sch, block, num_sms=sms, target=OPENCL, batch_invariant=True, **knobs)
        args = [a[:m].copy(), b, np.full((m, n), np.nan, np.float32)]
        out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
        assert workloads.relative_error(out, a[:m].astype(np.float64) @ b) <= FP32_TOL
        rows.append(out[0])
    assert all((_bits(r) == _bits(rows[0])).all() for r in rows[1:])


def test_dlight_run_time_m_build_gives_the_static_builds_bits():
    """dlight's dynamic-M schedule under the heuristic: the run-time choice, which without the
    mode launches the kernel as written for data-parallel counts (its panels summed in one
    pass), keeps the persistent kernel for every count, each summing the chunks in order."""
    k, n = 512, 64
    rng = np.random.default_rng(8)
    a = rng.uniform(-1, 1, (1000, k)).astype("float32")
    b = rng.uniform(-1, 1, (k, n)).astype("float32")
    static = dlight_matmul(2, k, n, dlight.gpu.Matmul(), A100)
    sch = Schedule(static.with_attr("global_symbol", "main"))
    block = first_site(sch.mod["main"]).block.name_hint
    tvm_streamk.stream_k(sch, block, num_sms=2, target=OPENCL, batch_invariant=True)
    args = [a[:2].copy(), b, np.full((2, n), np.nan, np.float32)]
    rows = [pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1][0]]
    func = dlight_matmul(tvm.tirx.Var("m", "int64"), k, n, dlight.gpu.Matmul(), A100)
    sch = Schedule(func.with_attr("global_symbol", "main"))
    block = first_site(sch.mod["main"]).block.name_hint
    plan = tvm_streamk.stream_k(
        sch, block, num_sms=7, target=OPENCL, policy="heuristic", batch_invariant=True
    )
    assert plan.variant == "or_data_parallel" and plan.buckets, plan
    # Tiles of 32 rows: 7 and 14 tiles (200 and 420 rows) lie outside the Stream-K buckets.
    outside = [m for m in (200, 420) if not any(lo <= -(-m // 32) <= hi for lo, hi in plan.buckets)]
    assert outside == [200, 420], plan.buckets
    for m in (1, 7, 129, 200, 420, 1000):
        args = [a[:m].copy(), b, np.full((m, n), np.nan, np.float32)]
        out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
        assert workloads.relative_error(out, a[:m].astype(np.float64) @ b) <= FP32_TOL
        rows.append(out[0])
    assert all((_bits(r) == _bits(rows[0])).all() for r in rows[1:])


@pytest.mark.ptxas
@pytest.mark.parametrize("arch", sorted(FRAGMENT_TARGETS))
def test_tensor_core_fragments_split_one_block_per_chunk(arch):
    """A WMMA fragment cannot be addressed element by element: its batch-invariant kernel is
    the aligned split-K with one block per chunk, whatever the policy asked (data-parallel,
    Stream-K, the heuristic), which sums the chunks in chunk order like every other kernel."""
    target, sms = FRAGMENT_TARGETS[arch]
    decisions = []
    for knobs in ({"policy": "data_parallel"}, {"policy": "stream_k"}, {"policy": "heuristic"}):
        sch = dlight_fp16_matmul(256, 256, 1024, target)
        block = fragment_update_block(sch)
        site = first_site(sch.mod["main"])
        plan = tvm_streamk.stream_k(
            sch, block, num_sms=sms, target=target, batch_invariant=True, **knobs
        )
        count = chunks.chunk_count(site.panels, chunks.chunk_panels(site.panels))
        assert plan.policy == "split_k" and plan.splits == count > 1, plan
        decision = decode(sch.get(sch.get_sblock(block)).annotations, block)
        assert decision.chunk * count == site.panels and decision.fixup == "workspace"
        decisions.append(decision)
    assert len(set(decisions)) == 1
    # It builds: the chunk slots are the aligned split's (tile * n + split), read with __ldcg.
    source = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk").mod
    source = source.imports[0].inspect_source()
    assert "wmma::mma_sync" in source and "__ldcg" in source
    if ptxas.available():
        assert ptxas.resources(source, arch), arch


def test_atomic_fixup_is_refused_with_the_reason():
    func = workloads.gemm(64, N, K)
    sch = workloads.reference_schedule(func)
    with pytest.raises(StreamKError, match="arrive") as err:
        tvm_streamk.stream_k(
            sch, "C_update", num_sms=5, target=OPENCL, fixup="atomic", batch_invariant=True
        )
    assert err.value.condition == "batch-invariant"
    # "auto" takes the workspace fix-up.
    tvm_streamk.stream_k(sch, "C_update", num_sms=5, target=OPENCL, batch_invariant=True)
    block = sch.get(sch.get_sblock("C_update"))
    assert decode(block.annotations, "C_update").fixup == "workspace"


def test_a_hand_written_chunk_longer_than_k_is_refused():
    func = workloads.gemm(64, N, K)
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms=5, target=OPENCL, batch_invariant=True)
    sch.unannotate(sch.get_sblock("C_update"), "tvm_streamk.chunk")
    sch.annotate(sch.get_sblock("C_update"), "tvm_streamk.chunk", 50)
    with pytest.raises(StreamKError, match="chunk=50 K-panels for the 49 panels"):
        tvm_streamk.lower(sch.mod, OPENCL)


def test_explain_shows_the_chunk_grid_and_the_price():
    func = workloads.gemm(129, N, K)
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms=5, target=OPENCL, batch_invariant=True)
    report = tvm_streamk.explain(sch, print_=False)
    assert "K in 4 chunk(s) of 13 K-panels" in report.invariance
    assert "the heuristic's choice without the mode" in report.invariance
    assert "invariant batch-invariant" in str(report)
    assert report.as_dict()["batch_invariance"] == report.invariance
    # A slot per chunk of every tile (5 x 2 tiles of 32 x 32 fp32) and a counter per tile.
    tiles = 5 * 2
    assert report.stats.workspace_bytes == tiles * 4 * 32 * 32 * 4 + 4 * tiles
    assert report.stats.zeroed_bytes == 4 * tiles


def test_the_model_prices_every_chunk_merge():
    """The same data-parallel plan costs more when every tile merges its chunks, and more
    chunks cost more merges (CostParams.chunk_merges)."""
    from dataclasses import replace

    from tvm_streamk import cost_model, decomposition

    plain = cost_model.DEFAULT_COST
    merged = replace(plain, chunk_merges=True)
    dp = decomposition.plan(10, 4, 5, policy="data_parallel")
    assert cost_model.predicted_time(dp, cost=merged) > cost_model.predicted_time(dp, cost=plain)
    one = decomposition.plan(10, 1, 5, policy="data_parallel")
    # A single chunk merges nothing.
    assert cost_model.predicted_time(one, cost=merged) == cost_model.predicted_time(one, cost=plain)

"""Ragged K (issue 34): the MoE weight gradient ``dW[g] = dY_gᵀ · X_g``, each expert's tiles
reducing over its own tokens, with Stream-K balancing the unequal K over the whole grid.

One build serves every routing (the iteration count is computed on the device): uneven and
empty groups, one group holding nearly all tokens, groups below one K-panel, no token at all;
every policy that applies (Stream-K, the heuristic, data-parallel) and both fix-ups; fp32,
fp16 and bf16 inputs accumulated in fp32; the Relax entry; refusals with their reasons; the
cost model's per-tile prediction and ``explain`` at one routing; index types for token counts
past 2^31 products. Outputs are poisoned before every call and compared with float64 numpy.
Oclgrind: tests/backends/test_oclgrind.py; ptxas: below (``-m ptxas``).
"""

import itertools

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import tvm_streamk
from tests.helpers import A100, FIXUPS, FP32_TOL, H100, OPENCL, SM_TARGETS, with_sizings
from tvm_streamk import moe, occupancy, pocl, ptxas, workloads
from tvm_streamk._compat import structural_walk
from tvm_streamk.cost_model import ragged as ragged_cost
from tvm_streamk.errors import StreamKError
from tvm_streamk.explain import ExplainError
from tvm_streamk.transform import bound_allocations

GROUPS, N, K = 5, 24, 40
TILES = {"bm": 8, "bn": 8, "bk": 8, "tm": 2, "tn": 2}  # 3 x 5 tiles per group, 8 tokens/panel
ROUTINGS = [
    [9, 0, 30, 1, 5],  # uneven, an empty group
    [0, 0, 45, 0, 0],  # one group holds every token, empty ones before and after
    [100, 1, 1, 1, 1],  # one group nearly all; the others below one panel
    [3, 0, 1, 7, 2],  # every group below one panel
    [0, 0, 0, 0, 0],  # no token: every gradient zero
    [2, 3, 1, 4, 5],
]
LOW_PRECISION_TOL = 2.0**-7 + FP32_TOL

RUNS = pytest.mark.usefixtures("opencl")  # the tests that run kernels, on every PoCL
# Every policy that applies, and both fix-ups of Stream-K.
EVERY_POLICY = pytest.mark.parametrize(
    "decision",
    [
        {"policy": "stream_k", "fixup": "workspace"},
        {"policy": "stream_k", "fixup": "atomic"},
        {"policy": "heuristic"},
        {"policy": "data_parallel"},
    ],
    ids=lambda d: "-".join(d.values()),
)


def _schedule(rows="rows", in_dtype="float32", out_dtype=None, **decision):
    func = workloads.grouped_weight_grad(
        GROUPS, N, K, rows=rows, in_dtype=in_dtype, out_dtype=out_dtype
    )
    sch = workloads.reference_schedule(func, **TILES)
    if decision:
        tvm_streamk.stream_k(sch, "C_update", num_sms=3, blocks_per_sm=1, target=OPENCL, **decision)
    return sch


def _check_routings(kernel, routings, in_dtype="float32", tol=FP32_TOL, seed=0, shape=(N, K)):
    for n, counts in enumerate(routings):
        args = workloads.grouped_weight_grad_args(
            counts, *shape, in_dtype=in_dtype, rng=np.random.default_rng(seed + n)
        )
        assert np.isnan(args[-1]).all()
        # Two calls on one set of buffers, the output poisoned before each.
        out = kernel.run_repeated(*args, launches=2, poison_outputs=True)[-1][-1]
        ref = workloads.grouped_weight_grad_reference(*args[:3])
        if not np.abs(ref).max():
            assert np.array_equal(out, np.zeros_like(out)), counts
            continue
        assert workloads.relative_error(out, ref) <= tol, counts


@RUNS
@EVERY_POLICY
def test_one_build_serves_every_routing(decision):
    kernel = pocl.compile(_schedule(**decision).mod, "tvm_streamk")
    if decision["policy"] != "data_parallel":
        # The prologue writing the iteration offsets, then the persistent kernel.
        assert any("iteration" in str(a) for launch in kernel.launches for a in launch.args)
    _check_routings(kernel, ROUTINGS)


@RUNS
@EVERY_POLICY
def test_one_expert_is_a_run_time_k(decision):
    """One group: a dense layer's weight gradient over a run-time token count. TVM folds the
    group loop of extent 1 to the index 0, and the analysis refused it ("the group index 0 of
    the view dY_group ... is not the outermost tile band loop"; found by the workload fuzz)."""
    func = workloads.grouped_weight_grad(1, N, K)
    sch = workloads.reference_schedule(func, **TILES)
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, blocks_per_sm=1, target=OPENCL, **decision)
    kernel = pocl.compile(sch.mod, "tvm_streamk")
    _check_routings(kernel, [[45], [0], [3], [200]])


@RUNS
def test_a_heuristic_with_the_separate_fixup_keeps_every_tile_whole():
    """The separate fix-up cannot merge a tile count only the device knows: the heuristic
    keeps the tiles whole and says why (it stopped on the compile-time tile count it does not
    have; found by the workload fuzz on a grouped GEMM)."""
    sch = _schedule()
    plan = tvm_streamk.stream_k(
        sch, "C_update", policy="heuristic", fixup="separate", num_sms=3, target=OPENCL
    )
    assert plan.policy == "data_parallel", plan
    assert "fixup='separate' for the grouped weight gradient" in plan.reason
    _check_routings(pocl.compile(sch.mod, "tvm_streamk"), ROUTINGS[:3])


# Shapes whose kernel as written TVM cannot bound: the token panels' staging buffers sized over
# every token (stock TVM stops on them too). Found by the workload fuzz at N = 1, K = 1.
UNBOUNDED_AS_WRITTEN = [(1, 40), (10, 3), (24, 1)]


@RUNS
@pytest.mark.parametrize("shape", UNBOUNDED_AS_WRITTEN, ids=lambda s: "x".join(map(str, s)))
def test_data_parallel_walks_where_tvm_cannot_bound_the_kernel_as_written(shape):
    """Data-parallel then walks one block per tile over its group's panels (the prologue writes
    the iteration offsets): right at every routing, and a group's gradient has the same bits
    whatever the other groups hold, as the kernel as written's would."""
    func = workloads.grouped_weight_grad(GROUPS, *shape)
    sch = workloads.reference_schedule(func, **TILES)
    assert not bound_allocations.bounded_as_written(sch.mod["main"])
    tvm_streamk.stream_k(
        sch, "C_update", policy="data_parallel", num_sms=3, blocks_per_sm=1, target=OPENCL
    )
    kernel = pocl.compile(sch.mod, "tvm_streamk")
    assert len(kernel.launches) == 2  # the iteration offsets, then the walk
    _check_routings(kernel, ROUTINGS, shape=shape)
    # Group 2's tokens and gradients are the same in both routings; the others' differ.
    first = workloads.grouped_weight_grad_args([9, 0, 30, 1, 5], *shape)
    second = workloads.grouped_weight_grad_args([3, 41, 30, 0, 70], *shape)
    for arg, rows in ((0, slice(9, 39)), (1, slice(9, 39))):
        second[arg][44:74] = first[arg][rows]
    outs = [kernel.run(*args)[-1] for args in (first, second)]
    assert np.array_equal(outs[0][2], outs[1][2])
    ref = workloads.grouped_weight_grad_reference(*second[:3])
    assert workloads.relative_error(outs[1], ref) <= FP32_TOL


@RUNS
def test_a_static_token_count():
    kernel = pocl.compile(_schedule(rows=45, policy="stream_k").mod, "tvm_streamk")
    _check_routings(kernel, [[9, 0, 30, 1, 5], [45, 0, 0, 0, 0]])


@RUNS
@pytest.mark.parametrize(("in_dtype", "out_dtype"), [("float16", None), ("bfloat16", "float16")])
def test_low_precision_inputs_accumulate_in_fp32(in_dtype, out_dtype):
    sch = _schedule(in_dtype=in_dtype, out_dtype=out_dtype, policy="stream_k", fixup="workspace")
    kernel = pocl.compile(sch.mod, "tvm_streamk")
    for n, counts in enumerate(ROUTINGS[:3]):
        args = workloads.grouped_weight_grad_args(
            counts,
            N,
            K,
            in_dtype=in_dtype,
            out_dtype=out_dtype or "float32",
            rng=np.random.default_rng(n),
        )
        out = kernel.run_repeated(*args, launches=2, poison_outputs=True)[-1][-1]
        ref = workloads.grouped_weight_grad_reference(*args[:3])
        assert workloads.relative_error(out, ref) <= LOW_PRECISION_TOL, counts


def _grad_module(kernel, groups, n, k, dtype) -> tvm.IRModule:
    """A Relax function of tokens, output gradients and counts calling ``kernel`` through
    :func:`tvm_streamk.moe.emit_moe_weight_grad`."""
    bb = relax.BlockBuilder()
    t = tirx.Var("tokens", "int64")
    xv = relax.Var("x", relax.TensorType((t, k), dtype))
    dyv = relax.Var("dy", relax.TensorType((t, n), dtype))
    cv = relax.Var("counts", relax.TensorType((groups,), "int64"))
    with bb.function("main", [xv, dyv, cv]):
        with bb.dataflow():
            grad = bb.emit_output(moe.emit_moe_weight_grad(bb, xv, dyv, cv, kernel))
        bb.emit_func_output(grad)
    return bb.get()


@RUNS
def test_moe_kernel_and_its_relax_entry():
    groups, n, k = 6, 48, 40
    rng = np.random.default_rng(7)
    experts = rng.choice(groups, size=90, p=[0.6, 0.0, 0.25, 0.1, 0.05, 0.0])
    order, counts = workloads.sort_by_expert(experts, groups)
    x = rng.uniform(-1, 1, (90, k)).astype("float32")
    dy = rng.uniform(-1, 1, (90, n)).astype("float32")
    kernel = moe.grouped_weight_grad_kernel(groups, n, k, num_sms=4, tiles=(16, 16, 8, 2, 2))
    dw = np.full((groups, n, k), np.nan, "float32")
    out = pocl.run(
        tvm.IRModule({"main": kernel}),
        x[order],
        dy[order],
        workloads.moe_offsets(counts),
        dw,
        pipeline="tvm_streamk",
    )[-1]
    ref = np.zeros((groups, n, k))
    for e in range(groups):
        ref[e] = dy[experts == e].astype(np.float64).T @ x[experts == e]
    assert workloads.relative_error(out, ref) <= FP32_TOL

    mod = _grad_module(kernel, groups, n, k, "float32")
    assert "R.cumsum" in mod.script() and "(6, 48, 40)" in mod.script()
    with pytest.raises(StreamKError, match=r"\[moe-shapes\].*6 experts"):
        _grad_module(kernel, groups, k, n, "float32")  # x and dy swapped


def test_relax_entry_compiles_for_h100_with_the_persistent_kernel():
    groups, n, k = 8, 256, 128
    kernel = moe.grouped_weight_grad_kernel(
        groups, n, k, in_dtype="float16", target=H100, fixup="workspace", tiles=(64, 64, 16, 4, 4)
    )
    lib = tvm.compile(
        _grad_module(kernel, groups, n, k, "float16"),
        H100,
        relax_pipeline=tvm_streamk.relax_pipeline(H100),
        tir_pipeline="tvm_streamk",
    )
    source = lib.mod.imports[0].inspect_source()
    assert "sk_iteration_offsets" in source and "sk_arrivals" in source


@pytest.mark.parametrize(
    ("decision", "match"),
    [
        ({"policy": "split_k", "splits": 2}, r"policy='split_k' for the grouped weight gradient"),
        ({"fixup": "separate"}, r"tile count only the device knows"),
        ({"batch_invariant": True}, r"Not built for a ragged K.*policy='data_parallel'"),
    ],
    ids=["split_k", "separate", "batch_invariant"],
)
def test_refusals_name_the_reason(decision, match):
    with pytest.raises(StreamKError, match=match):
        _schedule(**decision)


def test_per_group_widths_are_refused_with_the_reason():
    with pytest.raises(workloads.WorkloadError, match="one N and one K for every group"):
        workloads.grouped_gemm(3, [64, 32, 64], 128)
    with pytest.raises(workloads.WorkloadError, match="one N and one K for every group"):
        moe.grouped_matmul_kernel(3, 64, (128, 64, 128))


def test_explain_at_one_routing_prices_each_tile_by_its_own_panels():
    sch = _schedule(policy="stream_k", fixup="workspace")
    with pytest.raises(ExplainError, match="group_rows"):
        tvm_streamk.explain(sch.mod, print_=False)
    report = tvm_streamk.explain(sch.mod, sizes={"group_rows": [9, 0, 30, 1, 5]}, print_=False)
    # 15 tiles a group; 2, 0, 4, 1 and 1 panels of 8 tokens: 120 iterations on 3 blocks.
    assert report.stats.grid == 3 and report.stats.iterations_per_block == (40, 40)
    assert "K-panels per group [2, 0, 4, 1, 1]" in report.ragged
    # The baseline is the kernel as written: 75 tiles over the 6 panels of all 45 tokens.
    assert report.baseline.tiles == 75 and report.baseline.panels == 6
    assert "K ragged" in str(report)


def test_the_model_prefers_stream_k_where_one_expert_dominates():
    """Predicted, not measured: 8 experts of 16 tiles on an H100's 132 SMs, one expert with
    half the tokens. A data-parallel kernel over each tile's own panels waits for that expert's
    tiles; Stream-K spreads their iterations over every SM."""
    rows = [8192] + [1170] * 7
    panels = ragged_cost.tile_panels(rows, 32, 16)
    plans = ragged_cost.plans(panels, -(-sum(rows) // 32), 132)
    times = ragged_cost.predicted_times(plans, 132)
    assert times["stream_k"] * 2 < times["data_parallel_per_tile"] < times["data_parallel"]
    # Even routing, many tiles per SM: no gain claimed beyond the model's margin.
    even = ragged_cost.plans(ragged_cost.tile_panels([2048] * 8, 32, 512), 512, 132)
    t = ragged_cost.predicted_times(even, 132)
    assert t["data_parallel_per_tile"] < 1.05 * t["stream_k"]


def test_index_types_hold_token_counts_past_2_31_products(default_opencl):
    """X (T, K) and dY (T, N) are addressed with int64 row offsets: with K = 4096, T = 2^20
    tokens already give 2^32 elements. Every index of the two inputs in the CUDA kernel is
    int64; the walk's int32 iterations are checked on the host, which refuses a call of more
    than 2^31 - 1 before any launch (planned from broadcast arrays, nothing allocated)."""
    kernel = moe.grouped_weight_grad_kernel(8, 4096, 4096, target=H100, tiles=(64, 64, 16, 4, 4))
    from tvm_streamk.pocl.lowering import split_lowered

    _, devices = split_lowered("main", kernel, "tvm_streamk", H100)
    found = {}

    def on_load(load):
        name = load.source.name if hasattr(load, "source") else load.buffer.name
        if name in ("X", "dY"):
            found.setdefault(name, set()).update(str(i.ty) for i in load.indices)

    for dev in devices:
        for func in dev.functions.values():
            structural_walk(func.body, (tvm.ir.TensorLoad, on_load))
    assert set(found) == {"X", "dY"} and all(t == {"int64"} for t in found.values()), found

    small = moe.grouped_weight_grad_kernel(2, 16, 16, num_sms=2, tiles=(8, 8, 8, 2, 2))
    built = pocl.compile(tvm.IRModule({"main": small}), "tvm_streamk")

    def call(tokens):
        x = np.broadcast_to(np.float32(0), (tokens, 16))
        offsets = np.array([0, tokens // 2, tokens], "int64")
        return built.plan_call(x, x, offsets, np.zeros((2, 16, 16), "float32"))

    call(2**20)  # 2^20 tokens x 16 features: 2^24-element inputs, well within the walk
    with pytest.raises(ValueError, match=r"more than 2\*\*31 - 1 iterations"):
        # (2^33 / 8 panels + 2 groups) x 4 tiles a group: 2^32 + 8 iterations, past int32.
        call(2**33)


# The default grid (resident blocks estimated from the IR, no nvcc) declares nothing, and ptxas
# left to itself takes more than the budget at that grid: registers (data-parallel's), no spills.
ESTIMATED_OVER_BUDGET = {
    ("atomic", "sm_80"): "64 (46)",
    ("workspace", "sm_80"): "72 (46)",
    ("atomic", "sm_90"): "64 (46)",
    ("workspace", "sm_90"): "64 (46)",
}


# Measured (64x64 tiles, 256 threads): data-parallel 46 registers on sm_80 and sm_90, 5 blocks
# per SM. Left to ptxas's own choice the Stream-K kernel took 64 (atomic) and 72 (workspace)
# registers on sm_80, 4 blocks; it now declares the 5 blocks of its grid
# (transform/declare_occupancy.py) and ptxas holds it to 44 and 48 registers, no spills.
@pytest.mark.ptxas
@pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH")
@pytest.mark.parametrize(
    "fixup, arch, sizing",
    with_sizings(itertools.product(FIXUPS, SM_TARGETS), ESTIMATED_OVER_BUDGET),
)
def test_resources_within_the_data_parallel_budget(fixup, arch, sizing):
    target, sms = (A100, 108) if arch == "sm_80" else (H100, 132)

    sources = []

    def report(func):
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tvm_streamk")
        sources.append(lib.mod.imports[0].inspect_source())
        return ptxas.resources(sources[-1], arch)

    tiles = (64, 64, 16, 4, 4)
    dp = moe.grouped_weight_grad_kernel(
        8, 512, 256, target=target, num_sms=sms, policy="data_parallel", tiles=tiles
    )
    base = max(report(dp).values(), key=lambda r: r.registers)
    assert base.spills == 0 and base.stack == 0, base
    kernel = moe.grouped_weight_grad_kernel(
        8, 512, 256, target=target, num_sms=sms, fixup=fixup, tiles=tiles, blocks_per_sm=sizing
    )
    found = report(kernel)
    for name, r in found.items():
        assert r.spills == 0 and r.stack == 0, (name, r)
        assert r.shared <= base.shared + 1024, (name, r, base)
        assert r.registers <= base.registers + 16, (name, r, base)
    # The walk keeps the data-parallel kernel's occupancy (256 threads a block).
    walk = max(found.values(), key=lambda r: r.registers)
    held = occupancy.resident_blocks(arch, 256, walk.registers, walk.shared).blocks
    assert held == occupancy.resident_blocks(arch, 256, base.registers, base.shared).blocks
    # Left to itself ptxas took 64-72 registers (4 blocks on sm_80): the kernel declares them.
    assert f"__launch_bounds__(256, {held})" in sources[-1]

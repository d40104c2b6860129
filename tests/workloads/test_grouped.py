"""Grouped GEMM and mixture-of-experts (issue 15, item 3).

G GEMMs of different row counts in one persistent kernel: Stream-K over the flattened (group,
tile, panel) space, the group tile offsets computed on the device, both fix-ups. Checked on
PoCL against float64 numpy with the output poisoned, at uneven and empty groups; the structure
of the lowering; the Relax entry; ptxas resources; the refusals.
"""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import tvm_streamk
from tests.helpers import A100, H100, SIZINGS, SM_TARGETS, with_sizings
from tvm_streamk import moe, ptxas, workloads
from tvm_streamk import pocl as pocl_backend
from tvm_streamk._compat import structural_walk
from tvm_streamk.errors import StreamKError
from tvm_streamk.workloads import grouped_args, grouped_gemm, grouped_reference

N, K = 40, 56
UNEVEN = [37, 0, 5, 64, 1, 0, 23]


def _kernel(groups, policy="stream_k", fixup="atomic", num_sms=3, **build):
    func = grouped_gemm(groups, N, K, **build)
    sch = workloads.reference_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    if policy is not None:
        tvm_streamk.stream_k(
            sch, "C_update", num_sms=num_sms, policy=policy, fixup=fixup, blocks_per_sm=1
        )
    return sch


def _check(sch, counts, seed=0, tol=1e-5, **build):
    args = grouped_args(counts, N, K, rng=np.random.default_rng(seed), **build)
    assert np.isnan(args[-1]).all()
    out = pocl_backend.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    ref = grouped_reference(*args[:3], layout=build.get("layout", "NN"))
    assert out.shape == ref.shape
    if ref.size:
        err = workloads.relative_error(out, ref)
        assert err <= tol, f"counts={counts}: relative error {err}"


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("num_sms", [3, "device"])
def test_one_build_serves_uneven_and_empty_groups(fixup, num_sms):
    sch = _kernel(len(UNEVEN), fixup=fixup, num_sms=num_sms)
    for seed, counts in enumerate([UNEVEN, [0, 0, 0, 130, 0, 0, 0], [1] * 7, [0] * 7]):
        _check(sch, counts, seed)


def test_a_heuristic_with_the_separate_fixup_keeps_every_tile_whole():
    # The separate fix-up cannot merge a tile count only the device knows: the heuristic
    # keeps the tiles whole and says why (it stopped on the compile-time tile count it does
    # not have; found by the workload fuzz).
    sch = _kernel(len(UNEVEN), policy=None)
    plan = tvm_streamk.stream_k(sch, "C_update", policy="heuristic", fixup="separate", num_sms=3)
    assert plan.policy == "data_parallel", plan
    assert "fixup='separate' for the grouped GEMM" in plan.reason
    _check(sch, UNEVEN)


def test_one_group_is_a_plain_dynamic_gemm():
    _check(_kernel(1, fixup="workspace"), [100])


@pytest.mark.parametrize(
    "build",
    [
        {"layout": "NT"},
        {"offsets_dtype": "int32"},
        {"in_dtype": "float16", "out_dtype": "float16"},
    ],
)
def test_layouts_and_dtypes(build):
    fixup = "workspace" if build.get("out_dtype") == "float16" else "atomic"
    tol = 2e-3 if build.get("in_dtype") == "float16" else 1e-5
    sch = _kernel(len(UNEVEN), fixup=fixup, **build)
    _check(sch, UNEVEN, tol=tol, **build)


@pytest.mark.parametrize("policy", [None, "data_parallel"])
def test_data_parallel_kernel_is_one_block_per_tile(policy):
    # Without a decision, or with data_parallel: a block per tile the groups may hold, and one
    # per tile busy, not the padded band (a tile per group for the largest group's row tiles).
    sch = _kernel(len(UNEVEN), policy=policy)
    for seed, counts in enumerate([UNEVEN, [0] * 7, [200, 0, 0, 0, 0, 0, 1]]):
        _check(sch, counts, seed)
    script = tvm_streamk.lower(sch, "opencl")["main"].script()
    assert "sk_grid: T.let[T.int64] = ((rows + T.int64(15)) // T.int64(16) + T.int64(7))" in script
    assert "sk_arrivals" not in script and "_sk_zero" not in script  # nothing to merge


def test_constant_row_count():
    counts = [40, 0, 17, 71]
    _check(_kernel(len(counts), fixup="workspace", rows=sum(counts)), counts)


def test_persistent_grid_walks_the_tiles_the_groups_hold():
    sch = _kernel(len(UNEVEN), fixup="workspace", num_sms=5)
    lowered = tvm_streamk.lower(sch, "opencl")["main"]
    script = lowered.script()
    # The group tile offsets: written by a one-thread kernel, searched by every tile.
    assert 'T.sblock("sk_group_tile_offsets")' in script
    assert "sk_group_mid2" in script and "sk_group_mid3" not in script  # ceil(log2 7) steps
    grids = []

    def visit(loop):
        if loop.kind == tirx.ForKind.THREAD_BINDING and loop.thread_binding.thread_tag.startswith(
            "blockIdx"
        ):
            grids.append(loop.extent)

    structural_walk(lowered.body, (tirx.For, visit))
    # No padded band is left: every blockIdx loop is the group kernel's 1, the counter
    # zeroing's, or the persistent grid (the slots, bound by the host).
    assert all("rows" not in str(g) or "// T.int64(128)" in str(g) for g in grids), grids
    # The counters are sized for the most tiles valid offsets give.
    assert (
        "sk_arrivals = T.sblock_alloc_buffer((((rows + T.int64(15)) // T.int64(16)"
        " + T.int64(7)) * T.int64(3),)" in script
    )
    # The views are gone; the real buffers are read under each group's row count.
    assert "X_group[" not in script and "Y_group[" not in script
    assert "offsets[" in script


def test_analysis_finds_the_group_and_row_axes():
    from tvm_streamk.analysis import analyze

    sch = _kernel(len(UNEVEN), policy=None)
    site = analyze(sch.mod["main"], "C_update")
    space = site.ragged
    assert space is not None and site.runtime_tiles
    assert (space.group_axis, space.row_axis, space.tile_rows) == (0, 1, 16)
    assert space.other_extents == (3,)
    with pytest.raises(StreamKError, match=r"\[runtime-tiles\].*grouped GEMM"):
        site.tiles_at({"rows": 100})


@pytest.mark.parametrize(("policy", "extra"), [("split_k", {"splits": 7}), ("hybrid", {})])
def test_policies_without_a_fixed_grid_are_refused(policy, extra):
    sch = _kernel(3, policy=None)
    before = sch.mod
    with pytest.raises(StreamKError, match=r"\[ragged-groups\].*only the device knows"):
        tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy=policy, **extra)
    assert sch.mod.same_as(before)


def test_heuristic_takes_stream_k():
    sch = _kernel(3, policy=None)
    chosen = tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy="heuristic", blocks_per_sm=1)
    assert chosen.policy == "stream_k" and "grouped GEMM" in chosen.reason
    _check(sch, [5, 0, 60])


def test_stock_pipeline_refuses_the_views():
    sch = _kernel(3, policy=None)
    with pytest.raises(
        StreamKError, match=r"\[pipeline\].*ragged views.*tir_pipeline='tvm_streamk'"
    ):
        tvm.compile(sch.mod, target=H100)


def test_bad_declarations_are_refused():
    func = grouped_gemm(3, N, K)
    spec = dict(func.attrs["tvm_streamk.ragged"])
    spec["offsets"] = "W"
    bad = func.with_attr("tvm_streamk.ragged", spec)
    with pytest.raises(StreamKError, match=r"\[ragged-groups\].*offsets 'W'"):
        tvm_streamk.analysis.ragged_views(bad)


def test_workload_helpers():
    np.testing.assert_array_equal(workloads.moe_offsets([2, 0, 3]), [0, 2, 2, 5])
    order, counts = workloads.sort_by_expert([2, 0, 2, 1], 4)
    np.testing.assert_array_equal(order, [1, 3, 0, 2])
    np.testing.assert_array_equal(counts, [1, 1, 2, 0])
    with pytest.raises(workloads.WorkloadError, match="non-negative"):
        workloads.moe_offsets([1, -1])


def _moe_module(kernel, groups, n, k, dtype, x_k=None):
    bb = relax.BlockBuilder()
    t = tirx.Var("tokens", "int64")
    x = relax.Var("x", relax.TensorType((t, k if x_k is None else x_k), dtype))
    w = relax.Var("w", relax.TensorType((groups, n, k), dtype))
    c = relax.Var("counts", relax.TensorType((groups,), "int64"))
    with bb.function("main", [x, w, c]):
        with bb.dataflow():
            out = bb.emit_output(moe.emit_moe_matmul(bb, x, w, c, kernel))
        bb.emit_func_output(out)
    return bb.get()


def test_relax_entry_compiles_for_h100_with_the_persistent_kernel():
    groups, n, k = 8, 256, 128
    kernel = moe.grouped_matmul_kernel(
        groups, n, k, in_dtype="float16", out_dtype="float16", target=H100, fixup="workspace"
    )
    mod = _moe_module(kernel, groups, n, k, "float16")
    assert "R.cumsum" in mod.script()
    lib = tvm.compile(
        mod, H100, relax_pipeline=tvm_streamk.relax_pipeline(H100), tir_pipeline="tvm_streamk"
    )
    source = lib.mod.imports[0].inspect_source()
    assert "sk_tile_offsets" in source and "sk_arrivals" in source


def test_moe_kernel_on_pocl_tokens_sorted_by_expert():
    groups, n, k = 6, 48, 40
    rng = np.random.default_rng(7)
    experts = rng.choice(groups, size=90, p=[0.5, 0.0, 0.3, 0.1, 0.1, 0.0])
    order, counts = workloads.sort_by_expert(experts, groups)
    tokens = rng.uniform(-1, 1, (90, k)).astype("float32")
    w = rng.uniform(-1, 1, (groups, n, k)).astype("float32")
    kernel = moe.grouped_matmul_kernel(groups, n, k, num_sms=4, tiles=(16, 16, 8, 2, 2))
    offsets = workloads.moe_offsets(counts)
    y = np.full((90, n), np.nan, "float32")
    out = pocl_backend.run(
        tvm.IRModule({"main": kernel}), tokens[order], w, offsets, y, pipeline="tvm_streamk"
    )[-1]
    unsorted = out[np.argsort(order)]
    ref = np.einsum("tk,tnk->tn", tokens.astype(np.float64), w[experts].astype(np.float64))
    assert workloads.relative_error(unsorted, ref) <= 1e-5


def test_moe_shapes_are_checked():
    kernel = moe.grouped_matmul_kernel(4, 32, 16, num_sms=2, tiles=(16, 16, 8, 2, 2))
    with pytest.raises(StreamKError, match=r"\[moe-shapes\].*4 experts"):
        _moe_module(kernel, 5, 32, 16, "float32")


@pytest.mark.ptxas
@pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH")
@pytest.mark.parametrize(
    "fixup, invariant, arch, sizing",
    with_sizings(
        [
            (fixup, invariant, arch)
            for fixup, invariant in [("atomic", False), ("workspace", False), ("workspace", True)]
            for arch in SM_TARGETS
        ]
    ),
)
def test_grouped_kernel_resources(fixup, invariant, arch, sizing):
    # Measured at the estimated grid (64x64 tiles, 256 threads; sm_80/sm_90): data-parallel
    # 54/55 registers; Stream-K with the atomic fix-up 54/55, with the workspace fix-up 64/60,
    # batch-invariant 59/58. While the block's range was inlined into its uses (not read back,
    # lower_stream_k._persistent_nest) the sm_90 workspace kernel took 48 registers, 56 B of
    # spills and a 24 B stack; on sm_80 79 registers while the last arriver found its peers by
    # closed forms on run-time counts, 80 and 12 B of spills before their run-time form.
    target, sms = (A100, 108) if arch == "sm_80" else (H100, 132)

    def report(func):
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tvm_streamk")
        return ptxas.resources(lib.mod.imports[0].inspect_source(), arch)

    dp = moe.grouped_matmul_kernel(
        8, 512, 256, target=target, num_sms=sms, policy="data_parallel", tiles=(64, 64, 16, 4, 4)
    )
    base = max(report(dp).values(), key=lambda r: r.registers)
    assert base.spills == 0 and base.stack == 0, base
    kernel = moe.grouped_matmul_kernel(
        8,
        512,
        256,
        target=target,
        num_sms=sms,
        fixup=fixup,
        tiles=(64, 64, 16, 4, 4),
        batch_invariant=invariant,
        blocks_per_sm=sizing,
    )
    for name, r in report(kernel).items():
        assert r.spills == 0 and r.stack == 0, (name, r)
        assert r.shared <= base.shared + 1024, (name, r, base)
        assert r.registers <= base.registers + 16, (name, r, base)


def test_explain_at_one_routing():
    from tvm_streamk.explain import ExplainError

    sch = _kernel(len(UNEVEN), fixup="workspace", num_sms=4)
    with pytest.raises(ExplainError, match=r"grouped GEMM.*group_rows.*7 groups"):
        tvm_streamk.explain(sch.mod)
    report = tvm_streamk.explain(sch.mod, sizes={"group_rows": UNEVEN})
    # 3 + 0 + 1 + 4 + 1 + 0 + 2 row tiles of 16, times 3 column tiles: 33 tiles of 7 panels.
    assert report.plan.tiles == 33 and report.plan.grid == 4
    with pytest.raises(StreamKError, match=r"\[runtime-tiles\].*group_rows.*7 groups"):
        tvm_streamk.explain(sch.mod, sizes={"group_rows": [1, 2]})


def test_dlight_schedule_is_refused_with_the_reason():
    # dlight's gpu.Matmul pads the output view into a reindex buffer and drops its store.
    from tvm_streamk._compat import dlight

    func = grouped_gemm(4, 64, 32).with_attr("global_symbol", "main")
    with A100:
        mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul())(tvm.IRModule({"main": func}))
    reasons = tvm_streamk.analysis.refusals(mod["main"])
    assert any(
        "[ragged-groups]" in r and "no longer a root buffer" in r and "reference_schedule" in r
        for r in reasons.values()
    ), reasons


@pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH")
@pytest.mark.parametrize("sizing", list(SIZINGS.values()), ids=list(SIZINGS))
def test_persistent_grid_sized_by_the_built_kernels_occupancy(sizing):
    # The Stream-K grouped kernel is built through the tvm_streamk pipeline (which lowers the
    # views) and read by ptxas: 54 registers x 256 threads leave 4 blocks per sm_80 SM, as
    # many as the data-parallel kernel's 54 (46 and 5 blocks while its block's range was
    # inlined into its uses, its panel loop then 217 SASS instructions against 189 now). The
    # default bound from its IR (no gathers, no vectorised loop) is 48 registers, and the walk
    # over the groups' tiles 24 more (register_estimate.GROUP_WALK): 72 leave 3.
    kernel = moe.grouped_matmul_kernel(
        8, 512, 256, target=A100, fixup="atomic", tiles=(64, 64, 16, 4, 4), blocks_per_sm=sizing
    )
    from tvm_streamk.analysis import first_site
    from tvm_streamk.decision import record as ann

    site = first_site(kernel)
    decision = ann.decode(site.block.annotations, site.block.name_hint)
    assert (decision.num_sms, decision.blocks_per_sm) == (108, 4 if sizing == "ptxas" else 3)


def test_moe_token_features_are_checked():
    kernel = moe.grouped_matmul_kernel(4, 32, 16, num_sms=2, tiles=(16, 16, 8, 2, 2))
    with pytest.raises(StreamKError, match=r"\[moe-shapes\].*16 features"):
        _moe_module(kernel, 4, 32, 16, "float32", x_k=24)


# Group 2 holds the same five tokens in every routing; the other groups' counts change.
SHARED_GROUP, SHARED_ROWS = 2, 5
ROUTINGS = ([3, 0, 5, 64, 1], [40, 7, 5, 0, 100], [0, 0, 5, 0, 0])
# Every decomposition of the grouped GEMM, on grids of 2, 3, 5 and 7 compute units.
GROUPED_DECOMPOSITIONS = [
    ("data_parallel", 2),
    ("stream_k", 3),
    ("stream_k", 5),
    ("heuristic", 7),
    ("stream_k", 2),
]


def _shared_rows(mod: tvm.IRModule, seed=0) -> list[np.ndarray]:
    """Group 2's output rows (their bits) under each routing, the same five tokens and the same
    weights each time; every run against float64 numpy with the output poisoned."""
    rng = np.random.default_rng(seed)
    base = grouped_args(ROUTINGS[0], N, K, rng=rng)
    weights, tokens = base[1], rng.uniform(-1, 1, (SHARED_ROWS, K)).astype("float32")
    rows = []
    for counts in ROUTINGS:
        x = rng.uniform(-1, 1, (sum(counts), K)).astype("float32")
        start = sum(counts[:SHARED_GROUP])
        x[start : start + SHARED_ROWS] = tokens
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(base[2].dtype)
        out = np.full((sum(counts), N), np.nan, np.float32)
        out = pocl_backend.run(mod, x, weights, offsets, out, pipeline="tvm_streamk")[-1]
        assert workloads.relative_error(out, grouped_reference(x, weights, offsets)) <= 1e-5
        rows.append(out[start : start + SHARED_ROWS].view(np.uint32).copy())
    return rows


def test_batch_invariant_tokens_whatever_the_other_groups_hold():
    """A token's output under ``batch_invariant=True`` has the same bits whatever the other
    experts received, the grid and the decomposition (data-parallel included: it walks its
    tiles chunk by chunk); with the shared comparison, the kernels without the mode differ
    (the test that it can fail)."""
    shared, without = [], []
    for policy, sms in GROUPED_DECOMPOSITIONS:
        for invariant, found in ((True, shared), (False, without)):
            sch = workloads.reference_schedule(
                grouped_gemm(5, N, K), bm=16, bn=16, bk=8, tm=2, tn=2
            )
            plan = tvm_streamk.stream_k(
                sch,
                "C_update",
                num_sms=sms,
                policy=policy,
                fixup="workspace",
                blocks_per_sm=1,
                batch_invariant=invariant,
            )
            assert ("batch-invariant" in plan.reason) == invariant, plan.reason
            found.extend(_shared_rows(sch.mod))
    assert all((r == shared[0]).all() for r in shared[1:])
    assert any((r != without[0]).any() for r in without[1:])


def test_batch_invariant_moe_kernel_and_its_refusals():
    func = moe.grouped_matmul_kernel(
        5, N, K, layout="NN", tiles=(16, 16, 8, 2, 2), num_sms=3, batch_invariant=True
    )
    rows = _shared_rows(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
    assert all((r == rows[0]).all() for r in rows[1:])
    with pytest.raises(StreamKError, match=r"\[batch-invariant\].*atomic"):
        moe.grouped_matmul_kernel(5, N, K, num_sms=3, fixup="atomic", batch_invariant=True)
    with pytest.raises(StreamKError, match=r"Not built for a ragged K"):
        moe.grouped_weight_grad_kernel(5, N, K, num_sms=3, batch_invariant=True)

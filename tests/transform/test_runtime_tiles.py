"""Run-time tile counts (issue 15, item 1): one build of a dynamic-M kernel serves every M.

The persistent grid is ``min(resident blocks, tiles * panels)`` computed at run time, the closed
forms are evaluated on the run-time tile count inside the kernel, the counters are sized for it
and the workspace for the largest grid. Checked on PoCL against float64 numpy, with the output
poisoned, at several M from one module; the closed forms of the lowering's view against the
static plans; the per-block buffers' sizes; ptxas resources; and the refusals.
"""

import itertools

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx

import tvm_streamk
from tests.helpers import A100, FIXUPS, H100, SM_TARGETS, assert_grid_resident, with_sizings
from tests.kernels import dynamic_m_matmul
from tvm_streamk import decomposition, ptxas, resources, run_time_choice, workloads
from tvm_streamk import pocl as pocl_backend
from tvm_streamk._compat import Schedule, arith, dtype_of, structural_walk
from tvm_streamk.decomposition import INT_OPS
from tvm_streamk.errors import StreamKError
from tvm_streamk.explain import ExplainError

SIZES = (1, 7, 100, 1000, 4097)


def _reference_kernel(m="m"):
    return workloads.reference_schedule(workloads.gemm(m, 40, 56), bm=16, bn=16, bk=8, tm=2, tn=2)


def _check_every_size(sch: Schedule, sizes=SIZES) -> None:
    func = sch.mod["main"]
    for m in sizes:
        args = workloads.random_args(func, np.random.default_rng(m), m=m)
        assert np.isnan(args[-1]).all()
        out = pocl_backend.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
        ref = np.asarray(args[0], np.float64) @ np.asarray(args[1], np.float64)
        assert out.shape == ref.shape
        err = workloads.relative_error(out, ref)
        assert err <= 1e-5, f"m={m}: relative error {err}"


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("num_sms", [3, "device"])
def test_reference_schedule_one_build_every_m(fixup, num_sms):
    sch = _reference_kernel()
    chosen = tvm_streamk.stream_k(
        sch, "C_update", num_sms=num_sms, policy="stream_k", fixup=fixup, blocks_per_sm=1
    )
    assert isinstance(chosen, decomposition.RuntimeTilesPlan)
    assert "run time" in chosen.reason
    _check_every_size(sch)


def test_int32_shape_variable():
    # A run-time extent of the band's own int32 type: the closed forms still evaluate in int64.
    sch = _reference_kernel(tirx.Var("m", "int32"))
    tvm_streamk.stream_k(sch, "C_update", num_sms=5, policy="stream_k", blocks_per_sm=1)
    _check_every_size(sch, (1, 33, 1000))


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_dlight_padded_dynamic_m(fixup):
    sch, block = dynamic_m_matmul(A100)
    tvm_streamk.stream_k(
        sch, block, target=A100, num_sms=5, policy="stream_k", fixup=fixup, blocks_per_sm=1
    )
    _check_every_size(sch)


def test_run_time_grid_and_run_time_tiles():
    sch, block = dynamic_m_matmul(A100, k=96, n=64)
    tvm_streamk.stream_k(sch, block, target=A100, num_sms="device", policy="stream_k")
    _check_every_size(sch, (1, 100, 1000))


@pytest.mark.parametrize("tiles", [1, 2, 5, 7, 12, 40, 131])
@pytest.mark.parametrize("panels", [1, 3, 8])
def test_lowering_view_matches_the_static_plan(tiles, panels):
    # The view the kernel evaluates, at the grid it launches, is the plan of that tile count.
    view = decomposition.plan_at_run_time(tiles, panels, num_sms=4, blocks_per_sm=2)
    static = decomposition.plan(tiles, panels, num_sms=4, blocks_per_sm=2, policy="stream_k")
    grid = min(view.runtime_grid_bound(), tiles * panels)
    assert grid == static.grid
    for b in range(grid):
        assert view.block_range(b, 0, INT_OPS, grid) == static.block_range(b, 0)
    for t in range(tiles):
        peers = view.tile_peers(t, INT_OPS, grid)
        assert peers == static.tile_peers(t)
        expected = [static.peer_block(t, p) for p in range(peers)]
        assert [view.peer_block(t, p, INT_OPS, grid) for p in range(peers)] == expected
        # A grid that is not a Python int stands for one read at run time (its own closed form).
        at_run_time = np.int64(grid)
        assert [view.peer_block(t, p, INT_OPS, at_run_time) for p in range(peers)] == expected


@pytest.mark.parametrize("tiles", [1, 2, 7, 40])
@pytest.mark.parametrize(("panels", "splits"), [(3, 2), (8, 3), (8, 8)])
def test_split_k_view_matches_the_static_plan(tiles, panels, splits):
    view = decomposition.plan_at_run_time(tiles, panels, num_sms=4, policy="split_k", splits=splits)
    static = decomposition.plan(tiles, panels, num_sms=4, policy="split_k", splits=splits)
    grid = view.scheme.run_time_grid(view, view.runtime_grid_bound(), INT_OPS, "workspace")
    assert grid == static.grid == tiles * splits
    for b in range(grid):
        assert view.block_range(b, 0, INT_OPS, grid) == static.block_range(b, 0)
    for t in range(tiles):
        assert view.tile_peers(t, INT_OPS, grid) == static.tile_peers(t) == splits
        assert [view.peer_block(t, p, INT_OPS, grid) for p in range(splits)] == [
            static.peer_block(t, p) for p in range(splits)
        ]


def test_view_refuses_what_needs_an_int_count():
    view = decomposition.plan_at_run_time(tirx.Var("t", "int64"), 4, num_sms=4)
    with pytest.raises(decomposition.DecompositionError, match="only known at run time"):
        view.split_tiles  # noqa: B018 - the property raises


def _allocations(mod: tvm.IRModule) -> dict[str, tuple]:
    found = {}

    def on_alloc(stmt) -> None:
        buf = stmt.buffer
        found[buf.name] = (str(buf.ty.storage_scope), tuple(buf.ty.shape))

    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc):
            structural_walk(func.body, (tirx.AllocBuffer, on_alloc))
    return found


def test_per_block_buffers_are_tile_sized():
    # TVM clips a tile's buffers to the matrix (min(m, 2) * 2); they get the tile's size.
    sch = _reference_kernel()
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy="stream_k", blocks_per_sm=1)
    lib = tvm.compile(sch.mod, target=A100, tir_pipeline="tvm_streamk")
    source = lib.mod.imports[0].inspect_source()
    assert "alignas(64) float C_local_ptr[4];" in source
    assert "__shared__ alignas(64) float A_shared_ptr[128];" in source
    assert "__shared__ alignas(64) float B_shared_ptr[128];" in source


def test_grid_is_computed_at_run_time():
    sch = _reference_kernel()
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy="stream_k", blocks_per_sm=2)
    lowered = tvm_streamk.lower(sch.mod, A100)["main"].script()
    # min(slots, tiles * panels): 6 slots, 3 tile columns x 7 panels per tile row of 16.
    grid = "T.min(T.int64(6), (m + T.int64(15)) // T.int64(16) * T.int64(3) * T.int64(7))"
    assert f"sk_grid: T.let[T.int64] = {grid}" in lowered


def test_segment_values_narrow_under_a_host_check():
    # Ranges stay int64; a segment's tile and panels are int32, which the host checks before
    # any launch: 3 tile columns, so at most (2**31 - 1) // 3 tile rows of 16.
    sch = _reference_kernel()
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy="stream_k", fixup="workspace")
    lowered = tvm_streamk.lower(sch.mod, A100)["main"].script()
    assert "sk_lo: T.let[T.int64]" in lowered
    for name in ("sk_tile", "sk_k_begin", "sk_k_end"):
        assert f"{name}: T.let[T.int32]" in lowered, name
    assert '* T.int64(3) <= T.int64(2147483647), ("ValueError"' in lowered

    kernel = pocl_backend.compile(sch.mod, pipeline="tvm_streamk")

    def call(m):
        # Broadcast views: checked and planned at any size without being materialised.
        a = np.broadcast_to(np.zeros((1, 56), np.float32), (m, 56))
        b = np.zeros((56, 40), np.float32)
        c = np.broadcast_to(np.zeros((1, 40), np.float32), (m, 40))
        return a, b, c

    largest = (2**31 - 1) // 3 * 16
    launches, _ = kernel.plan_call(*call(largest))
    assert launches
    message = r"tvm-streamk: the run-time sizes \['m'\] give more than 2\*\*31 - 1 output tiles"
    with pytest.raises(ValueError, match=message):
        kernel.plan_call(*call(largest + 1))
    with pytest.raises(ValueError, match=message):
        kernel.run(*call(2**35))


@pytest.mark.ptxas
@pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH")
@pytest.mark.parametrize(
    "fixup, arch, k, sizing", with_sizings(itertools.product(FIXUPS, SM_TARGETS, (256, 3072)))
)
def test_dlight_dynamic_kernel_resources(fixup, arch, k, sizing):
    # Measured: data-parallel 64 registers on both; Stream-K 72 (atomic) and 80 (workspace) on
    # sm_80, 56-72 on sm_90. While the walk's tile and panel range were inlined into each use,
    # the atomic kernel at K = 3072 (GPT-2's fc_proj, 192 panels) on sm_80 took 112 registers
    # and held 4 blocks of the 6 the estimated grid counts on, and the workspace kernel had an
    # 8 B stack; 96 for all four while the segments' tile and panels were int64 too.
    target, sms = (A100, 108) if arch == "sm_80" else (H100, 132)
    dp, block = dynamic_m_matmul(target, k)
    sch, _ = dynamic_m_matmul(target, k)
    plan = tvm_streamk.stream_k(
        sch,
        block,
        target=target,
        num_sms=sms,
        policy="stream_k",
        fixup=fixup,
        blocks_per_sm=sizing,
    )
    base = max(resources.kernel_uses(dp.mod, target).values(), key=lambda use: use.registers)
    uses = resources.kernel_uses(sch.mod, target, "tvm_streamk")
    for name, use in uses.items():
        assert use.spills == 0 and use.stack == 0, (name, use)
        assert use.shared <= base.shared + 1024, (name, use, base)
        assert use.registers <= base.registers + 16, (name, use, base)
    # Every block of the persistent grid is resident at once.
    assert_grid_resident(uses, arch, plan.blocks_per_sm)


def test_policies_without_run_time_closed_forms_are_refused():
    sch = _reference_kernel()
    before = sch.mod
    with pytest.raises(
        StreamKError,
        match=r"\[runtime-tiles\].*policy='hybrid'.*Pass policy='data_parallel' or 'split_k' or "
        r"'stream_k' or 'heuristic'",
    ):
        tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy="hybrid")
    assert sch.mod.same_as(before)


@pytest.mark.parametrize(
    ("fixup", "splits"), [("workspace", 3), ("atomic", 3), ("separate", 5), ("workspace", 4)]
)
def test_split_k_one_build_every_m(fixup, splits):
    """Split-K's grid is its tiles x S blocks, whatever the SM count: at a run-time tile count
    the kernel launches that many (16 panels: S = 4 takes the aligned nest, which keeps the
    band's loops, S = 3 and 5 the walk)."""
    sch, block = dynamic_m_matmul(A100)
    plan = tvm_streamk.stream_k(
        sch, block, target=A100, num_sms=5, policy="split_k", splits=splits, fixup=fixup
    )
    assert isinstance(plan, decomposition.RuntimeTilesPlan) and plan.splits == splits
    assert str(plan.grid) == str(plan.tiles * splits), plan.grid
    _check_every_size(sch, (1, 7, 100, 1000))


def test_too_many_splits_of_a_run_time_tile_count_say_so():
    # The decomposition's own error, with the tile count as an expression: the message read
    # the count as an int, which raised the run-time-tiles precondition instead.
    sch = _reference_kernel()
    with pytest.raises(StreamKError, match=r"\[decomposition\].*splits <= panels = 7.*m \+"):
        tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy="split_k", splits=9)


def test_group_is_refused():
    sch = _reference_kernel()
    with pytest.raises(StreamKError, match=r"\[runtime-tiles\].*group=2"):
        tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy="stream_k", group=2)


def test_two_run_time_extents_are_refused():
    m, n = tirx.Var("m", "int64"), tirx.Var("n", "int64")
    a = tvm.te.placeholder((m, 32), name="A")
    b = tvm.te.placeholder((32, n), name="B")
    r = tvm.te.reduce_axis((0, 32), name="k")
    c = tvm.te.compute((m, n), lambda i, j: tvm.te.sum(a[i, r] * b[r, j], axis=r), name="C")
    func = tvm.te.create_prim_func([a, b, c]).with_attr("global_symbol", "main")
    sch = workloads.reference_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    with pytest.raises(StreamKError, match=r"\[runtime-tiles\].*all have run-time extents"):
        tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy="stream_k")


def test_data_parallel_leaves_the_kernel_as_written():
    # (dlight's padded schedule, which TVM bounds as written. The reference schedule's
    # A_shared it sizes m * 8 at a run-time M, and stock TVM stops on it: data-parallel walks
    # that one, test_a_kernel_as_written_that_tvm_cannot_bound_walks_its_tiles.)
    sch, block = dynamic_m_matmul(A100, k=96, n=64)
    stock = tvm.compile(sch.mod, target=A100).mod.imports[0].inspect_source()
    tvm_streamk.stream_k(sch, block, target=A100, num_sms=3, policy="data_parallel")
    lib = tvm.compile(sch.mod, target=A100, tir_pipeline="tvm_streamk")
    assert lib.mod.imports[0].inspect_source() == stock
    _check_every_size(sch, (1, 100))


def test_a_kernel_as_written_that_tvm_cannot_bound_walks_its_tiles():
    """The knob fuzz's find: the reference schedule of 8 x 8 x 4 tiles at N = 2, K = 8 (also
    K = 3 and 4, and 32 x 8 x 4 tiles), kept as written, leaves A_shared sized over the whole
    run-time M (``m * 4``): TVM's buffer compaction does not bound its copy within a tile,
    and stock TVM refuses the kernel. It was refused at build time ([run-time-allocation]) for
    data-parallel and for the heuristic, whose data-parallel counts launch it. The persistent
    walk bounds the buffer: it now runs every count, data-parallel's as one block per tile."""
    from tvm_streamk.transform import bound_allocations
    from tvm_streamk.transform._ir import HOST_BRANCH

    def kernel(tiles: dict, **knobs) -> Schedule:
        sch = workloads.reference_schedule(workloads.gemm("m", 2, 8), bk=4, **tiles)
        if knobs:
            tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=A100, **knobs)
        return sch

    small, bounded = {"bm": 8, "bn": 8, "tm": 2, "tn": 2}, {"bm": 16, "bn": 16, "tm": 4, "tn": 4}
    assert not bound_allocations.bounded_as_written(kernel(small).mod["main"])
    assert bound_allocations.bounded_as_written(kernel(bounded).mod["main"])
    for knobs in ({"policy": "data_parallel"}, {"policy": "heuristic", "fixup": "workspace"}):
        sch = kernel(small, **knobs)
        # One kernel, the walk, for every count: no host branch to the kernel as written.
        script = tvm_streamk.lower(sch.mod, A100)["main"].script()
        assert "sk_segment" in script and HOST_BRANCH not in script, knobs
        _check_every_size(sch, (1, 7, 100))
    # A tiling TVM bounds keeps the kernel as written.
    sch = kernel(bounded, policy="data_parallel")
    assert "sk_segment" not in tvm_streamk.lower(sch.mod, A100)["main"].script()


def test_explain_at_a_size():
    sch = _reference_kernel()
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, policy="stream_k", blocks_per_sm=1)
    with pytest.raises(ExplainError, match=r"pass sizes="):
        tvm_streamk.explain(sch.mod, print_=False)
    e = tvm_streamk.explain(sch.mod, sizes={"m": 100}, print_=False)
    # 7 tile rows x 3 tile columns at m=100, 7 panels of 8 over K=56.
    assert (e.plan.tiles, e.plan.panels, e.stats.grid) == (21, 7, 3)
    with pytest.raises(StreamKError, match=r"no size was given for \['m'\]"):
        tvm_streamk.explain(sch.mod, sizes={"n": 100}, print_=False)


def _launched_grid(mod: tvm.IRModule, m: int) -> int:
    """The grid the host computes for ``m`` rows: the lowered ``sk_grid`` evaluated at it."""
    found = []

    def on_bind(stmt) -> None:
        if stmt.var.name == "sk_grid":
            found.append(stmt.value)

    structural_walk(tvm_streamk.lower(mod, A100)["main"].body, (tirx.Bind, on_bind))
    (value,) = found
    at_m = tvm_ffi.structural_map(
        value, (tirx.Var, lambda v: tirx.const(m, dtype_of(v)) if v.name == "m" else v)
    )
    return int(arith.Analyzer().simplify(at_m))


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_heuristic_chooses_per_tile_count_at_run_time(fixup):
    # K = 256 in panels of 8 (P = 32), 3 tile columns, 4 SMs: the model takes Stream-K for some
    # tile counts and data-parallel for others; one build runs each count with its choice.
    sch = workloads.reference_schedule(workloads.gemm("m", 40, 256), bm=16, bn=16, bk=8, tm=2, tn=2)
    chosen = tvm_streamk.stream_k(
        sch, "C_update", num_sms=4, blocks_per_sm=1, policy="heuristic", fixup=fixup
    )
    assert (chosen.policy, chosen.variant) == ("stream_k", "or_data_parallel")
    buckets = run_time_choice.stream_k_buckets(32, 4, 1, fixup)
    assert buckets and "Stream-K for the counts" in chosen.reason
    branches = set()
    for m in (1, 20, 33, 100, 161, 1000, 4097):
        tiles = 3 * -(-m // 16)
        stream_k = any(lo <= tiles <= hi for lo, hi in buckets)
        if stream_k:
            # The model takes Stream-K at the end of the bucket holding this count.
            end = max(hi for lo, hi in buckets if lo <= tiles)
            assert run_time_choice.stream_k_wins(end, 32, 4, 1, fixup), (m, end)
        expected = min(4, tiles * 32) if stream_k else tiles
        assert _launched_grid(sch.mod, m) == expected, (m, tiles)
        branches.add(stream_k)
    assert branches == {True, False}
    _check_every_size(sch, (1, 20, 100, 161))


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_outside_the_buckets_the_host_launches_the_kernel_as_written(fixup):
    # The persistent kernel launches only for the counts in a Stream-K bucket; at the others
    # the host launches the data-parallel kernel as scheduled (a block per tile on the band's
    # own grid, 3 tile columns by ceil(m / 16) rows), never both, and no fix-up prologue.
    sch = workloads.reference_schedule(workloads.gemm("m", 40, 256), bm=16, bn=16, bk=8, tm=2, tn=2)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=4, blocks_per_sm=1, policy="heuristic", fixup=fixup
    )
    buckets = run_time_choice.stream_k_buckets(32, 4, 1, fixup)
    kernel = pocl_backend.compile(sch.mod, pipeline="tvm_streamk")
    persistent, original = set(), set()
    for m in (1, 20, 33, 100, 161, 1000, 4097):
        rows = -(-m // 16)
        a = np.broadcast_to(np.zeros((1, 256), np.float32), (m, 256))
        c = np.broadcast_to(np.zeros((1, 40), np.float32), (m, 40))
        launches, _ = kernel.plan_call(a, np.zeros((256, 40), np.float32), c)
        ran = [(k.kernel, k.grid) for k in launches if k.enabled]
        if any(lo <= 3 * rows <= hi for lo, hi in buckets):
            # The persistent grid last, after the fix-up's own prologue kernel.
            assert ran[-1][1] == (min(4, 3 * rows * 32), 1, 1), (m, ran)
            persistent.add(ran[-1][0])
        else:
            assert len(ran) == 1 and sorted(ran[0][1]) == sorted((3, rows, 1)), (m, ran)
            original.add(ran[0][0])
    # Each branch ran, with one kernel each, never the other's.
    assert len(persistent) == len(original) == 1 and not persistent & original


def test_first_wave_buckets_are_the_model_s_choice_at_each_bucket_end():
    slots, panels = 16, 32
    buckets = run_time_choice.stream_k_buckets(panels, slots, 1)
    ends = sorted({-(-q * slots // run_time_choice.FILL_STEPS) for q in range(1, 9)})
    for end in ends:
        inside = any(lo <= end <= hi for lo, hi in buckets)
        assert inside == run_time_choice.stream_k_wins(end, panels, slots, 1), end
    # Whole waves are data-parallel, and so is every count past the waves asked.
    assert not any(lo <= w * slots <= hi for lo, hi in buckets for w in range(1, 20))
    assert max(hi for _, hi in buckets) <= run_time_choice.MAX_WAVES * slots


def test_heuristic_on_a_run_time_grid_is_refused():
    sch = _reference_kernel()
    with pytest.raises(StreamKError, match=r"num_sms='device' with policy='heuristic'"):
        tvm_streamk.stream_k(sch, "C_update", num_sms="device", policy="heuristic")


def test_explain_the_run_time_choice_at_a_size():
    sch = workloads.reference_schedule(workloads.gemm("m", 40, 256), bm=16, bn=16, bk=8, tm=2, tn=2)
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, blocks_per_sm=1, policy="heuristic")
    buckets = run_time_choice.stream_k_buckets(32, 4, 1, "atomic")
    for m in (20, 1000):
        tiles = 3 * -(-m // 16)
        e = tvm_streamk.explain(sch.mod, sizes={"m": m}, print_=False)
        stream_k = any(lo <= tiles <= hi for lo, hi in buckets)
        assert e.plan.policy == ("stream_k" if stream_k else "data_parallel"), (m, e.plan)
        assert e.stats.grid == (min(4, tiles * 32) if stream_k else tiles)
        assert "bucket" in e.plan.reason

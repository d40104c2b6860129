"""Constructors of s_tir statements shared by the rewrite and its fix-ups."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from .. import decomposition
from .._compat import (
    SBlock,
    SBlockRealize,
    arith,
    assert_stmt,
    dtype_of,
    op_name,
    structural_map,
    structural_walk,
)
from ..analysis.site import COND_RUNTIME_TILES
from ..errors import HOST_CHECK, StreamKError


class TirOps:
    """Arithmetic for :mod:`tvm_streamk.decomposition` closed forms on TIR expressions."""

    floordiv = staticmethod(tirx.floordiv)
    floormod = staticmethod(tirx.floormod)
    min = staticmethod(tirx.min)
    max = staticmethod(tirx.max)

    @staticmethod
    def select(cond, a, b):
        # A condition known in Python (a constant unit index) picks its branch: a Select left in
        # an index defeats the region analyses, which bound it by both branches.
        if isinstance(cond, bool):
            return a if cond else b
        # A Python int branch takes the other branch's type (int64 indices from dlight).
        if isinstance(a, int) and not isinstance(b, int):
            a = tirx.const(a, dtype_of(b))
        if isinstance(b, int) and not isinstance(a, int):
            b = tirx.const(b, dtype_of(a))
        return tirx.Select(cond, a, b)

    @staticmethod
    def lt(a, b):
        return a < b

    @staticmethod
    def le(a, b):
        return a <= b

    @staticmethod
    def ge(a, b):
        return a >= b

    @staticmethod
    def gt(a, b):
        return a > b

    @staticmethod
    def eq(a, b):
        return a == b

    @staticmethod
    def ne(a, b):
        return a != b

    @staticmethod
    def and_(a, b):
        return tirx.And(a, b)

    @staticmethod
    def or_(a, b):
        return tirx.Or(a, b)


TIR_OPS = TirOps()


@dataclass(frozen=True)
class Segment:
    """The variables a segment of the persistent walk binds, as seen by the fix-ups."""

    block: tirx.Var  # the persistent block index
    index: tirx.Var  # position of this segment within the block's current unit
    tile: tirx.Var
    k_begin: tirx.Var
    k_end: tirx.Var
    full: tirx.Var  # the segment covers every panel of its tile
    chunk: tirx.Var | None = None  # a batch-invariant kernel's chunk (the segment covers it)
    # The K-panels of the segment's tile where tiles differ (a ragged reduction); None: the
    # site's panel count.
    panels: tirx.Expr | None = None


def tile_panels(site, seg: Segment):
    """The K-panels of ``seg``'s tile: its own where the reduction is ragged, else the site's."""
    return site.panels if seg.panels is None else seg.panels


def int_imm(value, dtype: str = "int32") -> tirx.IntImm:
    return tirx.IntImm(dtype, int(value))


def var(name: str, dtype: str = "int32") -> tirx.Var:
    return tirx.Var(name, dtype)


def seq(stmts: list) -> tirx.Stmt:
    flat = [s for s in stmts if s is not None]
    return flat[0] if len(flat) == 1 else tirx.SeqStmt(flat)


def with_body(loop: tirx.For, body: tirx.Stmt, kind: tirx.ForKind | None = None) -> tirx.For:
    """``loop`` around ``body`` (and of ``kind`` when given), everything else kept."""
    return tirx.For(
        loop.loop_var,
        loop.min,
        loop.extent,
        loop.kind if kind is None else kind,
        body,
        loop.thread_binding,
        loop.annotations,
    )


def opaque_block(name: str, body, reads=(), writes=(), predicate=True) -> SBlockRealize:
    """A block without iteration variables around ``body``, guarded by ``predicate``."""
    block = SBlock([], list(reads), list(writes), name, body)
    return SBlockRealize([], predicate, block)


def whole(buffer: tirx.Buffer):
    """The region of all of ``buffer``."""
    return tvm.tirx.BufferRegion(
        buffer,
        [tvm.ir.Range.from_min_extent(int_imm(0, dtype_of(e)), e) for e in buffer.shape],
    )


def bound_loop(
    loop_var: tirx.Var, extent, body, tag: str = "blockIdx.x", annotations=None
) -> tirx.For:
    """``for loop_var in T.thread_binding(extent, tag)``."""
    dtype = dtype_of(loop_var)
    if isinstance(extent, int):
        extent = int_imm(extent, dtype)
    # As the TVMScript parser builds it: the binding's variable is the thread tag, not the loop's.
    binding = tirx.IterVar(None, var(tag, dtype), tirx.IterVar.ThreadIndex, tag)
    return tirx.For(
        loop_var,
        int_imm(0, dtype),
        extent,
        tirx.ForKind.THREAD_BINDING,
        body,
        binding,
        annotations,
    )


def opaque_bind(
    name: str, value, dtype: str, low: int | None = None, high: int | None = None
) -> tuple[tirx.Expr, list]:
    """``value`` (known to lie in ``[low, high]``) read back through a one-element register
    buffer: the expression to use in its place, and the statements that define it.

    TVM's region analysis (``CompactBufferAllocation``) follows a ``Bind`` to its value and
    bounds every buffer access by it: a call (the device's multiprocessor count) it cannot bound
    at all, and a ``Select`` (a unit's range) by both branches, which sizes shared and register
    buffers for many tiles. A load it keeps as a symbol. The storage is declared through a view
    (``DeclBuffer``), which keeps the compaction from replacing it: the offsets it writes into
    the other buffers name the load. Every thread stores and reads its own copy (a register).
    With ``low`` and ``high`` the expression clamps the loaded variable where it is used (a
    no-op on the value): later passes do not carry a ``Bind``'s bounds into its uses, and
    ``LowerIntrin`` lowers a floor division of a sum it cannot bound below by shifting it with a
    constant that overflows int32 (a unit's range). A divisor (the run-time grid) is left
    unclamped: its clamp cost the sm_80 workspace kernel 8-24 bytes of spills.
    """
    expr, allocs, store, read = register_copy(name, value, dtype, low, high)
    return expr, [*allocs, store, read]


def register_copy(name: str, value, dtype: str, low: int | None = None, high: int | None = None):
    """The parts of :func:`opaque_bind`, for a store that must sit elsewhere (inside a block)
    than its read-back: ``(expression, allocations, store, read-back)``."""
    storage = tirx.decl_buffer((1,), dtype, name + "_local", scope="local")
    view = tirx.decl_buffer((1,), dtype, name + "_view", scope="local")
    bound = var(name, dtype)
    zero = int_imm(0)
    allocs = [tirx.AllocBuffer(storage), tirx.DeclBuffer(view, data=storage.data)]
    store = tirx.BufferStore(storage, cast_to(dtype, value), [zero])
    read = tirx.Bind(bound, tirx.BufferLoad(view, [zero]))
    if low is not None:
        bound = tirx.max(bound, int_imm(low, dtype))
    if high is not None:
        high = int_imm(high, dtype) if isinstance(high, int) else cast_to(dtype, high)
        bound = tirx.min(bound, high)
    return bound, allocs, store, read


def over_units(
    plan: decomposition.Plan, b, make_body, grid=None, idle=False, opaque_range=False
) -> tirx.Stmt:
    """``make_body(lo, hi, may_be_empty)`` for every unit range ``[lo, hi)`` of block ``b``.

    A hybrid's units (its Stream-K region, then whole data-parallel tiles) share one loop and
    one copy of the tile body: the unit's range is a ``Select`` on the unit index, read back
    through :func:`opaque_bind` so the region analyses keep every buffer the tile's size.
    (Two copies of the body, one per kind of unit, cost registers: nvcc kept values live across
    both, 64 registers where each copy alone took 40 and 48.)
    ``grid`` is the launched grid when it is only known at run time (``num_sms="device"``).
    With ``idle`` blocks may be launched beyond ``grid`` (a grouped GEMM's, whose grid the kernel
    computes from the tile count it reads): their ranges, clamped to the iterations, are empty.
    With ``opaque_range`` (a run-time tile count's walk) a single unit's range, divided by the
    run-time grid, is read back through :func:`opaque_bind` too: TVM's StmtSimplify inlines
    every pure integer ``Bind`` into its uses, and the K loop of a dynamic-M kernel recomputed
    the 64-bit divisions by the grid in every iteration (sm_90, dlight's fp32 schedule at
    K = 3072: 1.63 instructions per FMA against data-parallel's 1.25; on the H200 Nsight
    Compute counted 495 M instructions against 380 M; tests/transform/test_hot_loop.py).
    """
    units, first, may_be_empty = _walked_units(plan, grid)
    dtype = dtype_of(b)
    if _one_walked_unit(units, first):
        lo_e, hi_e = plan.block_range(b, first, TIR_OPS, grid)
        if idle:
            lo_e, hi_e = tirx.min(lo_e, plan.iterations), tirx.min(hi_e, plan.iterations)
        if grid is None:
            lo_e, hi_e = _within_grid(b, plan.grid, lo_e, hi_e)
        if opaque_range:
            lo, lo_stmts = opaque_bind("sk_lo", lo_e, dtype, 0)
            hi, hi_stmts = opaque_bind("sk_hi", hi_e, dtype, 0)
            binds = [*lo_stmts, *hi_stmts]
        else:
            lo, hi = var("sk_lo", dtype), var("sk_hi", dtype)
            binds = [tirx.Bind(lo, lo_e), tirx.Bind(hi, hi_e)]
        return seq([*binds, make_body(lo, hi, may_be_empty)])
    if idle:
        raise NotImplementedError("idle blocks of a plan of several units")
    u = var("sk_unit", dtype)
    lo_e, hi_e = plan.block_range(b, u, TIR_OPS, grid)
    lo, lo_stmts = opaque_bind("sk_lo", lo_e, dtype, 0, plan.iterations)
    hi, hi_stmts = opaque_bind("sk_hi", hi_e, dtype, 0, plan.iterations)
    body = seq([*lo_stmts, *hi_stmts, make_body(lo, hi, may_be_empty)])
    count = units if first == 0 else units - first
    return tirx.For(u, int_imm(first, dtype), count, tirx.ForKind.SERIAL, body)


def _walked_units(plan: decomposition.Plan, grid=None):
    """``(units, first, may_be_empty)``: the plan's unit count, the first unit
    :func:`over_units` walks and whether a walked unit's range may be empty for some block.

    Only a hybrid's Stream-K unit can be empty (more blocks than its iterations), and only a
    run-time grid leaves that unknown; data-parallel units always hold a whole tile. A unit
    empty for every block (a hybrid without Stream-K tiles) is not walked at all: with its
    loop, a GEMV hybrid on sm_90 took 32 registers and 8 bytes of spills, without it 36 and
    none, as its data-parallel kernel.
    """
    units = plan.units(TIR_OPS, grid)
    empty = [] if grid is not None else [lo >= hi for lo, hi in _unit_ranges(plan, 0)]
    first = 1 if isinstance(units, int) and units > 1 and empty and all(empty) else 0
    return units, first, grid is not None or (first == 0 and any(empty))


def reads_ranges_per_unit(plan: decomposition.Plan, grid=None) -> bool:
    """Whether :func:`over_units` walks several units, each unit's range read back through
    :func:`opaque_bind` inside the unit loop (a hybrid with Stream-K tiles, or any hybrid on
    a run-time grid), rather than one range bound before the walk."""
    return not _one_walked_unit(*_walked_units(plan, grid)[:2])


def _one_walked_unit(units, first: int) -> bool:
    return isinstance(units, int) and units - first == 1


def _within_grid(b: tirx.Var, grid: int, *values):
    """``values`` simplified knowing ``0 <= b < grid``.

    ``CompactBufferAllocation`` sizes and offsets the shared staging buffers by substituting a
    segment's ``Bind`` values into one another before simplifying, and ``StmtSimplify`` then
    simplifies the accesses from the bound variables, one ``Bind`` at a time. Where the block's
    bound collapses a range (``b * 10 // 9`` is ``b`` on 9 blocks) the two meet different forms
    of the same tile and first panel (``b * 10 // 45`` against ``b // 5``), the offsets no longer
    cancel, and every shared-memory access of the K loop recomputes both: dlight's 37 x 72 x 50
    workspace kernel on sm_90 took 64 registers and 4-8 bytes of spills (16 on 3 blocks) on an
    8-byte stack. Simplified here, both start from ``b``.
    """
    dtype = dtype_of(b)
    analyzer = arith.Analyzer()
    analyzer.bind(b, tvm.ir.Range.from_min_extent(int_imm(0, dtype), int_imm(grid, dtype)))
    return [analyzer.simplify(v) for v in values]


def _unit_ranges(plan: decomposition.Plan, u: int) -> list[tuple[int, int]]:
    """Every block's range of unit ``u`` of a plan on its compile-time grid."""
    return [plan.block_range(blk, u) for blk in range(plan.grid)]


INT32_MAX = 2**31 - 1


def index_dtype(site, plan: decomposition.Plan, runtime_grid: bool = False) -> str:
    """The integer type of the closed forms: the band's own type unless the plan's largest
    intermediate would wrap it (then int64), for a run-time grid at its largest."""
    if site.index_dtype == "int64" or site.runtime_tiles:
        # A run-time tile count has no compile-time bound.
        return "int64"
    bound = plan.largest_intermediate(plan.runtime_grid_bound() if runtime_grid else None)
    return "int64" if bound > INT32_MAX else site.index_dtype


def tile_bound(site, plan: decomposition.Plan):
    """The most tiles the kernel walks: an int for a compile-time count, else an int64
    expression of the run-time sizes (a grouped GEMM's bound from its rows)."""
    if not site.runtime_tiles:
        return int(plan.tiles)
    if site.ragged is not None and site.ragged.reduction:
        # A ragged reduction walks the band's tiles; its run-time count is of iterations.
        return site.ragged.real_tiles
    bound = site.ragged.tile_bound if site.ragged is not None else site.tile_count
    return arith.Analyzer().simplify(bound)


def segment_dtype(site, plan: decomposition.Plan, range_dtype: str) -> str:
    """The integer type of a segment's values (its tile, first and last panel): int32 when the
    tile count and the panel count fit it, which :func:`tile_count_check` makes the host check
    for a run-time count. The ranges they come from keep ``range_dtype`` (their products of
    blocks and iterations need int64 sooner); int32 segment values keep the tile decode, the
    counters' addresses and the panel loop's bounds in 32-bit registers."""
    bound = tile_bound(site, plan)
    if range_dtype == "int32":
        return "int32"
    if isinstance(bound, int) and max(bound, plan.panels) > INT32_MAX:
        return range_dtype
    return "int32"


def tile_count_check(site, plan: decomposition.Plan) -> tirx.Stmt | None:
    """A host check that a run-time tile count fits the int32 segment values
    (:func:`segment_dtype`, int32 for every run-time count), raising ``ValueError`` before any
    kernel launches; None where the count is known at compile time."""
    if site.ragged is not None and site.ragged.reduction:
        return _panel_count_check(site.ragged)
    bound = tile_bound(site, plan)
    if isinstance(bound, int):
        return None
    names: dict[str, None] = {}
    structural_walk(bound, (tirx.Var, lambda v: names.setdefault(v.name, None)))
    return assert_stmt(
        bound <= tirx.IntImm(dtype_of(bound), INT32_MAX),
        "ValueError",
        f"{HOST_CHECK}the run-time sizes {sorted(names)} give more than 2**31 - 1 output "
        "tiles, beyond the kernel's 32-bit tile index; split the call into parts of fewer "
        "tiles each",
    )


def _panel_count_check(space) -> tirx.Stmt | None:
    """A host check that a ragged reduction's iterations (tiles x K-panels, at most
    :attr:`~tvm_streamk.analysis.ragged.RaggedReduction.tile_bound` for its rows) fit the
    int32 values its walk counts in (:mod:`.ragged_k`)."""
    bound = arith.Analyzer().simplify(space.tile_bound)
    if isinstance(bound, tirx.IntImm):
        if int(bound) > INT32_MAX:
            raise StreamKError(
                COND_RUNTIME_TILES,
                f"a ragged reduction of up to {int(bound)} iterations (tiles x K-panels), more "
                "than 2**31 - 1",
                "Use deeper K-panels or larger tiles, or split the call.",
            )
        return None
    return assert_stmt(
        bound <= tirx.IntImm(dtype_of(bound), INT32_MAX),
        "ValueError",
        f"{HOST_CHECK}the run-time rows give up to more than 2**31 - 1 iterations (tiles x "
        "K-panels) of a ragged reduction, beyond its 32-bit walk; split the call into parts "
        "of fewer rows",
    )


def cast_to(dtype: str, value):
    """``value`` in ``dtype`` (unchanged when it already is)."""
    return value if dtype_of(value) == dtype else tirx.Cast(dtype, value)


def coordinates(
    band: tuple[tirx.For, ...], tile, group: int | None, opaque: bool = False
) -> list[tirx.Stmt]:
    """Statements that define the band's loop variables from a linear tile index.

    Coordinates are below the band's extents, so they narrow to the loops' own type exactly.
    The grouped order divides by the height of the last, shorter group (a ``min``), which
    ``CompactBufferAllocation`` cannot bound: the tile's shared and register buffers came out
    the size of the whole matrix (30720 floats per work-item for a dlight schedule, which
    overflowed PoCL's stack). Its coordinates are read back through :func:`opaque_bind`,
    clamped to the band, which the compaction bounds by the loop extents; so are they with
    ``opaque`` (a tile found through values the compaction cannot bound, a ragged reduction's).
    """
    extents = tuple(loop.extent for loop in band)
    dynamic = [i for i, e in enumerate(extents) if not isinstance(e, tirx.IntImm)]
    if dynamic:
        # A run-time extent is walked slowest: the row-major order then divides by the
        # compile-time extents only (the outermost one, here a stand-in 1, is never a divisor),
        # and no grouped order takes it (tvm_streamk.decision.rules).
        order = dynamic + [i for i in range(len(extents)) if i not in dynamic]
        walked = decomposition.tile_order(
            tile, (1, *(int(extents[i]) for i in order[1:])), ops=TIR_OPS
        )
        coords = [None] * len(extents)
        for i, c in zip(order, walked, strict=True):
            coords[i] = c
    else:
        extents = tuple(int(e) for e in extents)
        coords = decomposition.tile_order(tile, extents, group=group, ops=TIR_OPS)
    stmts: list[tirx.Stmt] = []
    for loop, c, extent in zip(band, coords, extents, strict=True):
        dtype = dtype_of(loop.loop_var)
        if group or opaque:
            c, defining = opaque_bind(f"{loop.loop_var.name}_sk", c, dtype, 0, extent - 1)
            stmts += defining
        stmts.append(tirx.Bind(loop.loop_var, cast_to(dtype, c)))
    return stmts


def prune_to(stmt, names: set[str], rewrite_realize):
    """The loops of ``stmt`` that lead to the blocks in ``names``; everything else is dropped.

    Each kept block realize is replaced by ``rewrite_realize(realize)``.
    """
    if isinstance(stmt, SBlockRealize):
        return rewrite_realize(stmt) if stmt.block.name_hint in names else None
    if isinstance(stmt, tirx.SeqStmt):
        kept = [k for k in (prune_to(s, names, rewrite_realize) for s in stmt.seq) if k]
        return seq(kept) if kept else None
    if isinstance(stmt, tirx.For):
        body = prune_to(stmt.body, names, rewrite_realize)
        return None if body is None else with_body(stmt, body)
    if isinstance(stmt, tirx.IfThenElse):
        then = prune_to(stmt.then_case, names, rewrite_realize)
        return None if then is None else tirx.IfThenElse(stmt.condition, then, None)
    return None


def storage_sync() -> tirx.Stmt:
    """A barrier across the threads of a GPU block."""
    return tirx.Evaluate(tvm.tirx.op.tvm_storage_sync("shared"))


def fresh_definitions(stmt: tirx.Stmt) -> tirx.Stmt:
    """``stmt`` with a new variable for every loop, block iteration, binding and buffer it
    defines (:func:`fresh_copy`).

    A statement built from pieces of another (a prologue from the tile body) would otherwise
    define the same variables twice in one function.
    """
    return fresh_copy(stmt)[0]


def fresh_copy(stmt: tirx.Stmt, buffers=()) -> tuple[tirx.Stmt, list]:
    """A copy of ``stmt`` that defines its own variables: every loop (and thread binding),
    block iteration, binding and buffer ``stmt`` defines, and each of ``buffers`` (allocated
    around it), gets a new variable of the same name and type; free variables (parameters,
    shapes) are kept. Returns the copy and the new ``buffers``, in order: a second copy of a
    kernel in one function, each variable defined once.

    (TVM's ``RenewDefs`` copies the definitions too, but of a buffer defined outside the
    statement it makes a new one in a block's access regions and keeps the old one in its
    ``init``.)
    """
    scalars: list = []
    inner: list = list(buffers)

    def on_for(loop) -> None:
        scalars.append(loop.loop_var)
        if loop.thread_binding is not None:
            scalars.append(loop.thread_binding.var)

    def on_block(block) -> None:
        scalars.extend(iv.var for iv in block.iter_vars)
        inner.extend(block.alloc_buffers)
        inner.extend(m.buffer for m in block.match_buffers)

    structural_walk(stmt, (tirx.For, on_for))
    structural_walk(stmt, (SBlock, on_block))
    for kind in (tirx.Bind, tirx.LetStmt, tirx.Let):
        structural_walk(stmt, (kind, lambda node: scalars.append(node.var)))
    for kind in (tirx.AllocBuffer, tirx.DeclBuffer):
        structural_walk(stmt, (kind, lambda node: inner.append(node.buffer)))
    mapping = {v.__chandle__(): tirx.Var(v.name, v.ty) for v in scalars}

    def renew(v):
        return mapping.get(v.__chandle__(), v)

    for buf in inner:
        if buf.__chandle__() not in mapping:
            # A buffer's type may name a variable the copy renews (a shape over a loop).
            ty = structural_map(buf.ty, (tirx.Var, renew))
            mapping[buf.__chandle__()] = tirx.Var(buf.name, ty)
    copy = structural_map(stmt, (tirx.Var, renew))
    return copy, [renew(b) for b in buffers]


def truncating(node, divisor=None):
    """``node`` (an expression or a statement) with its floor divisions and modulos truncating,
    only those by ``divisor`` when given.

    For the closed forms of :mod:`tvm_streamk.decomposition`, whose divisions divide a
    non-negative value by a positive one where their value is used (the
    :class:`~tvm_streamk.decomposition.Ops` contract, checked by
    ``tests/decomposition/test_decomposition.py``), the two agree. A floor division by a value
    TVM cannot sign (a run-time count) lowers to a division, a modulo and a sign test; a
    truncating one is the division alone.
    """
    if isinstance(node, int):
        return node

    def by(e) -> bool:
        return divisor is None or e.b.same_as(divisor)

    return structural_map(
        node,
        [
            (tirx.FloorDiv, lambda e: tirx.truncdiv(e.a, e.b) if by(e) else e),
            (tirx.FloorMod, lambda e: tirx.truncmod(e.a, e.b) if by(e) else e),
        ],
    )


# The key of :func:`host_branch`'s attribute.
HOST_BRANCH = "tvm_streamk.host_branch"


def host_branch(condition, body: tirx.Stmt) -> tirx.Stmt:
    """``body`` (kernels) run only where the host finds ``condition`` true.

    An attribute until the host and device code are split, then a branch of the host code
    (:class:`~.host_branches.HostBranches`): TVM's ``ThreadSync`` refuses every barrier under a
    branch, even one around whole kernels."""
    return tirx.AttrStmt(tvm.ir.StringImm("host"), HOST_BRANCH, condition, body)


def map_prim_funcs(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    """``mod`` with ``rewrite(name, func)`` in place of each PrimFunc it changes (the module
    passes that rewrite function by function after TVM's pipeline)."""
    updates = {
        gv: rewrite(gv.name_hint, func)
        for gv, func in mod.functions.items()
        if isinstance(func, tirx.PrimFunc)
    }
    for gv, func in updates.items():
        if not func.same_as(mod[gv]):
            mod[gv] = func
    return mod


# TVM's launch of a device kernel from its host function (after SplitHostDevice).
LAUNCH_OP = "tirx.call_ffi_kernel"


def launched_kernels(func: tirx.PrimFunc) -> set[str]:
    """Names of the device kernels host function ``func`` launches."""
    names: set[str] = set()

    def on_call(call) -> None:
        if op_name(call) == LAUNCH_OP and isinstance(call.args[0], tvm.ir.StringImm):
            names.add(call.args[0].value)

    structural_walk(func.body, (tvm.ir.Call, on_call))
    return names


def launched_by(mod: tvm.IRModule, attr: str) -> dict[str, list]:
    """For each device kernel of ``mod`` that a host function carrying ``attr`` launches, the
    values of ``attr`` on those functions (the pipeline's passes that hand a host function's
    mark on to its kernels once host and device code are split)."""
    found: dict[str, list] = {}
    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None and attr in func.attrs:
            for name in launched_kernels(func):
                found.setdefault(name, []).append(func.attrs[attr])
    return found

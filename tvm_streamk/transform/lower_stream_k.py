"""``LowerStreamK``: rewrite blocks annotated by ``tvm_streamk.stream_k`` into persistent kernels.

For each annotated reduction block the pass replaces the ``blockIdx`` tile band around it with::

    for b in blockIdx.x(grid):                    # one block per plan entry
      for u in range(units):                      # ranges of flattened (tile, panel) iterations
        lo, hi = plan.block_range(b, u)
        for s in range(ceil(hi / P) - lo // P if lo < hi else 0):  # one segment per tile touched
          tile = lo // P + s;  k0 = max(lo - tile * P, 0);  k1 = min(hi - tile * P, P)
          <band coordinates> = tile_order(tile)
          <original tile body, panel loop over [k0, k1)>

The original body is kept whole (thread loops, shared-memory staging, barriers, micro-kernel), so
``ThreadSync`` and the rest of the pipeline treat it as before. The closed forms come from
:mod:`tvm_streamk.decomposition`, evaluated on TIR expressions: the kernel and the Python plan
cannot disagree. With the atomic fix-up, a segment that covers the whole tile stores it, any other
segment atomically adds its partial sum, and a prologue kernel zeroes exactly the split tiles.

The pass runs first in the ``tvm_streamk`` pipeline, while blocks and ``T.init`` still exist.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .. import annotations as ann
from .. import decomposition
from .._compat import SBlock, SBlockRealize, dtype_of, structural_map
from ..analysis import COND_ATOMIC, COND_EPILOGUE, StreamKSite, analyze, blocks_under
from ..errors import StreamKError
from . import fixup_atomic
from ._ir import fresh_definitions, replace_block


class TirOps:
    """Arithmetic for :mod:`tvm_streamk.decomposition` closed forms on TIR expressions."""

    floordiv = staticmethod(tirx.floordiv)
    floormod = staticmethod(tirx.floormod)
    min = staticmethod(tirx.min)
    max = staticmethod(tirx.max)

    @staticmethod
    def select(cond, a, b):
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


def _int(value, dtype: str = "int32") -> tirx.IntImm:
    return tirx.IntImm(dtype, int(value))


def _var(name: str, dtype: str = "int32") -> tirx.Var:
    return tirx.Var(name, dtype)


def _seq(stmts: list) -> tirx.Stmt:
    flat = [s for s in stmts if s is not None]
    return flat[0] if len(flat) == 1 else tirx.SeqStmt(flat)


def _without_decision(annotations) -> dict:
    return {k: v for k, v in annotations.items() if not k.startswith(ann.PREFIX)}


def plan_for(site: StreamKSite, decision: ann.Decision) -> decomposition.Plan:
    """The decomposition plan a decision stands for on this site."""
    return decomposition.plan(
        site.tiles,
        site.panels,
        decision.num_sms,
        blocks_per_sm=decision.blocks_per_sm,
        policy=decision.policy,
        splits=decision.splits if decision.policy == "split_k" else None,
        variant=decision.variant,
    )


def check_fixup(site: StreamKSite, fixup: str, target: tvm.target.Target | None) -> None:
    """Refuse a fix-up the site cannot use; ``target`` may be None before a target is known."""
    if fixup != "atomic":
        raise StreamKError(
            "fixup",
            f"fixup={fixup!r}",
            "Only the atomic fix-up is implemented so far; use fixup='atomic'.",
        )
    if site.epilogue:
        wb = next(w for w in site.writebacks if not w.plain_copy)
        raise StreamKError(
            COND_EPILOGUE,
            f"write-back block {wb.block.name_hint!r} computes `{wb.block.body.value}` "
            f"into {wb.output.name} ({wb.output.dtype}) from the {site.accumulator_dtype} "
            "accumulator",
            "Atomic adds merge raw partial sums, so a fused epilogue (bias, activation, cast) "
            "would be applied to each partial; use the workspace fix-up (fixup='workspace') "
            "or move the epilogue into its own kernel.",
        )
    if site.fragment_accumulator:
        raise StreamKError(
            COND_ATOMIC,
            f"accumulator {site.accumulator.name} lives in tensor-core fragment scope "
            f"{site.accumulator.scope()!r}, whose elements have no addresses",
            "Use the workspace fix-up (fixup='workspace').",
        )
    if target is not None:
        fixup_atomic.check_dtype(site.accumulator_dtype, target)


def rewrite(func: tirx.PrimFunc, block_name: str, target) -> tirx.PrimFunc:
    """Rewrite the Stream-K decision recorded on ``block_name`` in ``func``."""
    site = analyze(func, block_name)
    decision = ann.decode(site.block.annotations, block_name)
    check_fixup(site, decision.fixup, target)
    plan = plan_for(site, decision)
    root_realize: SBlockRealize = func.body
    root = root_realize.block

    def strip(block: SBlock) -> SBlock:
        if block.name_hint == block_name:
            return replace_block(block, annotations=_without_decision(block.annotations))
        return block

    if plan.policy == "data_parallel":
        # The original kernel already is the data-parallel decomposition.
        return func.with_body(structural_map(func.body, (SBlock, strip)))

    main = _persistent_nest(site, plan, decision, target, strip)
    nests = [main]
    if plan.split_tiles:
        nests.insert(0, _zero_nest(site, plan, decision))
    band_var = site.band[0].loop_var

    def swap_band(loop: tirx.For):
        if loop.loop_var.same_as(band_var):
            return _seq(nests)
        return loop

    new_root_body = structural_map(root.body, (tirx.For, swap_band))
    new_root = replace_block(root, body=new_root_body)
    new_func = func.with_body(
        SBlockRealize(root_realize.iter_values, root_realize.predicate, new_root)
    )
    return new_func


def _coordinates(site: StreamKSite, tile, decision: ann.Decision) -> list:
    """``Bind`` statements that define the band's loop variables from a linear tile index."""
    coords = decomposition.tile_order(
        tile, site.band_extents, group=decision.group or None, ops=TIR_OPS
    )
    return [tirx.Bind(loop.loop_var, c) for loop, c in zip(site.band, coords)]


def _thread_for(var, extent, body) -> tirx.For:
    # As the TVMScript parser builds it: the binding's variable is the thread tag, not the loop's.
    dtype = dtype_of(var)
    binding = tirx.IterVar(None, _var("blockIdx.x", dtype), tirx.IterVar.ThreadIndex, "blockIdx.x")
    return tirx.For(var, _int(0, dtype), extent, tirx.ForKind.THREAD_BINDING, body, binding)


def _over_units(plan: decomposition.Plan, b, make_body) -> tirx.Stmt:
    """``make_body(lo, hi)`` for every unit range of block ``b``; a loop when there are several."""
    units = plan.units(TIR_OPS)
    dtype = dtype_of(b)
    lo, hi = _var("sk_lo", dtype), _var("sk_hi", dtype)
    if isinstance(units, int) and units == 1:
        lo_e, hi_e = plan.block_range(b, 0, TIR_OPS)
        return _seq([tirx.Bind(lo, lo_e), tirx.Bind(hi, hi_e), make_body(lo, hi)])
    u = _var("sk_unit", dtype)
    lo_e, hi_e = plan.block_range(b, u, TIR_OPS)
    body = _seq([tirx.Bind(lo, lo_e), tirx.Bind(hi, hi_e), make_body(lo, hi)])
    return tirx.For(u, _int(0, dtype), units, tirx.ForKind.SERIAL, body)


def _persistent_nest(site, plan, decision, target, strip) -> tirx.Stmt:
    panels = site.panels
    panel = site.panel_loop
    dtype = site.index_dtype
    tile, k0, k1 = _var("sk_tile", dtype), _var("sk_k_begin", dtype), _var("sk_k_end", dtype)
    full = _var("sk_full", "bool")
    writeback_names = {wb.block.name_hint for wb in site.writebacks}

    def retarget(block: SBlock) -> SBlock:
        block = strip(block)
        if block.name_hint in writeback_names:
            return fixup_atomic.merge_store(block, full, target)
        return block

    def ranged_panel(loop: tirx.For):
        if not loop.loop_var.same_as(panel.loop_var):
            return loop
        # Substituted rather than bound: block regions hoisted by later passes must see the loop
        # variable itself to relax over it.
        old = loop.loop_var
        k_dtype = dtype_of(old)
        k = _var(old.name + "_sk", k_dtype)
        begin, end = (
            (k0, k1) if k_dtype == dtype else (tirx.Cast(k_dtype, k0), tirx.Cast(k_dtype, k1))
        )
        body = structural_map(loop.body, (tirx.Var, lambda v: k + begin if v.same_as(old) else v))
        return tirx.For(k, _int(0, k_dtype), end - begin, loop.kind, body, None, loop.annotations)

    tile_body = structural_map(site.band[-1].body, [(SBlock, retarget), (tirx.For, ranged_panel)])
    b = _var("sk_block", dtype)
    seg = _var("sk_segment", dtype)

    def walk(lo, hi) -> tirx.Stmt:
        # The tiles a range touches are lo // P .. ceil(hi / P) - 1: one segment each. A counted
        # loop, not a while over a mutable cursor, keeps every index a pure function of loop
        # variables, which the region analyses of the rest of the pipeline need.
        first = tirx.floordiv(lo, panels)
        count = tirx.floordiv(hi + (panels - 1), panels) - first
        segment = _seq(
            [
                tirx.Bind(tile, first + seg),
                tirx.Bind(k0, tirx.max(lo - tile * panels, 0)),
                tirx.Bind(k1, tirx.min(hi - tile * panels, panels)),
                *_coordinates(site, tile, decision),
                tirx.Bind(full, tirx.And(k0 == 0, k1 == panels)),
                tile_body,
            ]
        )
        extent = tirx.Select(lo < hi, count, _int(0, dtype))
        return tirx.For(seg, _int(0, dtype), extent, tirx.ForKind.SERIAL, segment)

    return _thread_for(b, _int(plan.grid, dtype), _over_units(plan, b, walk))


def _zero_nest(site: StreamKSite, plan, decision) -> tirx.Stmt:
    """A kernel that zeroes every split tile before the atomic adds land on it.

    A tile is split exactly when some unit range starts strictly inside it (the ranges partition
    the iteration space), so block ``b`` zeroes the tile where each of its ranges starts unaligned.
    Two blocks may zero the same tile: identical stores of zero, so the race is benign.
    """
    panels = site.panels
    writeback_names = {wb.block.name_hint for wb in site.writebacks}

    def keep(stmt):
        """The tile body pruned to the loops around the write-back, which now stores zero."""
        if isinstance(stmt, SBlockRealize):
            if stmt.block.name_hint not in writeback_names:
                return None
            block = stmt.block
            store = block.body
            zero = tirx.const(0, str(store.buffer.dtype))
            new_block = replace_block(
                block,
                name_hint=block.name_hint + "_sk_zero",
                reads=[],
                body=tirx.BufferStore(store.buffer, zero, store.indices),
                annotations={},
            )
            return SBlockRealize(stmt.iter_values, stmt.predicate, new_block)
        if isinstance(stmt, tirx.SeqStmt):
            kept = [k for k in (keep(s) for s in stmt.seq) if k is not None]
            return _seq(kept) if kept else None
        if isinstance(stmt, tirx.For):
            body = keep(stmt.body)
            if body is None:
                return None
            return tirx.For(
                stmt.loop_var,
                stmt.min,
                stmt.extent,
                stmt.kind,
                body,
                stmt.thread_binding,
                stmt.annotations,
            )
        if isinstance(stmt, tirx.IfThenElse):
            then = keep(stmt.then_case)
            return None if then is None else tirx.IfThenElse(stmt.condition, then, None)
        return None

    zero_body = keep(site.band[-1].body)
    dtype = site.index_dtype
    tile = _var("sk_zero_tile", dtype)
    b = _var("sk_zero_block", dtype)

    def zero_where_split(lo, hi) -> tirx.Stmt:
        starts_inside = tirx.And(lo < hi, tirx.floormod(lo, panels) != 0)
        body = _seq(
            [
                tirx.Bind(tile, tirx.floordiv(lo, panels)),
                *_coordinates(site, tile, decision),
                zero_body,
            ]
        )
        return tirx.IfThenElse(starts_inside, body, None)

    nest = _thread_for(b, _int(plan.grid, dtype), _over_units(plan, b, zero_where_split))
    return fresh_definitions(nest)


def annotated_blocks(func: tirx.PrimFunc) -> list[str]:
    """Names of the blocks of ``func`` that carry a Stream-K decision."""
    return [b.name_hint for b in blocks_under(func.body) if ann.has_decision(b.annotations)]


def _lower(func: tirx.PrimFunc, mod: tvm.IRModule, ctx) -> tirx.PrimFunc:
    names = annotated_blocks(func)
    if not names:
        return func
    target = func.attrs.get("target") if func.attrs is not None else None
    for name in names:
        func = rewrite(func, name, target)
    return func


def LowerStreamK() -> tvm.transform.Pass:
    """Rewrite every block annotated by :func:`tvm_streamk.stream_k` into a Stream-K kernel.

    Preconditions are checked again here (a schedule may have changed after ``stream_k`` ran);
    a violated one raises :class:`~tvm_streamk.errors.StreamKError`. Functions without annotated
    blocks pass through unchanged.
    """
    return tvm.tirx.transform.prim_func_pass(_lower, opt_level=0, name="tvm_streamk.LowerStreamK")

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
segment merges its partial sums through the fix-up the decision names (:mod:`.fixup_atomic`,
:mod:`.fixup_workspace`), which may add a prologue kernel and buffers of its own.

The pass runs first in the ``tvm_streamk`` pipeline, while blocks and ``T.init`` still exist.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .. import annotations as ann
from .. import decomposition
from .._compat import SBlock, SBlockRealize, dtype_of, structural_map
from ..analysis import StreamKSite, analyze, blocks_under
from ..errors import StreamKError
from ._ir import Segment, block_loop, coordinates, int_imm, over_units, replace_block, seq, var
from .fixup_atomic import AtomicFixup
from .fixup_atomic import check as check_atomic
from .fixup_workspace import WorkspaceFixup
from .fixup_workspace import check as check_workspace
from .localize import localize_accumulator

FIXUPS = {"atomic": AtomicFixup, "workspace": WorkspaceFixup}


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
    if fixup == "atomic":
        check_atomic(site, target)
    elif fixup == "workspace":
        check_workspace(site)
    else:
        raise StreamKError("fixup", f"fixup={fixup!r}", f"Use one of {sorted(FIXUPS)}.")


def make_fixup(site: StreamKSite, plan, decision: ann.Decision, target, tile_body):
    """The fix-up object that merges partial tiles for this decision."""
    if target is None:
        raise StreamKError(
            "target",
            "a function without a target attribute",
            "Lower through tvm.compile(..., target=...) or tvm_streamk.lower(mod, target).",
        )
    check_fixup(site, decision.fixup, target)
    return FIXUPS[decision.fixup](site, plan, target, decision.group or None, tile_body)


def rewrite(func: tirx.PrimFunc, block_name: str, target) -> tirx.PrimFunc:
    """Rewrite the Stream-K decision recorded on ``block_name`` in ``func``."""
    site = analyze(func, block_name)
    decision = ann.decode(site.block.annotations, block_name)
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

    tile_body = localize_accumulator(site.band[-1].body, site)
    fixup = make_fixup(site, plan, decision, target, tile_body)
    nests = [fixup.prologue(), _persistent_nest(site, plan, decision, fixup, strip, tile_body)]
    band_var = site.band[0].loop_var

    def swap_band(loop: tirx.For):
        if loop.loop_var.same_as(band_var):
            return seq(nests)
        return loop

    new_root = replace_block(
        root,
        body=structural_map(root.body, (tirx.For, swap_band)),
        alloc_buffers=[*root.alloc_buffers, *fixup.buffers],
    )
    return func.with_body(SBlockRealize(root_realize.iter_values, root_realize.predicate, new_root))


def _persistent_nest(site, plan, decision, fixup, strip, tile_body) -> tirx.Stmt:
    panels = site.panels
    panel = site.panel_loop
    dtype = site.index_dtype
    seg = Segment(
        block=var("sk_block", dtype),
        index=var("sk_segment", dtype),
        tile=var("sk_tile", dtype),
        k_begin=var("sk_k_begin", dtype),
        k_end=var("sk_k_end", dtype),
        full=var("sk_full", "bool"),
    )
    tile, k0, k1 = seg.tile, seg.k_begin, seg.k_end
    writeback_names = {wb.block.name_hint for wb in site.writebacks}

    def retarget(block: SBlock) -> SBlock:
        block = strip(block)
        if block.name_hint in writeback_names:
            return fixup.merge_writeback(block, seg)
        return block

    def ranged_panel(loop: tirx.For):
        if not loop.loop_var.same_as(panel.loop_var):
            return loop
        # Substituted rather than bound: block regions hoisted by later passes must see the loop
        # variable itself to relax over it.
        old = loop.loop_var
        k_dtype = dtype_of(old)
        k = var(old.name + "_sk", k_dtype)
        begin, end = (k0, k1)
        if k_dtype != dtype:
            begin, end = tirx.Cast(k_dtype, k0), tirx.Cast(k_dtype, k1)
        body = structural_map(loop.body, (tirx.Var, lambda v: k + begin if v.same_as(old) else v))
        return tirx.For(
            k, int_imm(0, k_dtype), end - begin, loop.kind, body, None, loop.annotations
        )

    tile_body = structural_map(tile_body, [(SBlock, retarget), (tirx.For, ranged_panel)])

    def walk(lo, hi) -> tirx.Stmt:
        # The tiles a range touches are lo // P .. ceil(hi / P) - 1: one segment each. A counted
        # loop, not a while over a mutable cursor, keeps every index a pure function of loop
        # variables, which the region analyses of the rest of the pipeline need.
        first = tirx.floordiv(lo, panels)
        count = tirx.floordiv(hi + (panels - 1), panels) - first
        segment = seq(
            [
                tirx.Bind(tile, first + seg.index),
                tirx.Bind(k0, tirx.max(lo - tile * panels, 0)),
                tirx.Bind(k1, tirx.min(hi - tile * panels, panels)),
                *coordinates(site.band, tile, decision.group or None),
                tirx.Bind(seg.full, tirx.And(k0 == 0, k1 == panels)),
                tile_body,
                fixup.after_segment(seg),
            ]
        )
        extent = tirx.Select(lo < hi, count, int_imm(0, dtype))
        return tirx.For(seg.index, int_imm(0, dtype), extent, tirx.ForKind.SERIAL, segment)

    grid = int_imm(plan.grid, dtype)
    return block_loop(seg.block, grid, over_units(plan, seg.block, walk))


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

"""The order in which a tiled reduction's thread walks K, and the panel depth it walks it in.

Pure: never mutates IR. A batch-invariant kernel sums each chunk of K from zero in the
schedule's own order (:mod:`tvm_streamk.decomposition.chunks`). Two tilings of one GEMM give
the same bits only where that order is the same: each output element's K elements visited one
after the other, ascending, by the thread that owns the element. MetaSchedule's GPU tilings
split K into serial loops nested in order (``k_0, k_1, k_2``), which walk it ascending whatever
the factors; a reduction loop bound to threads, or split loops reordered against each other,
do not.
"""

from __future__ import annotations

from tvm import tirx

from .._compat import arith
from .blocks import find_block_path, uses_var
from .site import StreamKSite


def _extent(value) -> int | None:
    return int(value.value) if isinstance(value, tirx.IntImm) else None


def ascending_panel_depth(site: StreamKSite) -> int | None:
    """The K elements of one panel when every element's reduction walks K ascending, panel by
    panel: the loops from the panel loop inward that iterate the reduction are serial (or
    unrolled), start at zero, and enumerate the flattened reduction index (the block's reduction
    axes, outermost first) in mixed radix. None otherwise, or where an extent is symbolic.

    Examples
    --------
    MetaSchedule's ``k_0, k_1, k_2`` split of K = 512 into 64 x 4 x 2, with the panel loop
    ``k_0`` and ``v_k = k_0 * 8 + k_1 * 2 + k_2``, walks K ascending 8 elements per panel::

        >>> ascending_panel_depth(site)
        8
    """
    if site.func is None:
        return None
    path = find_block_path(site.func, site.block.name_hint)
    realize = path[-1]
    reduce = [
        (iv, value)
        for iv, value in zip(realize.block.iter_vars, realize.iter_values)
        if iv.iter_type == tirx.IterVar.CommReduce
    ]
    flat, total = tirx.IntImm("int64", 0), 1
    for iv, value in reversed(reduce):
        extent = _extent(iv.dom.extent)
        if extent is None:
            return None
        offset = tirx.Cast("int64", value - iv.dom.min)
        flat = flat + offset * tirx.IntImm("int64", total)
        total *= extent
    loops = [s for s in path if isinstance(s, tirx.For)]
    position = next(i for i, loop in enumerate(loops) if loop.same_as(site.panel_loop))
    if any(uses_var(flat, loop.loop_var) for loop in loops[:position]):
        return None
    walk, walked = tirx.IntImm("int64", 0), 1
    for loop in loops[position:]:
        if not uses_var(flat, loop.loop_var):
            continue
        extent = _extent(loop.extent)
        serial = loop.thread_binding is None and int(loop.kind) in (
            int(tirx.ForKind.SERIAL),
            int(tirx.ForKind.UNROLLED),
        )
        if extent is None or not serial or _extent(loop.min) != 0:
            return None
        walk = walk * tirx.IntImm("int64", extent) + tirx.Cast("int64", loop.loop_var)
        walked *= extent
    if walked != total or not arith.Analyzer().can_prove_equal(flat, walk):
        return None
    panels = _extent(site.panel_loop.extent)
    if panels is None or total % panels:
        return None
    return total // panels

"""The shape of one output tile: what a tile of a scheduled kernel writes along each output axis."""

from __future__ import annotations

from tvm import tirx

from .._compat import (
    BufferLoadNode,
    SBlockRealize,
    loaded_buffer,
    structural_map,
    structural_walk,
)
from .blocks import find_block_path
from .site import StreamKSite


def writeback_tile_shape(func: tirx.PrimFunc, site: StreamKSite) -> tuple[int, ...] | None:
    """Output elements one tile writes along each output axis, from the first write-back block.

    Each index of the write-back's store is bounded over the loops between the tile band and the
    block, with the band's loop variables left symbolic; the extent of that bound is the tile's
    size along the axis. A store whose indices are not affine in those loops (an implicit GEMM's
    ``out[n, i // W, i % W, c]``) is measured by the accumulator it reads instead, whose indices
    are the GEMM's rows and columns. None when neither gives constant extents.

    Parameters
    ----------
    func : PrimFunc
        The kernel.
    site : StreamKSite
        Its analysis, from :func:`tvm_streamk.analysis.analyze`.

    Returns
    -------
    tuple of int or None
    """
    from tvm import sym

    writeback = site.writebacks[0].block
    path = find_block_path(func, writeback.name_hint)
    realize: SBlockRealize = path[-1]
    loops = [s for s in path if isinstance(s, tirx.For)][len(site.band) :]
    domain = {lp.loop_var: sym.IntervalSet(lp.min, lp.min + lp.extent - 1) for lp in loops}
    bindings = {iv.var: value for iv, value in zip(writeback.iter_vars, realize.iter_values)}
    analyzer = sym.Analyzer()

    def extents(indices) -> tuple[int, ...] | None:
        shape = []
        for index in indices:
            bound = structural_map(index, (tirx.Var, lambda v: bindings.get(v, v)))
            interval = analyzer.int_set(bound, domain)
            extent = analyzer.simplify(interval.max_value - interval.min_value + 1)
            if not isinstance(extent, tirx.IntImm):
                return None
            shape.append(int(extent.value))
        return tuple(shape)

    shape = extents(writeback.body.indices)
    if shape is not None:
        return shape
    loads = []
    structural_walk(
        writeback.body.value,
        (
            BufferLoadNode,
            lambda ld: loads.append(ld) if loaded_buffer(ld).same_as(site.merged) else None,
        ),
    )
    return extents(loads[0].indices) if loads else None

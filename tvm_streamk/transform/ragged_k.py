"""The persistent walk of a ragged reduction: tiles whose K-panel counts differ by group.

A grouped weight gradient (:class:`~tvm_streamk.analysis.ragged.RaggedReduction`) gives every
tile of group ``g`` ``P(g)`` K-panels, its tokens over the panel depth. The walk counts
iterations: group ``g``'s ``tiles_per_group * P(g)`` come after the groups before it, in
tile-major order, and the prologue kernel (:func:`.tile_space.group_offsets_kernel`) writes
their prefix sums on the device. A block's equal slice ``[lo, hi)`` of them (the Stream-K
closed forms on the count read from the device, ``decision`` plans it as such) is walked as:

* the tiles holding its first and last iteration, found by binary search in the prefix sums
  (:func:`starting_tile`, :func:`.tile_space.group_search`);
* one counted loop over the tiles between them, one segment each, as the walk of equal tiles
  has (only the range, the first tile and the index stay live across the tile body): each
  segment reads its group's range back from the sums, and from it its tile's panels ``P(g)``
  and first iteration ``start``; it covers the panels ``[max(lo - start, 0), min(hi - start,
  P(g)))``. A tile of an empty group inside the range has no panel: its segment runs no
  trip and its write-back is predicated off (:func:`live_writeback`; a branch around the
  tile body would hold its barriers).

The segment carries its tile's panel count (``Segment.panels``): the fix-ups compare with it
where they compare with the site's panel count elsewhere (a tile is whole when a segment covers
its ``P(g)`` panels; the workspace fix-up's arrivals complete at ``P(g)``). A tile of an empty
group has no iteration and is walked by no slice: :func:`zero_empty_tiles` has every launched
block write its share of them through the original write-back on the accumulator's initial
zero (an empty expert's gradient is zero).

Data-parallel's walk (where TVM cannot bound the kernel as written,
:func:`.lower_stream_k.rewrite`) gives block ``b`` the iterations of tile ``b`` alone
(:func:`whole_tile_range`): one whole segment, in token order.
"""

from __future__ import annotations

from tvm import tirx

from .._compat import SBlockRealize, dtype_of, structural_map
from ..analysis import StreamKSite
from . import tile_space
from ._ir import Segment, cast_to, fresh_definitions, int_imm, prune_to, seq


def walker(site: StreamKSite, seg: Segment, tile_body, fixup, group, own: str):
    """``make_body(lo, hi, may_be_empty)`` for :func:`._ir.over_units`: the segments of the
    iteration range ``[lo, hi)`` (module docstring). ``seg.panels`` must be the variable the
    segments bind their tile's panel count to."""
    space = site.ragged
    per_group = int_imm(space.others, "int32")

    def walk(lo, hi, may_be_empty: bool) -> tirx.Stmt:
        # Iterations fit int32 (the host checks their bound, _ir.tile_count_check): the walk
        # counts in 32-bit registers (in int64, 64x64 tiles took 80 registers on sm_80 against
        # the data-parallel kernel's 46).
        dtype = "int32"
        lo, hi = cast_to(dtype, lo), cast_to(dtype, hi)
        (first, _), find_first = starting_tile(site, lo, "sk_first")
        (last, _), find_last = starting_tile(site, hi - 1, "sk_last")
        # One counted loop over the tiles from the first to the last, as the walk of equal
        # tiles has (only the range, the first tile and the index live across the tile body);
        # a tile's group, first iteration and panels are read back per segment.
        g = tirx.floordiv(seg.tile, per_group)
        (base, end), read_range = tile_space.group_range(space, g, dtype, "sk_tile_group")
        panels = tirx.floordiv(end - base, per_group)
        start = base + (seg.tile - g * per_group) * panels
        segment = seq(
            [
                tirx.Bind(seg.tile, cast_to(dtype_of(seg.tile), first + cast_to(dtype, seg.index))),
                *read_range,
                tirx.Bind(seg.panels, cast_to(own, panels)),
                tirx.Bind(seg.k_begin, cast_to(own, tirx.max(lo - start, int_imm(0, dtype)))),
                tirx.Bind(seg.k_end, cast_to(own, tirx.min(hi - start, panels))),
                *tile_space.coordinates(site, seg.tile, group),
                tirx.Bind(seg.full, tirx.And(seg.k_begin == 0, seg.k_end == seg.panels)),
                live_writeback(site, seg, tile_body),
                fixup.after_segment(seg),
            ]
        )
        count = last - first + 1
        if may_be_empty:
            count = tirx.Select(lo < hi, count, int_imm(0, dtype))
        loop = tirx.For(
            seg.index, int_imm(0, own), cast_to(own, count), tirx.ForKind.SERIAL, segment
        )
        return seq([*find_first, *find_last, loop])

    return walk


def whole_tile_range(site: StreamKSite, tile) -> tuple[tuple, list[tirx.Stmt]]:
    """``((lo, hi), statements)``: the iterations of ``tile``, all its group's panels (an
    empty range for a tile of an empty group, and past the last tile). A data-parallel walk
    gives each block its tile's range: one whole segment, summed in token order."""
    space = site.ragged
    dtype = "int32"  # as the walk counts (its host checks the iterations' bound)
    tile = cast_to(dtype, tile)
    per_group = int_imm(space.others, dtype)
    g = tirx.min(tirx.floordiv(tile, per_group), int_imm(space.groups - 1, dtype))
    (base, end), read_range = tile_space.group_range(space, g, dtype, "sk_whole_group")
    panels = tirx.floordiv(end - base, per_group)
    lo = base + (tile - g * per_group) * panels
    hi = tirx.Select(tile < int_imm(space.real_tiles, dtype), lo + panels, lo)
    return (lo, hi), read_range


def live_writeback(site: StreamKSite, seg: Segment, tile_body) -> tirx.Stmt:
    """``tile_body`` with its write-back predicated on the tile having panels.

    A tile of an empty group between two groups of a block's range has none: its segment runs
    the tile body's loops without a trip and writes nothing (a branch around the body would
    hold its barriers; :func:`zero_empty_tiles` writes the tile). Its segment is whole
    (``0 == k_begin == k_end == panels``), so no fix-up step runs for it either.
    """
    names = tuple(wb.block.name_hint for wb in site.writebacks)

    def guard(realize: SBlockRealize) -> SBlockRealize:
        if not realize.block.name_hint.startswith(names):
            return realize
        return SBlockRealize(
            realize.iter_values,
            tirx.And(realize.predicate, seg.panels > 0),
            realize.block,
        )

    return structural_map(tile_body, (SBlockRealize, guard))


def starting_tile(site: StreamKSite, lo, name: str) -> tuple[tuple, list[tirx.Stmt]]:
    """``((tile, starts inside), statements)``: the tile holding iteration ``lo``, and whether
    ``lo`` is past its first panel (the atomic fix-up zeroes such a tile: it is split)."""
    space = site.ragged
    dtype = dtype_of(lo)
    (g, local), find = tile_space.group_search(space, lo, dtype, name)
    (base, end), read_range = tile_space.group_range(space, g, dtype, f"{name}_group")
    panels = tirx.max(tirx.floordiv(end - base, int_imm(space.others, dtype)), int_imm(1, dtype))
    tile = g * space.others + tirx.floordiv(local, panels)
    return (tile, tirx.floormod(local, panels) != 0), [*find, *read_range]


def zero_empty_tiles(site: StreamKSite, seg: Segment, tile_body, block, grid, group) -> tirx.Stmt:
    """Block ``block`` of ``grid`` writes every ``grid``-th tile of the empty groups, from its
    own, through the original write-back on the accumulator's initial zero: no iteration
    covers them. ``tile_body`` is the band's body before the walk ranged it: only its
    accumulator initialisation and write-back are kept (no panel loop, no staging)."""
    space = site.ragged
    dtype = dtype_of(block)
    names = {site.init_block.name_hint, *(wb.block.name_hint for wb in site.writebacks)}
    zero_tile = prune_to(tile_body, names, lambda realize: realize)
    z = tirx.Var("sk_zero_index", dtype)
    tile = block + z * grid
    g = tirx.floordiv(tile, int_imm(space.others, dtype))
    (base, end), read_range = tile_space.group_range(space, g, dtype, "sk_zero_group")
    body = seq(
        [
            tirx.Bind(seg.tile, cast_to(dtype_of(seg.tile), tile)),
            *tile_space.coordinates(site, seg.tile, group),
            zero_tile,
        ]
    )
    # The test is the same for every thread of the block: no barrier is reached by some only.
    empty = seq([*read_range, tirx.IfThenElse(base == end, body, None)])
    tiles = int_imm(space.real_tiles, dtype)
    count = tirx.floordiv(tiles - block + grid - 1, grid)
    return fresh_definitions(tirx.For(z, int_imm(0, dtype), count, tirx.ForKind.SERIAL, empty))

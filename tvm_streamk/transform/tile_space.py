"""The tile space a persistent kernel walks: the band's tiles, or a grouped GEMM's.

:func:`coordinates` defines the band's loop variables from a linear tile index. For a plain
band that is the tile order (:func:`._ir.coordinates`). For a grouped GEMM
(:class:`~tvm_streamk.analysis.ragged.RaggedSpace`) the tiles are those of the groups one after
the other, each group's row tiles slowest: :func:`group_offsets_kernel` writes the prefix sums
of the groups' tile counts to a device array first, and a tile finds its group by a binary
search in it (``ceil(log2 G)`` steps, each a load and two selects), then its place in the group
by the band's other extents. The kernels read their tile count from the array's last entry
(:func:`bind_tile_count`); the host never learns it, so the persistent grid stays fixed.
"""

from __future__ import annotations

import math

from tvm import tirx

from .. import decomposition
from .._compat import dtype_of, structural_map
from ..analysis import StreamKSite
from . import fixup as fixups
from ._ir import (
    TIR_OPS,
    bound_loop,
    cast_to,
    int_imm,
    opaque_block,
    register_copy,
    seq,
    var,
    whole,
)
from ._ir import coordinates as band_coordinates


def coordinates(
    site: StreamKSite, tile, group: int | None, opaque: bool = False
) -> list[tirx.Stmt]:
    """Statements that define the band's loop variables from the linear tile index ``tile``;
    with ``opaque`` a band's are read back as symbols (:func:`._ir.coordinates`)."""
    if site.ragged is None:
        return band_coordinates(site.band, tile, group, opaque=opaque)
    if site.ragged.reduction:
        # A ragged reduction's tiles are the band's, its group axis outermost. The tile comes
        # from the iteration offsets: its coordinates are read back as symbols, which bound
        # the tile body's buffers by the band's extents. (The tile itself must stay an
        # expression of the walk's loops: a symbol would let the compaction shrink the global
        # buffers it indexes, the counters and the peer records, to one tile's entries.)
        return band_coordinates(site.band, tile, group, opaque=True)
    space = site.ragged
    dtype = dtype_of(tile)
    (g, local), stmts = group_search(space, tile, dtype, "sk_group")
    others = space.others
    row_tile = tirx.floordiv(local, others) if others > 1 else local
    rest = (
        decomposition.tile_order(tirx.floormod(local, others), space.other_extents, ops=TIR_OPS)
        if space.other_extents
        else ()
    )
    coords = {space.row_axis: row_tile}
    if space.group_axis is not None:
        coords[space.group_axis] = g
    other_axes = [i for i in range(len(site.band)) if i not in coords]
    coords.update(zip(other_axes, rest, strict=True))
    for i, loop in enumerate(site.band):
        stmts.append(tirx.Bind(loop.loop_var, cast_to(dtype_of(loop.loop_var), coords[i])))
    return stmts


def group_search(space, unit, dtype: str, name: str) -> tuple[tuple, list[tirx.Stmt]]:
    """``((group, index in it), statements)`` of the walk's unit ``unit`` (a tile of a grouped
    GEMM, an iteration of a ragged reduction), by binary search in the space's offsets."""
    offsets = space.tile_offsets
    search: list[tirx.Stmt] = []
    # Invariant: offsets[lo] <= unit < offsets[hi]; an empty group has offsets[g] ==
    # offsets[g + 1], so the largest g with offsets[g] <= unit holds the unit.
    lo, hi = int_imm(0, dtype), int_imm(space.groups, dtype)
    for step in range(math.ceil(math.log2(space.groups)) if space.groups > 1 else 0):
        mid, new_lo, new_hi = (var(f"{name}_{n}{step}", dtype) for n in ("mid", "lo", "hi"))
        take = cast_to(dtype, tirx.BufferLoad(offsets, [mid])) <= unit
        search += [
            tirx.Bind(mid, tirx.floordiv(lo + hi, 2)),
            tirx.Bind(new_lo, tirx.Select(take, mid, lo)),
            tirx.Bind(new_hi, tirx.Select(take, hi, mid)),
        ]
        lo, hi = new_lo, new_hi
    # The search runs in a block of its own (the pipeline places the offsets' allocation by the
    # blocks that access it) and leaves the group and the unit's index in it in registers,
    # read back as symbols: the region analyses then bound every buffer by the band's extents.
    found = var(f"{name}_found", dtype)
    search.append(tirx.Bind(found, lo))
    return _in_block(
        f"{name}_search",
        offsets,
        search,
        [
            (name, found, 0, space.groups - 1),
            (f"{name}_unit", unit - cast_to(dtype, tirx.BufferLoad(offsets, [found])), None, None),
        ],
        dtype,
    )


def group_range(space, group, dtype: str, name: str) -> tuple[tuple, list[tirx.Stmt]]:
    """``((first unit, end), statements)`` of ``group``'s units, read from the offsets."""
    offsets = space.tile_offsets
    return _in_block(
        f"{name}_range",
        offsets,
        [],
        [
            (f"{name}_base", cast_to(dtype, tirx.BufferLoad(offsets, [group])), None, None),
            (f"{name}_end", cast_to(dtype, tirx.BufferLoad(offsets, [group + 1])), None, None),
        ],
        dtype,
    )


def _in_block(name: str, source, binds: list, outputs: list, dtype: str):
    """Values computed after ``binds`` in one block reading ``source``, read back from
    registers. ``outputs`` holds ``(name, value, low, high)``; the result is the expressions to
    use (clamped to ``[low, high]`` where given) and the statements that define them."""
    allocs, stores, reads, exprs = [], [], [], []
    for out_name, value, low, high in outputs:
        expr, alloc, store, read = register_copy(out_name, value, dtype, low, high)
        allocs += alloc
        stores.append(store)
        reads.append(read)
        exprs.append(expr)
    writes = [whole(store.buffer) for store in stores]
    block = opaque_block(name, seq([*binds, *stores]), reads=[whole(source)], writes=writes)
    return exprs, [*allocs, block, *reads]


def group_offsets_kernel(site: StreamKSite) -> tirx.Stmt | None:
    """A one-thread kernel writing the prefix sums of the groups' tile counts (None for a band
    without groups). It runs before every kernel that walks the tiles (the function launches
    its kernels in order on one stream); the sums saturate at the space's tile bound, which
    valid offsets never reach."""
    if site.ragged is None:
        return None
    space = site.ragged
    offsets, bound = space.tile_offsets, space.tile_bound
    g = var("sk_g", "int64")
    body = seq(
        [
            tirx.BufferStore(offsets, int_imm(0, "int64"), [int_imm(0, "int64")]),
            tirx.For(
                g,
                int_imm(0, "int64"),
                int_imm(space.groups, "int64"),
                tirx.ForKind.SERIAL,
                tirx.BufferStore(
                    offsets,
                    tirx.min(tirx.BufferLoad(offsets, [g]) + space.group_tiles(g), bound),
                    [g + 1],
                ),
            ),
        ]
    )
    block = opaque_block(
        "sk_group_tile_offsets",
        body,
        reads=[whole(space.views.offsets), whole(offsets)],
        writes=[whole(offsets)],
    )
    b, t = var("sk_groups_block", "int64"), var("sk_groups_thread", "int64")
    return bound_loop(b, 1, bound_loop(t, 1, block, "threadIdx.x"))


def bind_tile_count(site: StreamKSite, body: tirx.Stmt) -> list[tirx.Stmt]:
    """``body``, a kernel's, after statements binding its tile count, read from the group tile
    offsets (a variable of its own per kernel)."""
    space = site.ragged
    count = tirx.BufferLoad(space.tile_offsets, [int_imm(space.groups, "int64")])
    (value,), stmts = _in_block(
        "sk_tile_count_read",
        space.tile_offsets,
        [],
        [("sk_tile_count", count, None, None)],
        "int64",
    )
    tiles = var(space.tiles.name, "int64")
    body = structural_map(body, (tirx.Var, lambda v: tiles if v.same_as(space.tiles) else v))
    return [*stmts, tirx.Bind(tiles, value), body]


def buffers(site: StreamKSite) -> tuple:
    """The buffers the tile space adds to the function."""
    return () if site.ragged is None else (site.ragged.tile_offsets,)


class WholeTiles(fixups.Fixup):
    """The fix-up of a plan whose every segment is a whole tile: nothing to merge (a grouped
    GEMM's data-parallel kernel). Not registered: no decision names it."""

    def merge_writeback(self, block, seg):
        return block

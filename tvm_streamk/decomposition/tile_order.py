"""The order in which a persistent kernel walks its tiles: row-major or grouped (Triton's
``GROUP_M``), as a closed form evaluated on ints or TIR."""

from __future__ import annotations

from typing import Any

from .ops import INT_OPS, DecompositionError, Ops, positive_int

__all__ = ["tile_order"]


def tile_order(
    tile: Any,
    band_extents: tuple[int, ...],
    group: int | None = None,
    ops: Ops = INT_OPS,
) -> tuple[Any, ...]:
    """Decode a linear tile index into coordinates over ``band_extents``.

    Without ``group`` the order is row-major. With ``group = g`` the last two dimensions
    ``(tiles_m, tiles_n)`` are walked in groups of ``g`` tile rows, column-major inside a group
    (Triton's ``GROUP_M``), so consecutive tiles share operand panels in L2; the last group is
    shorter when ``g`` does not divide ``tiles_m``, which keeps the map a bijection. Leading
    (batch) dimensions stay outermost.

    Parameters
    ----------
    tile : int or expression
        Linear tile index in ``[0, prod(band_extents))``.
    band_extents : tuple of int
        Tiles along each band dimension, outermost first.
    group : int, optional
        Tile rows per group; needs at least two dimensions.
    ops : Ops
        Arithmetic to evaluate with.

    Returns
    -------
    tuple
        One coordinate per dimension.

    Examples
    --------
    >>> [tile_order(t, (3, 2), group=2) for t in range(6)]
    [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
    """
    extents = tuple(band_extents) if isinstance(band_extents, (tuple, list)) else None
    if not extents:
        raise DecompositionError(
            f"band_extents must be a non-empty tuple of positive ints, found {band_extents!r}"
        )
    extents = tuple(
        positive_int(f"band_extents[{i}]", e, "a tile count") for i, e in enumerate(extents)
    )
    if group is not None:
        group = positive_int("group", group, "the tile rows per group")
        if len(extents) < 2:
            raise DecompositionError(
                f"group needs at least two band dimensions, found band_extents={extents}; "
                "drop group for a one-dimensional band"
            )
    leading = extents if group is None else extents[:-2]
    rest = tile
    coords: list[Any] = []
    if group is not None:
        tm, tn = extents[-2:]
        plane = tm * tn
        local = ops.floormod(tile, plane) if leading else tile
        rest = ops.floordiv(tile, plane)
        per_group = group * tn
        first_m = ops.floordiv(local, per_group) * group
        # The last group is short when group does not divide tm; dividing by its real height
        # keeps the map a bijection.
        rows = ops.min(tm - first_m, group)
        within = ops.floormod(local, per_group)
        coords = [first_m + ops.floormod(within, rows), ops.floordiv(within, rows)]
    for i in range(len(leading) - 1, -1, -1):
        # The outermost coordinate needs no modulo for an in-range tile.
        coords.insert(0, ops.floormod(rest, leading[i]) if i else rest)
        rest = ops.floordiv(rest, leading[i])
    return tuple(coords)

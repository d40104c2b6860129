"""``hybrid``: Stream-K for the last partial wave, data-parallel for the full ones.

``G = min(num_sms*blocks_per_sm, tiles)``, ``R = tiles % G``. The Stream-K tiles are ``[0, SK)``
with ``SK = R`` (``one_tile``) or ``SK = min(R + G, tiles)`` if ``R != 0`` else ``0``
(``two_tile``: each block gets between one and two tiles of Stream-K work, which hides the
fix-up better than ``one_tile`` when ``R`` is small). Unit ``u = 0`` is the Stream-K range
``[b*SKI//G, (b+1)*SKI//G)`` with ``SKI = SK*P``; unit ``u >= 1`` is the data-parallel tile
``t = SK + b + (u-1)*G``: ``[t*P, (t+1)*P)``. ``U = 1 + (tiles - SK) // G``: the data-parallel
tiles always fill whole waves, for any ``G`` (``G > tiles`` gives ``SK = tiles``), so no
data-parallel unit is ever empty.
"""

from __future__ import annotations

from typing import Any

from .ops import INT_OPS, DecompositionError, Ops, even_block, even_range, is_static
from .policy import Policy, register
from .stream_k import region_bound, region_peer_block, region_peer_index, region_peers


class Hybrid(Policy):
    """The two hybrids differ only in :meth:`sk_tiles`."""

    name = "hybrid"
    persistent = True

    def sk_tiles(self, tiles: int, g: Any, ops: Ops) -> Any:
        raise NotImplementedError

    def grid_for(self, tiles, panels, slots, splits):
        return min(slots, tiles)

    def derived(self, tiles, panels, grid, splits):
        return {"splits": 1, "sk_tiles": self.sk_tiles(tiles, grid, INT_OPS)}

    def validate(self, p):
        if p.grid > p.tiles:
            raise DecompositionError(
                f"hybrid needs grid <= tiles = {p.tiles}, found grid={p.grid}; "
                "use stream_k when there are fewer tiles than blocks"
            )

    def stream_k_tiles(self, p, ops, g):
        # A static grid folds to an int, so the lowering gets constants rather than Selects.
        return self.sk_tiles(p.tiles, g, INT_OPS if is_static(g) else ops)

    def units(self, p, ops, g):
        if is_static(g):
            ops = INT_OPS
        return 1 + ops.floordiv(p.tiles - self.stream_k_tiles(p, ops, g), g)

    def block_range(self, p, b, u, ops, g):
        P = p.panels
        sk = self.stream_k_tiles(p, ops, g)
        sk_lo, sk_hi = even_range(b, sk * P, g, ops)
        dp_lo = (sk + b + (u - 1) * g) * P
        first = ops.eq(u, 0)
        return ops.select(first, sk_lo, dp_lo), ops.select(first, sk_hi, dp_lo + P)

    def locate(self, p, it, ops, g):
        P = p.panels
        sk = self.stream_k_tiles(p, ops, g)
        # Guard the divisor: select may evaluate the Stream-K branch when there is no SK region.
        b_sk = even_block(it, ops.max(sk * P, 1), g, ops)
        d = ops.floordiv(it, P) - sk
        in_sk = ops.lt(it, sk * P)
        return (
            ops.select(in_sk, b_sk, ops.floormod(d, g)),
            ops.select(in_sk, 0, 1 + ops.floordiv(d, g)),
        )

    def _region(self, p, ops, g):
        sk = self.stream_k_tiles(p, ops, g)
        return sk, ops.max(sk * p.panels, 1)

    def tile_peers(self, p, tile, ops, g):
        sk, n = self._region(p, ops, g)
        return ops.select(ops.lt(tile, sk), region_peers(tile, n, p.panels, g, ops), 1)

    def peer_index(self, p, b, tile, k_begin, ops, g):
        sk, n = self._region(p, ops, g)
        index = region_peer_index(b, tile, k_begin, n, p.panels, g, ops)
        return ops.select(ops.lt(tile, sk), index, 0)

    def peer_block(self, p, tile, peer, ops, g):
        _, n = self._region(p, ops, g)
        return region_peer_block(tile, peer, n, p.panels, g, ops)

    def largest_intermediate(self, p, g):
        return region_bound(p, g)

    def counter_tiles(self, p):
        # Its data-parallel tiles are always whole.
        return p.sk_tiles

    def candidates(self, tiles, panels, slots):
        # Skip hybrids that are data-parallel (full waves) or Stream-K (one partial wave) under
        # another name.
        sk = self.sk_tiles(tiles, min(slots, tiles), INT_OPS)
        return [{"variant": self.variant}] if 0 < sk < tiles else []


@register
class HybridOneTile(Hybrid):
    variant = "one_tile"
    default = False
    code = 3
    rank = 20

    def sk_tiles(self, tiles, g, ops):
        return ops.floormod(tiles, g)


@register
class HybridTwoTile(Hybrid):
    variant = "two_tile"
    code = 4
    rank = 30

    def sk_tiles(self, tiles, g, ops):
        rem = ops.floormod(tiles, g)
        return ops.select(ops.ne(rem, 0), ops.min(rem + g, tiles), 0)

"""``stream_k``: every block an equal contiguous share of the flattened iteration space.

``G = min(num_sms*blocks_per_sm, TOTAL)``, ``U = 1``; block ``b`` runs
``[b*TOTAL//G, (b+1)*TOTAL//G)``: per-block iteration counts differ by at most one. The only
policy whose closed forms take a grid read from the device at run time.

The peer closed forms (shared with the hybrid's Stream-K region): in a region of ``n``
iterations over ``g`` blocks, the blocks holding a tile's first and last iteration span
``last - first + 1`` blocks. When ``n >= g`` all of them are non-empty and hold at most ``P``
segments; when ``n < g`` every non-empty block holds one iteration, so the tile has exactly ``P``
peers. Hence ``peers = min(last - first + 1, P)``, the position of block ``b``'s segment starting
at ``k_begin`` is ``min(b - first, k_begin)``, and peer ``p`` runs on ``first + p`` when
``n >= g`` and on the block holding iteration ``tile*P + p`` otherwise.
"""

from __future__ import annotations

from typing import Any

from .ops import DecompositionError, Ops, even_block, even_range, is_static
from .policy import Policy, register


def span(tile: Any, n: Any, panels: int, g: Any, ops: Ops) -> tuple[Any, Any]:
    """Blocks holding the first and last iteration of ``tile`` in a Stream-K region of ``n``
    iterations over ``g`` blocks."""
    start = tile * panels
    return even_block(start, n, g, ops), even_block(start + panels - 1, n, g, ops)


def region_peers(tile: Any, n: Any, panels: int, g: Any, ops: Ops) -> Any:
    first, last = span(tile, n, panels, g, ops)
    return ops.min(last - first + 1, panels)


def region_peer_index(b: Any, tile: Any, k_begin: Any, n: Any, panels: int, g: Any, ops: Ops):
    first, _ = span(tile, n, panels, g, ops)
    return ops.min(b - first, k_begin)


def region_peer_block(tile: Any, peer: Any, n: Any, panels: int, g: Any, ops: Ops) -> Any:
    first, _ = span(tile, n, panels, g, ops)
    return ops.select(ops.ge(n, g), first + peer, even_block(tile * panels + peer, n, g, ops))


def region_bound(p, g: int) -> int:
    """The largest intermediate of the Stream-K region's closed forms: the even split multiplies
    a block by the iteration count (``b * TOTAL``), the block of an iteration multiplies it by
    the grid (``(it + 1) * G``)."""
    return (g + 1) * (p.iterations + p.panels + 1)


@register
class StreamK(Policy):
    name = "stream_k"
    code = 2
    rank = 40
    persistent = True
    runtime_tiles = True
    runtime_grid = True
    aligned_for_fragments = True

    def grid_for(self, tiles, panels, slots, splits):
        return min(slots, tiles * panels)

    def derived(self, tiles, panels, grid, splits):
        return {"splits": 1, "sk_tiles": tiles}

    def validate(self, p):
        if p.grid > p.iterations:
            raise DecompositionError(
                f"stream_k needs grid <= tiles*panels = {p.iterations}, found grid={p.grid}; "
                "launch fewer blocks (every block must own at least one iteration)"
            )

    def stream_k_tiles(self, p, ops, g):
        return p.tiles

    def block_range(self, p, b, u, ops, g):
        return even_range(b, p.iterations, g, ops)

    def locate(self, p, it, ops, g):
        return even_block(it, p.iterations, g, ops), 0

    def tile_peers(self, p, tile, ops, g):
        return region_peers(tile, p.iterations, p.panels, g, ops)

    def peer_index(self, p, b, tile, k_begin, ops, g):
        return region_peer_index(b, tile, k_begin, p.iterations, p.panels, g, ops)

    def peer_block(self, p, tile, peer, ops, g):
        if not is_static(g):
            # A grid read at run time is never more blocks than iterations
            # (Policy.run_time_grid): every block holds an iteration, so peer p is the p-th
            # block of the tile's span. The workspace fix-up's peer record rests on this
            # (transform.fixup_workspace, WorkspaceFixup._record_peers).
            first, _ = span(tile, p.iterations, p.panels, g, ops)
            return first + peer
        return region_peer_block(tile, peer, p.iterations, p.panels, g, ops)

    def largest_intermediate(self, p, g):
        return region_bound(p, g)

    def candidates(self, tiles, panels, slots):
        return [{}]

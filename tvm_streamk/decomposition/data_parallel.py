"""``data_parallel``: one block per output tile, each over its whole K range.

``G = tiles``, ``U = 1``; block ``b`` runs ``[b*P, (b+1)*P)``. It is the kernel as scheduled,
the baseline every other policy is measured against.
"""

from __future__ import annotations

from typing import Any

from .policy import Policy, register


@register
class DataParallel(Policy):
    name = "data_parallel"
    code = 0
    rank = 0
    needs_num_sms = False
    is_original = True

    def grid_for(self, tiles, panels, slots, splits):
        return tiles

    def derived(self, tiles, panels, grid, splits):
        return {"grid": tiles, "splits": 1, "sk_tiles": 0}

    def block_range(self, p, b, u, ops, g) -> tuple[Any, Any]:
        return b * p.panels, b * p.panels + p.panels

    def run_time_grid(self, p, slots, ops, fixup):
        # One block per tile, whatever the resident slots: block b runs tile b's panels, so the
        # base's bound (the iterations) launched blocks past the tile count, and their counters
        # and workspace slots lay past the buffers (a batch-invariant kernel of a run-time M,
        # whose persistent walk cuts each tile into its chunks; found by the knob fuzz).
        return p.grid

    def locate(self, p, it, ops, g):
        return ops.floordiv(it, p.panels), 0

    def tile_peers(self, p, tile, ops, g):
        return 1

    def peer_index(self, p, b, tile, k_begin, ops, g):
        return 0

    def peer_block(self, p, tile, peer, ops, g):
        return tile

    def largest_intermediate(self, p, g):
        return 2 * (p.iterations + p.panels)

    def candidates(self, tiles, panels, slots):
        return [{}]

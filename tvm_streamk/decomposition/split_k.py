"""``split_k``: every tile cut into ``S`` contiguous K ranges, one block each.

``G = tiles*S``, ``U = 1``; with ``t = b // S``, ``s = b % S`` block ``b`` runs
``[t*P + s*P//S, t*P + (s+1)*P//S)``. Every split is non-empty because ``1 <= S <= P``.
"""

from __future__ import annotations

from .ops import DecompositionError
from .policy import Policy, register

# Candidate split counts: beyond 16 the owner's serial read of partials dominates any gain.
MAX_SPLITS = 16
# Candidates launch at most this many waves of blocks.
MAX_SPLIT_WAVES = 2


@register
class SplitK(Policy):
    name = "split_k"
    code = 1
    rank = 10
    needs_num_sms = False
    takes_splits = True
    # Its grid is tiles x S, whatever the SM count: the host computes it from a run-time count.
    runtime_tiles = True

    def label(self, p):
        return f"split_k(S={p.splits})"

    def grid_for(self, tiles, panels, slots, splits):
        return tiles * splits

    def derived(self, tiles, panels, grid, splits):
        return {"grid": tiles * splits, "splits": splits, "sk_tiles": 0}

    def validate(self, p):
        if not 1 <= p.splits <= p.panels:
            raise DecompositionError(
                f"split_k needs 1 <= splits <= panels = {p.panels}, found splits={p.splits}; "
                "use fewer splits (every split must own at least one K-panel)"
            )

    def block_range(self, p, b, u, ops, g):
        S, P = p.splits, p.panels
        base = ops.floordiv(b, S) * P
        s = ops.floormod(b, S)
        return base + ops.floordiv(s * P, S), base + ops.floordiv((s + 1) * P, S)

    def locate(self, p, it, ops, g):
        S, P = p.splits, p.panels
        k = ops.floormod(it, P)
        # Largest split s with s*P//S <= k; unique because every split is non-empty.
        return ops.floordiv(it, P) * S + ops.floordiv((k + 1) * S - 1, P), 0

    def run_time_grid(self, p, slots, ops, fixup):
        # One block per (tile, split), whatever the resident slots: the grid is the count's.
        return p.grid

    def tile_peers(self, p, tile, ops, g):
        return p.splits

    def peer_index(self, p, b, tile, k_begin, ops, g):
        return ops.floormod(b, p.splits)

    def peer_block(self, p, tile, peer, ops, g):
        return tile * p.splits + peer

    def largest_intermediate(self, p, g):
        return 2 * (p.iterations + p.panels * p.splits)

    def aligned_splits(self, p):
        return p.splits if p.panels % p.splits == 0 else None

    def slots_per_block(self, p):
        # A split-K block runs one segment.
        return 1

    def candidates(self, tiles, panels, slots):
        out = []
        for s in range(2, min(panels, MAX_SPLITS) + 1):
            if tiles * s > MAX_SPLIT_WAVES * slots:
                break
            out.append({"splits": s})
        return out

"""What a ragged reduction costs: a grouped weight gradient's tiles, each with its group's panels.

A plan of :mod:`tvm_streamk.decomposition` gives every tile the same panels, so the model of
:mod:`.model` cannot price a ragged K from one. Here the three ways to run one are laid out
as work lists, per block the ``(tile, first panel, end panel)`` of its segments, and priced by
the same list scheduling (:func:`tvm_streamk.cost_model.model.predicted_time`'s):

* ``"stream_k"``: the persistent grid, ``min(slots, iterations)`` blocks, each walking an equal
  slice of the flattened (tile x panel) space in group order
  (:mod:`tvm_streamk.transform.ragged_k`); the tiles of empty groups written by the blocks in
  turn, a segment of no panels each.
* ``"data_parallel"``: the kernel as written, a block per tile, every tile over the panels of
  the views' row bound (all the tokens: the panels past a group's rows read zeros).
* ``"data_parallel_per_tile"``: a block per tile over its own group's panels, what a grouped
  kernel that knew every group's K would run (CUTLASS's grouped GEMM, for instance). Its time
  is set by the groups with the most tokens.

Predictions, not measurements: the model's constants (in units, or priced on a GPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .model import DEFAULT_COST, CostModelError, CostParams, _shares, _simulate, _value

POLICIES = ("stream_k", "data_parallel", "data_parallel_per_tile")


@dataclass(frozen=True)
class RaggedPlan:
    """One way to run a ragged reduction, as the list scheduler reads a plan."""

    policy: str
    grid: int
    tiles: int
    panels: int  # the mean panels of a tile (what the priced model's traffic per tile needs)
    work: tuple  # per block, its segments (tile, first panel, end panel)
    tile_panels: tuple = field(repr=False)

    def peers(self, tile: int) -> int:
        return self._peers.get(tile, 1)

    @property
    def _peers(self) -> dict:
        counts: dict = {}
        for segments in self.work:
            for tile, k0, k1 in segments:
                if k1 > k0 or self.tile_panels[tile] == 0:
                    counts[tile] = counts.get(tile, 0) + 1
        return counts

    @property
    def split_tiles(self) -> tuple:
        return tuple(t for t, n in sorted(self._peers.items()) if n > 1)

    @property
    def max_peers(self) -> int:
        return max(self._peers.values(), default=1)

    @property
    def iterations(self) -> int:
        return sum(k1 - k0 for segments in self.work for _, k0, k1 in segments)

    @property
    def iterations_per_block(self) -> list[int]:
        return [sum(k1 - k0 for _, k0, k1 in segments) for segments in self.work]

    # What the fix-ups' footprints read (fixup_registry.footprint): two partial slots per
    # block (its first and last segment), a counter per tile.
    slots_per_block = 2

    @property
    def counter_tiles(self) -> int:
        return self.tiles

    @property
    def workspace_slots(self) -> int:
        return self.grid * self.slots_per_block if self.split_tiles else 0


def tile_panels(group_rows: Sequence[int], tokens_per_panel: int, tiles_per_group: int) -> list:
    """Every tile's K-panels: ``ceil(rows / tokens_per_panel)`` of its group, in tile order."""
    if tokens_per_panel < 1 or tiles_per_group < 1:
        raise CostModelError(
            f"tokens_per_panel and tiles_per_group must be positive, found {tokens_per_panel} "
            f"and {tiles_per_group}"
        )
    panels = [-(-max(int(r), 0) // tokens_per_panel) for r in group_rows]
    return [p for p in panels for _ in range(tiles_per_group)]


def plans(
    panels: Sequence[int], panel_bound: int, num_sms: int, blocks_per_sm: int = 1
) -> dict[str, RaggedPlan]:
    """The three ways (module docstring) to run tiles of ``panels`` K-panels each, the kernel
    as written running every tile over ``panel_bound`` panels."""
    panels = tuple(int(p) for p in panels)
    tiles = len(panels)
    slots = num_sms * blocks_per_sm
    mean = max(1, round(sum(panels) / max(tiles, 1)))
    total = sum(panels)
    grid = max(1, min(slots, total))
    starts = [0]
    for p in panels:
        starts.append(starts[-1] + p)
    work = []
    for b in range(grid):
        lo, hi = b * total // grid, (b + 1) * total // grid
        segments = []
        for t in range(tiles):
            k0, k1 = max(lo - starts[t], 0), min(hi - starts[t], panels[t])
            if k1 > k0:
                segments.append((t, k0, k1))
        # The tiles of empty groups, written by the blocks in turn (ragged_k.zero_empty_tiles).
        segments += [(t, 0, 0) for t in range(b, tiles, grid) if panels[t] == 0]
        work.append(tuple(segments))
    bound = max(panel_bound, 1)
    return {
        "stream_k": RaggedPlan("stream_k", grid, tiles, mean, tuple(work), panels),
        "data_parallel": RaggedPlan(
            "data_parallel",
            tiles,
            tiles,
            bound,
            tuple(((t, 0, bound),) for t in range(tiles)),
            tuple(bound for _ in panels),
        ),
        "data_parallel_per_tile": RaggedPlan(
            "data_parallel_per_tile",
            tiles,
            tiles,
            mean,
            tuple(((t, 0, p),) for t, p in enumerate(panels)),
            panels,
        ),
    }


def predicted_times(
    ragged: dict[str, RaggedPlan],
    num_sms: int,
    blocks_per_sm: int = 1,
    cost: CostParams = DEFAULT_COST,
    fixup: str = "workspace",
) -> dict[str, float]:
    """Each plan's predicted time: in microseconds when ``cost`` prices the kernel on a GPU
    (:func:`~tvm_streamk.cost_model.priced`), else in units; the launches paid where priced
    (the persistent kernel after the prologue writing the iteration offsets)."""
    slots = num_sms * blocks_per_sm
    out = {}
    for name, p in ragged.items():
        if not p.work:
            out[name] = 0.0
            continue
        shares = _shares(p, num_sms, blocks_per_sm, None, cost)
        value = _value(_simulate(p, slots, cost, fixup, shares), cost.vector())
        if cost.price is not None:
            launches = 2 if name == "stream_k" else 1
            if name == "stream_k" and fixup == "atomic" and p.split_tiles:
                launches += 1
            value += launches * cost.price.launch_us
        out[name] = value
    return out


def summary(group_rows, tokens_per_panel, tiles_per_group, panel_bound, num_sms, **kwargs) -> str:
    """One line: each way's predicted time and Stream-K's speed-up over both data-parallels."""
    ragged = plans(
        tile_panels(group_rows, tokens_per_panel, tiles_per_group),
        panel_bound,
        num_sms,
        kwargs.pop("blocks_per_sm", 1),
    )
    times = predicted_times(ragged, num_sms, **kwargs)
    unit = "us" if kwargs.get("cost", DEFAULT_COST).price is not None else "units"
    sk = times["stream_k"] or math.inf
    return (
        f"stream_k {times['stream_k']:.4g} {unit}; data-parallel as written "
        f"{times['data_parallel']:.4g} ({times['data_parallel'] / sk:.2f}x slower); "
        f"data-parallel over each tile's own panels {times['data_parallel_per_tile']:.4g} "
        f"({times['data_parallel_per_tile'] / sk:.2f}x)"
    )

"""The report :func:`tvm_streamk.explain` returns: the figures of a plan and of its
data-parallel baseline, printed as a table or given as plain data."""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass
from typing import Any

from .decomposition import Plan

__all__ = ["Explanation", "PlanStats", "slots"]


@dataclass(frozen=True)
class PlanStats:
    """The figures of one decomposition that :class:`Explanation` sets side by side.

    Attributes
    ----------
    label : str
        The policy, with its split count or hybrid variant (``"split_k(S=3)"``).
    grid : int
        Blocks launched.
    waves : int or None
        Launch waves of ``grid`` blocks over ``num_sms * blocks_per_sm`` slots (None without an SM
        count). A persistent Stream-K grid is one wave by construction.
    iterations_per_block : tuple of int
        Fewest and most K-panel iterations any block runs.
    segments_per_block : tuple of int
        Fewest and most tiles (segments) any block touches.
    split_tiles : int
        Tiles covered by more than one block, which need the fix-up.
    max_peers : int
        Most blocks sharing one tile (1 when no tile is split).
    workspace_slots : int
        Partial-tile slots the workspace fix-up allocates when any tile is split: two per block
        (its first and last segment may be partial), one per block for split-K. Reported whatever
        the fix-up in use.
    workspace_bytes : int or None
        Global memory the fix-up takes from the workspace pool at each call. Workspace fix-up:
        ``workspace_slots`` accumulator tiles plus one int32 arrival counter per tile, 0 when no
        tile is split. Atomic fix-up: 0. None when the tile shape is unknown.
    zeroed_bytes : int or None
        Bytes the prologue kernel zeroes at each call. Atomic fix-up: the output tiles that are
        split, whole (an upper bound at predicated edges). Workspace fix-up: the arrival counters.
        None when the tile shape is unknown.
    predicted_units : float or None
        :func:`tvm_streamk.cost_model.predicted_time` (one unit = one K-panel iteration of one
        tile), or None without an SM count.
    predicted_us : float or None
        The same model's prediction in microseconds on the named GPU of the report
        (:attr:`Explanation.gpu`), or None when the kernel is not priced on one.
    """

    label: str
    grid: int
    waves: int | None
    iterations_per_block: tuple[int, int]
    segments_per_block: tuple[int, int]
    split_tiles: int
    max_peers: int
    workspace_slots: int
    workspace_bytes: int | None
    zeroed_bytes: int | None
    predicted_units: float | None
    predicted_us: float | None = None


@dataclass(frozen=True)
class Explanation:
    """What a Stream-K decomposition does, beside the data-parallel baseline for the same work.

    ``str(explanation)`` is the multi-line report; :meth:`as_dict` the same figures as plain data.

    Attributes
    ----------
    plan : Plan
        The decomposition explained.
    baseline : Plan
        The data-parallel plan of the same tiles, panels and SMs.
    stats, baseline_stats : PlanStats
        The figures of ``plan`` and of ``baseline``.
    fixup : str
        How split tiles are merged: a registered fix-up (``"atomic"``, ``"workspace"``, ...).
    tile_shape : tuple of int or None
        Output elements per tile along each output axis, if known.
    accumulator_bytes, output_bytes : int
        Bytes per element of the accumulator (workspace partials) and of the output (zeroed by
        the atomic prologue).
    function, block : str or None
        Where the decision was read from, for a schedule; None for a bare plan.
    occupancy : dict or None
        For a kernel explained with a CUDA ``target``: ``"kernel"`` and ``"data_parallel"``, the
        :class:`~tvm_streamk.occupancy.Occupancy` of the built Stream-K kernel and of the
        data-parallel one, which then also size the baseline and the model's SM sharing.
    gpu : str or None
        The GPU of :data:`tvm_streamk.cost_model.GPU_SPECS` the predictions in microseconds are
        for; None when they are in units only.
    roofline_us : float or None
        The GEMM's roofline on ``gpu`` (:func:`tvm_streamk.cost_model.roofline_us`): no
        decomposition is predicted below it.
    unpriced : str or None
        Why the kernel is not priced on the GPU asked for (predictions then in units), or None.
    invariance : str or None
        A batch-invariant kernel's chunk grid and what the mode costs, as predicted; None for
        other kernels.
    ragged : str or None
        A ragged reduction's panels per group at the routing explained, and what the model
        predicts for a data-parallel kernel over each tile's own panels; None for other kernels.
    """

    plan: Plan
    baseline: Plan
    stats: PlanStats
    baseline_stats: PlanStats
    fixup: str
    tile_shape: tuple[int, ...] | None
    accumulator_bytes: int
    output_bytes: int
    function: str | None = None
    block: str | None = None
    occupancy: dict | None = None
    gpu: str | None = None
    roofline_us: float | None = None
    unpriced: str | None = None
    invariance: str | None = None
    ragged: str | None = None

    @property
    def slots(self) -> int | None:
        """Blocks resident at once, ``num_sms * blocks_per_sm`` (None without an SM count)."""
        return slots(self.plan)

    @property
    def speedup(self) -> float | None:
        """Predicted data-parallel time over the plan's (above 1: the plan is faster), in
        microseconds when priced on a GPU, else in units."""
        ours, theirs = self.stats.predicted_units, self.baseline_stats.predicted_units
        if self.stats.predicted_us is not None and self.baseline_stats.predicted_us is not None:
            ours, theirs = self.stats.predicted_us, self.baseline_stats.predicted_us
        if ours is None or theirs is None or ours <= 0:
            return None
        return theirs / ours

    def as_dict(self) -> dict[str, Any]:
        """The report as plain, JSON-serialisable data.

        Returns
        -------
        dict
            Top-level keys describe the work and the choice (``policy``, ``reason``, ``tiles``,
            ``panels``, ``num_sms``, ``fixup``, ``tile_shape``, ``predicted_speedup``, ...);
            ``"plan"`` and ``"data_parallel"`` hold the :class:`PlanStats` of each as dicts;
            ``"predicted_us"`` the plan's, data-parallel's and the roofline's microseconds on
            ``"gpu"`` (None each when not priced). Every prediction is the cost model's, not a
            measurement.
        """
        p = self.plan
        return {
            "function": self.function,
            "block": self.block,
            "policy": p.policy,
            "variant": p.variant,
            "splits": p.splits,
            "reason": p.reason,
            "tiles": p.tiles,
            "panels": p.panels,
            "iterations": p.iterations,
            "num_sms": p.num_sms,
            "blocks_per_sm": p.blocks_per_sm,
            "slots": self.slots,
            "fixup": self.fixup,
            "tile_shape": None if self.tile_shape is None else list(self.tile_shape),
            "predicted_speedup": self.speedup,
            "gpu": self.gpu,
            "unpriced": self.unpriced,
            "batch_invariance": self.invariance,
            "ragged": self.ragged,
            "predicted_us": {
                "plan": self.stats.predicted_us,
                "data_parallel": self.baseline_stats.predicted_us,
                "roofline": self.roofline_us,
            },
            "plan": _stats_dict(self.stats),
            "data_parallel": _stats_dict(self.baseline_stats),
            "occupancy": None
            if self.occupancy is None
            else {k: dataclasses.asdict(v) for k, v in self.occupancy.items()},
        }

    def __str__(self) -> str:
        p = self.plan
        where = f" for block {self.block!r} of {self.function!r}" if self.block is not None else ""
        tile = "" if self.tile_shape is None else " of " + "x".join(map(str, self.tile_shape))
        if p.num_sms is None:
            device = "no SM count (waves and predictions need one)"
        else:
            device = f"{p.num_sms} SMs x {p.blocks_per_sm} block(s)/SM = {self.slots} slots"
        work = (
            f"{_count(p.tiles, 'tile')}{tile} x {_count(p.panels, 'K-panel')} = "
            f"{_count(p.iterations, 'iteration')}"
            if self.ragged is None
            else f"{_count(self.baseline.tiles, 'tile')}{tile}, K ragged"
        )
        lines = [
            f"Stream-K decomposition{where}",
            f"  work      {work}",
            *_wrapped("ragged K", self.ragged),
            f"  device    {device}",
            f"  policy    {self.stats.label}",
            *_wrapped("why", p.reason or "no reason recorded"),
            f"  fixup     {self.fixup}",
            *_wrapped("invariant", self.invariance),
            *_occupancy_lines(self.occupancy),
            *_gpu_lines(self.gpu, self.roofline_us, self.unpriced),
            "",
        ]
        priced = self.stats.predicted_us is not None
        ours = _column(self.stats, self.speedup, priced)
        base = _column(self.baseline_stats, None if self.speedup is None else 1.0, priced)
        names = _ROW_NAMES[:-1] + (_PRICED_ROW,) + _ROW_NAMES[-1:] if priced else _ROW_NAMES
        cells = list(zip(("", *names), ours, base))
        w0 = max(len(a) for a, _, _ in cells)
        w1 = max(len(b) for _, b, _ in cells)
        w2 = max(len(c) for _, _, c in cells)
        lines += [f"  {a:<{w0}}  {b:>{w1}}  {c:>{w2}}".rstrip() for a, b, c in cells]
        if self.stats.workspace_bytes is None:
            lines.append("  (byte counts need the tile shape: pass tile_shape=)")
        lines.append(
            "  (predicted: the cost model's figures, not measurements"
            + ("" if priced else "; one unit = one K-panel iteration of one tile")
            + ")"
        )
        return "\n".join(lines)


def _wrapped(label: str, text: str | None) -> list[str]:
    """``text`` under ``label`` in the report's column, wrapped at 96 (nothing for None)."""
    return textwrap.wrap(
        text or "",
        width=96,
        initial_indent=f"  {label:<10}",
        subsequent_indent="            ",
        break_on_hyphens=False,
    )


def _occupancy_lines(occ: dict | None) -> list[str]:
    if occ is None:
        return []
    k, d = occ["kernel"], occ["data_parallel"]
    return [
        f"  occupancy built kernel {k.blocks} block(s)/SM resident ({k.active_warps}/"
        f"{k.max_warps} warps, {k.limiter} limit); data-parallel kernel {d.blocks} "
        f"({d.active_warps}/{d.max_warps} warps)"
    ]


def _gpu_lines(gpu: str | None, roofline: float | None, unpriced: str | None) -> list[str]:
    if unpriced is not None:
        return [f"  gpu       not priced, predictions in units: {unpriced}"]
    if gpu is None:
        return []
    floor = "" if roofline is None else f"; roofline {roofline:.3g} us (predicted floor)"
    return [f"  gpu       {gpu} (published specifications{floor})"]


def slots(p: Plan) -> int | None:
    return None if p.num_sms is None else p.num_sms * p.blocks_per_sm


def _stats_dict(s: PlanStats) -> dict[str, Any]:
    d = dataclasses.asdict(s)
    d["iterations_per_block"] = list(s.iterations_per_block)
    d["segments_per_block"] = list(s.segments_per_block)
    return d


_ROW_NAMES = (
    "grid (blocks)",
    "waves",
    "iterations per block",
    "tiles per block",
    "split tiles",
    "blocks per split tile (max)",
    "workspace bytes",
    "zeroed bytes (prologue)",
    "predicted time (units)",
    "predicted speed-up",
)
_PRICED_ROW = "predicted time (us)"


def _column(s: PlanStats, speedup: float | None, priced: bool = False) -> tuple[str, ...]:
    """The cells of one plan's column of the report, in the order of :data:`_ROW_NAMES` (with
    :data:`_PRICED_ROW` before the speed-up when ``priced``)."""
    us = ("-" if s.predicted_us is None else f"{s.predicted_us:.3g}",) if priced else ()
    return (
        s.label,
        str(s.grid),
        _or_dash(s.waves),
        _span(s.iterations_per_block),
        _span(s.segments_per_block),
        str(s.split_tiles),
        str(s.max_peers) if s.split_tiles else "-",
        _bytes(s.workspace_bytes),
        _bytes(s.zeroed_bytes),
        "-" if s.predicted_units is None else f"{s.predicted_units:.0f}",
        *us,
        "-" if speedup is None else f"{speedup:.2f}x",
    )


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def _span(pair: tuple[int, int]) -> str:
    lo, hi = pair
    return str(lo) if lo == hi else f"{lo} - {hi}"


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n:,} B"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"

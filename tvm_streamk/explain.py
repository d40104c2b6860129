"""A readable report of a Stream-K decomposition, beside the data-parallel kernel it replaces.

:func:`explain` takes a :class:`~tvm_streamk.decomposition.Plan`, or a schedule whose reduction
block carries a decision of :func:`tvm_streamk.stream_k`, and reports what the kernel will do:
the grid and its waves, how evenly the iterations spread over blocks, which tiles are split and
between how many blocks, the extra memory the fix-up needs, and the time the cost model predicts
relative to data-parallel. It only reads: nothing is built or run.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import tirx

from . import annotations as ann
from . import cost_model, decomposition, ptxas, resources
from ._compat import SBlockRealize, structural_map
from .analysis import StreamKSite, analyze, blocks_under, find_block_path
from .decomposition import Plan
from .transform import fixup as fixups
from .transform.lower_stream_k import plan_for

__all__ = ["ExplainError", "Explanation", "PlanStats", "explain", "workspace_slots"]

FIXUPS = cost_model.FIXUPS
# The workspace fix-up counts arrivals at each tile in one int32.


class ExplainError(ValueError):
    """:func:`explain` was given something it cannot report on.

    The message says what was expected, what was found and what to do.
    """


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
        How split tiles are merged: ``"atomic"`` or ``"workspace"``.
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

    @property
    def slots(self) -> int | None:
        """Blocks resident at once, ``num_sms * blocks_per_sm`` (None without an SM count)."""
        return _slots(self.plan)

    @property
    def speedup(self) -> float | None:
        """Predicted data-parallel time over the plan's (above 1: the plan is faster)."""
        ours, theirs = self.stats.predicted_units, self.baseline_stats.predicted_units
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
            ``"plan"`` and ``"data_parallel"`` hold the :class:`PlanStats` of each as dicts.
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
        lines = [
            f"Stream-K decomposition{where}",
            f"  work      {_count(p.tiles, 'tile')}{tile} x {_count(p.panels, 'K-panel')} = "
            f"{_count(p.iterations, 'iteration')}",
            f"  device    {device}",
            f"  policy    {self.stats.label}",
            *textwrap.wrap(
                p.reason or "no reason recorded",
                width=96,
                initial_indent="  why       ",
                subsequent_indent="            ",
                break_on_hyphens=False,
            ),
            f"  fixup     {self.fixup}",
            *_occupancy_lines(self.occupancy),
            "",
        ]
        ours = _column(self.stats, self.speedup)
        base = _column(self.baseline_stats, None if self.speedup is None else 1.0)
        cells = list(zip(("", *_ROW_NAMES), ours, base))
        w0 = max(len(a) for a, _, _ in cells)
        w1 = max(len(b) for _, b, _ in cells)
        w2 = max(len(c) for _, _, c in cells)
        lines += [f"  {a:<{w0}}  {b:>{w1}}  {c:>{w2}}".rstrip() for a, b, c in cells]
        if self.stats.workspace_bytes is None:
            lines.append("  (byte counts need the tile shape: pass tile_shape=)")
        return "\n".join(lines)


def explain(
    sch_or_plan,
    *,
    tile_shape: tuple[int, ...] | None = None,
    fixup: str | None = None,
    block: str | None = None,
    num_sms: int | None = None,
    accumulator_bytes: int | None = None,
    output_bytes: int | None = None,
    target=None,
    print_: bool = True,
) -> Explanation:
    """Report what a Stream-K decomposition does, beside data-parallel for the same work.

    Parameters
    ----------
    sch_or_plan : Plan, tvm.s_tir.Schedule, IRModule or PrimFunc
        A plan from :func:`tvm_streamk.plan` or :func:`tvm_streamk.stream_k`, or a kernel whose
        reduction block carries a decision of :func:`tvm_streamk.stream_k` (read back from its
        annotations, then analysed for the tile band, panels and tile shape).
    tile_shape : tuple of int, optional
        Output elements per tile along each output axis, e.g. ``(128, 128)``; needed for the byte
        counts of a bare plan. For a kernel it is read from the write-back and this overrides it.
    fixup : str, optional
        ``"atomic"`` or ``"workspace"``. For a kernel, the recorded one (passing another raises);
        for a plan, ``"atomic"`` by default.
    block : str, optional
        The annotated block to explain when a kernel has several.
    num_sms : int, optional
        The SM count, for a decision recorded with ``num_sms`` read at run time (0).
    accumulator_bytes, output_bytes : int, optional
        Bytes per element of the accumulator and of the output; read from a kernel's buffers,
        4 (float32) by default for a plan.
    target : Target or str, optional
        For a kernel: a CUDA target to build it for (nvcc needed). The report then gives the
        resident blocks per SM of the built Stream-K and data-parallel kernels
        (:mod:`tvm_streamk.resources`), sizes the baseline by the latter's and lets the
        model's SMs run at their occupancy.
    print_ : bool
        Print the report as well as returning it.

    Returns
    -------
    Explanation

    Raises
    ------
    ExplainError
        When nothing carries a decision, several blocks do and ``block`` is not given, or an
        argument contradicts the kernel.
    StreamKError
        When the annotated kernel no longer meets a precondition of the rewrite.

    Examples
    --------
    >>> from tvm_streamk import plan
    >>> e = explain(plan(3, 4, num_sms=2, policy="stream_k"), tile_shape=(32, 32), print_=False)
    >>> e.stats.grid, e.stats.split_tiles, e.stats.zeroed_bytes, e.baseline_stats.waves
    (2, 1, 4096, 2)
    """
    if isinstance(sch_or_plan, Plan):
        if block is not None or num_sms is not None or target is not None:
            raise ExplainError(
                "block=, num_sms= and target= apply to kernels; found them with a Plan, which "
                "already fixes the first two (build another plan with tvm_streamk.plan instead)"
            )
        fixup = "atomic" if fixup is None else fixup
        result = _explanation(
            sch_or_plan,
            fixup,
            _tile_shape(tile_shape),
            4 if accumulator_bytes is None else accumulator_bytes,
            4 if output_bytes is None else output_bytes,
        )
    else:
        result = _from_kernel(
            sch_or_plan,
            tile_shape=_tile_shape(tile_shape),
            fixup=fixup,
            block=block,
            num_sms=num_sms,
            accumulator_bytes=accumulator_bytes,
            output_bytes=output_bytes,
            target=target,
        )
    if print_:
        print(result)
    return result


def _tile_shape(shape) -> tuple[int, ...] | None:
    if shape is None:
        return None
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise ExplainError(
            f"tile_shape must be a non-empty tuple of positive ints, found {shape!r}; pass e.g. "
            "(128, 128)"
        )
    return dims


def _occupancy_lines(occ: dict | None) -> list[str]:
    if occ is None:
        return []
    k, d = occ["kernel"], occ["data_parallel"]
    return [
        f"  occupancy built kernel {k.blocks} block(s)/SM resident ({k.active_warps}/"
        f"{k.max_warps} warps, {k.limiter} limit); data-parallel kernel {d.blocks} "
        f"({d.active_warps}/{d.max_warps} warps)"
    ]


def _slots(p: Plan) -> int | None:
    return None if p.num_sms is None else p.num_sms * p.blocks_per_sm


def workspace_slots(p: Plan) -> int:
    """Partial-tile slots the workspace fix-up allocates for ``p``: :attr:`Plan.workspace_slots`."""
    return p.workspace_slots


def _stats(p: Plan, fixup: str, tile_elems, acc_bytes: int, out_bytes: int, saturation=None):
    slots = _slots(p)
    iterations = p.iterations_per_block
    segments = [len(w) for w in p.work]
    workspace = zeroed = None
    if tile_elems is not None:
        need = fixups.footprint(p, fixup, tile_elems, acc_bytes, out_bytes)
        workspace, zeroed = need.workspace_bytes, need.zeroed_bytes
    predicted = None
    if slots is not None:
        predicted = cost_model.predicted_time(p, fixup=fixup, saturation=saturation)
    return PlanStats(
        label=p.label,
        grid=p.grid,
        waves=None if slots is None else -(-p.grid // slots),
        iterations_per_block=(min(iterations), max(iterations)),
        segments_per_block=(min(segments), max(segments)),
        split_tiles=len(p.split_tiles),
        max_peers=p.max_peers,
        workspace_slots=workspace_slots(p),
        workspace_bytes=workspace,
        zeroed_bytes=zeroed,
        predicted_units=predicted,
    )


def _explanation(
    p: Plan,
    fixup: str,
    tile_shape: tuple[int, ...] | None,
    acc_bytes: int,
    out_bytes: int,
    function: str | None = None,
    block: str | None = None,
    occupancy: dict | None = None,
) -> Explanation:
    if fixup not in FIXUPS:
        raise ExplainError(f"fixup must be one of {list(FIXUPS)}, found {fixup!r}")
    for name, value in (("accumulator_bytes", acc_bytes), ("output_bytes", out_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ExplainError(f"{name} must be a positive int, found {value!r}")
    dp_bps, busy = p.blocks_per_sm, None
    if occupancy is not None:
        dp = occupancy["data_parallel"]
        dp_bps, busy = dp.blocks, cost_model.saturation(dp.warps_per_block, dp.blocks)
    baseline = decomposition.plan(
        p.tiles, p.panels, p.num_sms, blocks_per_sm=dp_bps, policy="data_parallel"
    )
    tile_elems = None if tile_shape is None else math.prod(tile_shape)
    return Explanation(
        plan=p,
        baseline=baseline,
        stats=_stats(p, fixup, tile_elems, acc_bytes, out_bytes, busy),
        baseline_stats=_stats(baseline, fixup, tile_elems, acc_bytes, out_bytes, busy),
        fixup=fixup,
        tile_shape=tile_shape,
        accumulator_bytes=acc_bytes,
        output_bytes=out_bytes,
        function=function,
        block=block,
        occupancy=occupancy,
    )


def _functions(obj) -> list[tuple[str, tirx.PrimFunc]]:
    if hasattr(obj, "mod") and hasattr(obj, "trace"):
        obj = obj.mod
    if isinstance(obj, tirx.PrimFunc):
        return [("main", obj)]
    if isinstance(obj, tvm.IRModule):
        return [
            (gv.name_hint, f) for gv, f in obj.functions.items() if isinstance(f, tirx.PrimFunc)
        ]
    raise ExplainError(
        "explain takes a Plan, a tvm.s_tir.Schedule, an IRModule or a PrimFunc; found "
        f"{type(obj).__name__}"
    )


def _occupancy_of(mod: tvm.IRModule, target) -> dict:
    """The built Stream-K and data-parallel kernels' occupancy for a CUDA ``target``."""
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    try:
        _, kernel = resources.resident_blocks(mod, target, "tvm_streamk")
        _, dp = resources.resident_blocks(ann.without_decisions(mod), target)
    except (ValueError, ptxas.PtxasError) as err:
        raise ExplainError(f"cannot count resident blocks for target {target}: {err}") from None
    return {"kernel": kernel, "data_parallel": dp}


def _from_kernel(
    obj, *, tile_shape, fixup, block, num_sms, accumulator_bytes, output_bytes, target=None
):
    annotated = [
        (name, func, b.name_hint)
        for name, func in _functions(obj)
        for b in blocks_under(func.body)
        if ann.has_decision(b.annotations)
    ]
    if block is not None:
        annotated = [a for a in annotated if a[2] == block]
    if not annotated:
        which = "" if block is None else f" named {block!r}"
        raise ExplainError(
            f"no block{which} carries a Stream-K decision; call tvm_streamk.stream_k(sch, block, "
            "...) first, or pass a Plan"
        )
    if len(annotated) > 1:
        names = [f"{fn}:{b}" for fn, _, b in annotated]
        raise ExplainError(
            f"several blocks carry a Stream-K decision ({names}); pass block= to pick one"
        )
    func_name, func, block_name = annotated[0]
    site = analyze(func, block_name)
    decision = ann.decode(site.block.annotations, block_name)
    if fixup is not None and fixup != decision.fixup:
        raise ExplainError(
            f"block {block_name!r} records fixup={decision.fixup!r}, found fixup={fixup!r}; drop "
            "fixup= for a kernel"
        )
    if decision.num_sms in (ann.DEVICE_SMS, ann.TARGET_SMS):
        if num_sms is None:
            when = (
                "on the device at run time"
                if decision.num_sms == ann.DEVICE_SMS
                else "from the target it is compiled for"
            )
            raise ExplainError(
                f"block {block_name!r} takes its SM count {when}; pass num_sms= (e.g. "
                "tvm_streamk.device.num_sms(device)) to explain it"
            )
        decision = dataclasses.replace(decision, num_sms=num_sms)
    elif num_sms is not None and num_sms != decision.num_sms:
        raise ExplainError(
            f"block {block_name!r} records num_sms={decision.num_sms}, found num_sms={num_sms}; "
            "drop num_sms= for a kernel with a fixed SM count"
        )
    # The decision records a concrete policy, so the plan rebuilt from it has no reason of its
    # own. When the cost model picks the same plan today, its reasoning is the likely origin.
    p = plan_for(site, decision)
    reason = "recorded on the block by tvm_streamk.stream_k"
    try:
        model = decomposition.plan(
            p.tiles,
            p.panels,
            decision.num_sms,
            decision.blocks_per_sm,
            "heuristic",
            fixup=decision.fixup,
        )
    except ValueError:
        model = None
    if model is not None and (model.policy, model.grid, model.splits, model.variant) == (
        p.policy,
        p.grid,
        p.splits,
        p.variant,
    ):
        reason = f"{reason}; the cost model agrees: {model.reason}"
    p = dataclasses.replace(p, reason=reason)
    output = site.writebacks[0].output
    occupancy = None
    if target is not None:
        occupancy = _occupancy_of(tvm.IRModule({tvm.ir.GlobalVar(func_name): func}), target)
    return _explanation(
        p,
        decision.fixup,
        tile_shape if tile_shape is not None else writeback_tile_shape(func, site),
        accumulator_bytes or _dtype_bytes(site.accumulator_dtype),
        output_bytes or _dtype_bytes(str(output.dtype)),
        function=func_name,
        block=block_name,
        occupancy=occupancy,
    )


def _dtype_bytes(dtype: str) -> int:
    return max(1, tvm.runtime.DataType(dtype).bits // 8)


def writeback_tile_shape(func: tirx.PrimFunc, site: StreamKSite) -> tuple[int, ...] | None:
    """Output elements one tile writes along each output axis, from the first write-back block.

    Each index of the write-back's store is bounded over the loops between the tile band and the
    block, with the band's loop variables left symbolic; the extent of that bound is the tile's
    size along the axis. None when an extent is not a constant (a non-affine write-back).

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
    shape = []
    for index in writeback.body.indices:
        bound = structural_map(index, (tirx.Var, lambda v: bindings.get(v, v)))
        interval = analyzer.int_set(bound, domain)
        extent = analyzer.simplify(interval.max_value - interval.min_value + 1)
        if not isinstance(extent, tirx.IntImm):
            return None
        shape.append(int(extent.value))
    return tuple(shape)


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


def _column(s: PlanStats, speedup: float | None) -> tuple[str, ...]:
    """The cells of one plan's column of the report, in the order of :data:`_ROW_NAMES`."""
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

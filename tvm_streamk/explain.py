"""A readable report of a Stream-K decomposition, beside the data-parallel kernel it replaces.

:func:`explain` takes a :class:`~tvm_streamk.decomposition.Plan`, or a schedule whose reduction
block carries a decision of :func:`tvm_streamk.stream_k`, and reports what the kernel will do:
the grid and its waves, how evenly the iterations spread over blocks, which tiles are split and
between how many blocks, the extra memory the fix-up needs, and the time the cost model predicts
relative to data-parallel. It only reads, unless given a CUDA ``target``: then it builds the
kernel and its data-parallel twin to count their resident blocks per SM. The report itself is
:class:`~tvm_streamk.report.Explanation`.
"""

from __future__ import annotations

import dataclasses
import math

import tvm
from tvm import tirx

from . import cost_model, decomposition, fixup_registry, ptxas, resources
from .analysis import analyze, blocks_under, writeback_tile_shape
from .cost_model import ragged as ragged_cost
from .decision import planned_site, record, resolve
from .decomposition import Plan, chunks
from .report import Explanation, PlanStats
from .report import slots as _slots

__all__ = ["ExplainError", "Explanation", "PlanStats", "explain", "workspace_slots"]

# The workspace fix-up counts arrivals at each tile in one int32.


class ExplainError(ValueError):
    """:func:`explain` was given something it cannot report on.

    The message says what was expected, what was found and what to do.
    """


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
    sizes: dict[str, int] | None = None,
    gpu: str | None = None,
    cost: cost_model.CostParams | None = None,
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
        A registered fix-up (``"atomic"``, ``"workspace"``, ``"separate"``). For a kernel, the
        recorded one (passing another raises); for a plan, ``"atomic"`` by default.
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
    sizes : dict, optional
        For a dynamic-shape kernel (a tile count known only at run time), the values of its
        shape variables by name to explain it at, e.g. ``sizes={"m": 100}``.
    gpu : str, optional
        For a kernel: a GPU of :data:`tvm_streamk.cost_model.GPU_SPECS` to predict times on in
        microseconds (the kernel's tile, panels and dtypes priced there); ``target``'s tag by
        default.
    cost : CostParams, optional
        For a plan: the model's constants, e.g. a kernel priced on a GPU with
        :func:`tvm_streamk.cost_model.priced`; the units model by default.
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
    if cost is not None and not isinstance(cost, cost_model.CostParams):
        raise ExplainError(
            f"cost must be a tvm_streamk.cost_model.CostParams, found {type(cost).__name__}"
        )
    if isinstance(sch_or_plan, Plan):
        kernel_only = (block, num_sms, target, sizes, gpu)
        if any(v is not None for v in kernel_only):
            raise ExplainError(
                "block=, num_sms=, target=, sizes= and gpu= apply to kernels; found them with a "
                "Plan, which already fixes the first two (build another plan with "
                "tvm_streamk.plan instead; price a plan with cost=)"
            )
        fixup = "atomic" if fixup is None else fixup
        result = _explanation(
            sch_or_plan,
            fixup,
            _tile_shape(tile_shape),
            4 if accumulator_bytes is None else accumulator_bytes,
            4 if output_bytes is None else output_bytes,
            cost=cost,
        )
    else:
        if cost is not None:
            raise ExplainError(
                "cost= applies to a Plan; a kernel is priced from its own tile, panels and "
                "dtypes: pass gpu= (a name of tvm_streamk.cost_model.GPU_SPECS) instead"
            )
        result = _from_kernel(
            sch_or_plan,
            tile_shape=_tile_shape(tile_shape),
            fixup=fixup,
            block=block,
            num_sms=num_sms,
            accumulator_bytes=accumulator_bytes,
            output_bytes=output_bytes,
            target=target,
            sizes=sizes,
            gpu=gpu,
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


def workspace_slots(p: Plan) -> int:
    """Partial-tile slots the workspace fix-up allocates for ``p``: :attr:`Plan.workspace_slots`."""
    return p.workspace_slots


def _stats(
    p: Plan, fixup: str, tile_elems, acc_bytes: int, out_bytes: int, saturation=None, cost=None
):
    slots = _slots(p)
    iterations = p.iterations_per_block
    segments = [len(w) for w in p.work]
    workspace = zeroed = None
    if tile_elems is not None:
        need = fixup_registry.footprint(p, fixup, tile_elems, acc_bytes, out_bytes)
        workspace, zeroed = need.workspace_bytes, need.zeroed_bytes
    predicted = predicted_us = None
    if slots is not None:
        # In units: the default constants, merging chunks as the kernel's cost says.
        merges = cost is not None and cost.chunk_merges
        units = dataclasses.replace(cost_model.DEFAULT_COST, chunk_merges=merges)
        predicted = cost_model.predicted_time(p, cost=units, fixup=fixup, saturation=saturation)
        if cost is not None and cost.price is not None:
            predicted_us = cost_model.predicted_time(
                p, cost=cost, fixup=fixup, saturation=saturation
            )
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
        predicted_us=predicted_us,
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
    cost: cost_model.CostParams | None = None,
    unpriced: str | None = None,
) -> Explanation:
    if fixup not in fixup_registry.names():
        raise ExplainError(f"fixup must be one of {list(fixup_registry.names())}, found {fixup!r}")
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
    price = None if cost is None else cost.price
    return Explanation(
        plan=p,
        baseline=baseline,
        stats=_stats(p, fixup, tile_elems, acc_bytes, out_bytes, busy, cost),
        baseline_stats=_stats(baseline, fixup, tile_elems, acc_bytes, out_bytes, busy, cost),
        fixup=fixup,
        tile_shape=tile_shape,
        accumulator_bytes=acc_bytes,
        output_bytes=out_bytes,
        function=function,
        block=block,
        occupancy=occupancy,
        gpu=None if price is None else price.spec.name,
        roofline_us=None if price is None else price.floor_us(p.tiles),
        unpriced=unpriced,
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
        _, dp = resources.resident_blocks(record.without_decisions(mod), target, "tvm_streamk")
    except (ValueError, ptxas.PtxasError) as err:
        raise ExplainError(f"cannot count resident blocks for target {target}: {err}") from None
    return {"kernel": kernel, "data_parallel": dp}


def _from_kernel(
    obj,
    *,
    tile_shape,
    fixup,
    block,
    num_sms,
    accumulator_bytes,
    output_bytes,
    target=None,
    sizes=None,
    gpu=None,
):
    annotated = [
        (name, func, b.name_hint)
        for name, func in _functions(obj)
        for b in blocks_under(func.body)
        if record.has_decision(b.annotations)
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
    decision = record.decode(site.block.annotations, block_name)
    if fixup is not None and fixup != decision.fixup:
        raise ExplainError(
            f"block {block_name!r} records fixup={decision.fixup!r}, found fixup={fixup!r}; drop "
            "fixup= for a kernel"
        )
    if decision.num_sms in (record.DEVICE_SMS, record.TARGET_SMS):
        if num_sms is None:
            when = (
                "on the device at run time"
                if decision.num_sms == record.DEVICE_SMS
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
    if site.ragged is not None and sizes is None:
        raise ExplainError(
            f"block {block_name!r} is a grouped GEMM, whose tile count the kernel reads from "
            f"its group offsets; pass sizes={{'group_rows': [...]}} (the rows of each of its "
            f"{site.ragged.groups} groups) to explain it at one routing"
        )
    if site.runtime_tiles and sizes is None:
        raise ExplainError(
            f"block {block_name!r} has a tile count known only at run time "
            f"({site.tile_count}); pass sizes= (its shape variables by name, e.g. "
            "sizes={'m': 100}) to explain it at one size"
        )
    p = resolve(site, decision, sizes=sizes)
    if site.ragged is not None and site.ragged.reduction and not p.scheme.is_original:
        return _ragged_explanation(
            func_name, func, block_name, site, decision, p, sizes, tile_shape, gpu, target
        )
    reason = "recorded on the block by tvm_streamk.stream_k"
    if site.runtime_tiles:
        reason += f" for a run-time tile count, here {p.tiles} at {sizes}"
        if p.reason != "requested":
            reason += f" ({p.reason})"
    if gpu is not None and cost_model.spec_for(gpu) is None:
        raise ExplainError(
            f"gpu={gpu!r} is not in tvm_streamk.cost_model.GPU_SPECS; pass one of "
            f"{sorted(cost_model.GPU_SPECS)}"
        )
    invariant = None
    if decision.chunk:
        invariant = _invariance(site, decision, p, sizes, gpu if gpu is not None else target)
    # Priced as planned: a batch-invariant kernel per chunk, every chunk merged.
    site = planned_site(site, decision)
    priced_on = gpu if gpu is not None else _as_target(target)
    # With why the GPU or target named gives no microseconds (None where it does, or none is
    # named).
    cost, unpriced = cost_model.costing(site, priced_on, decision.fixup)
    model = _heuristic(p.tiles, p.panels, decision.num_sms, decision.blocks_per_sm, cost, decision)
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
    result = _explanation(
        p,
        decision.fixup,
        tile_shape if tile_shape is not None else writeback_tile_shape(func, site),
        accumulator_bytes or _dtype_bytes(site.accumulator_dtype),
        output_bytes or _dtype_bytes(str(output.dtype)),
        function=func_name,
        block=block_name,
        occupancy=occupancy,
        cost=cost,
        unpriced=unpriced,
    )
    if invariant is None:
        return result
    if site.chunk and result.tile_shape is not None:
        # Every chunk of every tile has a slot: the plan's own footprint does not show it.
        need = fixup_registry.get(decision.fixup).chunk_footprint(
            p.tiles, p.panels, math.prod(result.tile_shape), result.accumulator_bytes
        )
        stats = dataclasses.replace(
            result.stats,
            workspace_slots=p.tiles * p.panels if p.panels > 1 else 0,
            workspace_bytes=need.workspace_bytes,
            zeroed_bytes=need.zeroed_bytes,
        )
        baseline = dataclasses.replace(
            result.baseline_stats,
            workspace_slots=stats.workspace_slots,
            workspace_bytes=need.workspace_bytes,
            zeroed_bytes=need.zeroed_bytes,
        )
        result = dataclasses.replace(result, stats=stats, baseline_stats=baseline)
    return dataclasses.replace(result, invariance=invariant)


def _ragged_explanation(
    func_name, func, block_name, site, decision, p, sizes, tile_shape, gpu, target
) -> Explanation:
    """A ragged reduction's report at the routing ``sizes`` gives: its Stream-K walk priced
    tile by tile (:mod:`tvm_streamk.cost_model.ragged`), beside the kernel as written (a block
    per tile over the panels of every token) and a data-parallel kernel over each tile's own
    panels."""
    space = site.ragged
    rows = sizes["group_rows"]
    panels = ragged_cost.tile_panels(rows, space.tokens_per_panel, space.others)
    extent = site.panel_loop.extent
    bound = (
        int(extent) if isinstance(extent, tirx.IntImm) else -(-sum(rows) // space.tokens_per_panel)
    )
    ragged = ragged_cost.plans(panels, bound, decision.num_sms, decision.blocks_per_sm)
    cost = cost_model.cost_for(site, gpu if gpu is not None else _as_target(target), decision.fixup)
    times = ragged_cost.predicted_times(
        ragged, decision.num_sms, decision.blocks_per_sm, cost_model.DEFAULT_COST, decision.fixup
    )
    priced = None
    if cost.price is not None:
        priced = ragged_cost.predicted_times(
            ragged, decision.num_sms, decision.blocks_per_sm, cost, decision.fixup
        )
    shape = tile_shape if tile_shape is not None else writeback_tile_shape(func, site)
    tile_elems = None if shape is None else math.prod(shape)
    acc = _dtype_bytes(site.accumulator_dtype)
    out = _dtype_bytes(str(site.writebacks[0].output.dtype))

    def stats(name: str, label: str) -> PlanStats:
        rp = ragged[name]
        need = None
        if tile_elems is not None:
            need = fixup_registry.footprint(rp, decision.fixup, tile_elems, acc, out, rp.grid)
        segments = [len(w) for w in rp.work]
        iterations = rp.iterations_per_block
        slots = decision.num_sms * decision.blocks_per_sm
        return PlanStats(
            label=label,
            grid=rp.grid,
            waves=-(-rp.grid // slots),
            iterations_per_block=(min(iterations), max(iterations)),
            segments_per_block=(min(segments), max(segments)),
            split_tiles=len(rp.split_tiles),
            max_peers=rp.max_peers,
            workspace_slots=rp.workspace_slots,
            workspace_bytes=None if need is None else need.workspace_bytes,
            zeroed_bytes=None if need is None else need.zeroed_bytes,
            predicted_units=times[name],
            predicted_us=None if priced is None else priced[name],
        )

    group_panels = ragged_cost.tile_panels(rows, space.tokens_per_panel, 1)
    per_tile = ragged_cost.predicted_times(
        {"data_parallel_per_tile": ragged["data_parallel_per_tile"]},
        decision.num_sms,
        decision.blocks_per_sm,
        cost if priced is not None else cost_model.DEFAULT_COST,
        decision.fixup,
    )["data_parallel_per_tile"]
    unit = "us" if priced is not None else "units"
    note = (
        f"{space.groups} groups x {space.others} tiles, K-panels per group {group_panels} "
        f"({space.tokens_per_panel} tokens each) = {sum(panels)} iterations; the baseline is the "
        f"kernel as written, every tile over all {bound} panels; a data-parallel kernel over "
        f"each tile's own panels is predicted {per_tile:.4g} {unit}"
    )
    baseline = decomposition.plan(
        space.real_tiles, max(bound, 1), decision.num_sms, decision.blocks_per_sm, "data_parallel"
    )
    reason = f"recorded on the block by tvm_streamk.stream_k; {p.reason}"
    return Explanation(
        plan=dataclasses.replace(p, reason=reason),
        baseline=baseline,
        stats=stats("stream_k", p.label),
        baseline_stats=stats("data_parallel", "data_parallel"),
        fixup=decision.fixup,
        tile_shape=shape,
        accumulator_bytes=acc,
        output_bytes=out,
        function=func_name,
        block=block_name,
        gpu=None if cost.price is None else cost.price.spec.name,
        ragged=note,
    )


def _heuristic(tiles, panels, num_sms, blocks_per_sm, cost, decision) -> Plan | None:
    """The cost model's choice for the work (None where it has none)."""
    try:
        return decomposition.plan(
            tiles, panels, num_sms, blocks_per_sm, "heuristic", cost=cost, fixup=decision.fixup
        )
    except ValueError:
        return None


def _invariance(site, decision, p: Plan, sizes, target) -> str:
    """The line ``explain`` gives a batch-invariant kernel: its chunk grid, its predicted time
    and the time of what the heuristic picks for the same kernel without the mode (the cost
    model's figures): the price of the mode."""
    count = chunks.chunk_count(site.kernel_panels, decision.chunk)
    text = (
        f"batch-invariant: K in {count} chunk(s) of {decision.chunk} K-panels, each summed from "
        "zero; every tile's chunks merged in chunk order through the workspace"
    )
    if p.num_sms is None or site.runtime_tiles and sizes is None:
        return text
    target = target if isinstance(target, str) else _as_target(target)
    ours = cost_model.predicted_time(
        p,
        cost=cost_model.cost_for(planned_site(site, decision), target, decision.fixup),
        fixup=decision.fixup,
    )
    cost = cost_model.cost_for(site, target, decision.fixup)
    tiles = site.tiles_at(sizes) if site.runtime_tiles else site.tiles
    without = _heuristic(tiles, site.kernel_panels, p.num_sms, p.blocks_per_sm, cost, decision)
    if without is None:
        return text
    theirs = cost_model.predicted_time(without, cost=cost, fixup=decision.fixup)
    return (
        f"{text}; predicted {ours:.3g} {cost.unit} against {theirs:.3g} for {without.label}, "
        f"the heuristic's choice without the mode ({ours / theirs - 1:+.0%})"
    )


def _as_target(target):
    if target is None or isinstance(target, tvm.target.Target):
        return target
    return tvm.target.Target(target)


def _dtype_bytes(dtype: str) -> int:
    return max(1, tvm.runtime.DataType(dtype).bits // 8)

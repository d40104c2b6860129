"""From what a caller asks to a concrete decision: fix-up, SM count, policy and plan.

:func:`decide` resolves a :class:`Request` (whose policy may be a chooser such as
``"heuristic"``, whose fix-up may be ``"auto"``, whose SM count may be left to the device or
the compile target) into a :class:`~.record.Decision` for a given number of resident blocks,
then passes it through :func:`~.check.check`, the one check every entry point shares.
Refusals that depend on the choice come after it: a chooser with a fix-up the site cannot use
keeps to plans that split no tile, instead of refusing before it has chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import tvm

from .. import cost_model, decomposition, fixup_registry, gpus
from ..decomposition import chunks
from ..decomposition import policy as policies
from ..errors import StreamKError
from ..run_time_choice import StreamKOrDataParallel, describe, stream_k_buckets
from . import rules
from .check import check
from .record import DEVICE_SMS, TARGET_SMS, Decision
from .resolve import counts_chunks, resolve

COND_NUM_SMS = "num-sms"
COND_KNOB = "knob"


PTXAS = "ptxas"
"""``blocks_per_sm=PTXAS``: size the grid by ptxas's count of the built kernel's registers."""


@dataclass(frozen=True)
class Request:
    """The knobs of :func:`tvm_streamk.stream_k`, as given (see its docstring)."""

    num_sms: int | str | None = None
    blocks_per_sm: int | str | None = None
    fixup: str = fixup_registry.AUTO
    deterministic: bool = False
    policy: str = "stream_k"
    splits: int | None = None
    variant: str | None = None
    group: int | None = None
    batch_invariant: bool = False


def validate(request: Request) -> None:
    """Refuse knobs that are wrong whatever the kernel (what ``stream_k`` checks before it
    looks at the schedule)."""
    if request.fixup != fixup_registry.AUTO:
        fixup = fixup_registry.get(request.fixup)
        if request.deterministic and not fixup.deterministic:
            raise StreamKError(
                "fixup",
                f"deterministic=True with fixup={request.fixup!r}",
                "Its merges depend on arrival order; use a deterministic fix-up "
                f"({[n for n in fixup_registry.names() if fixup_registry.get(n).deterministic]}) "
                "or 'auto'.",
            )
    if request.batch_invariant and request.fixup != fixup_registry.AUTO:
        rules.check_batch_invariant_fixup(request.fixup)
    bps = request.blocks_per_sm
    if (
        bps is not None
        and bps != PTXAS
        and (isinstance(bps, bool) or not isinstance(bps, int) or bps < 1)
    ):
        raise StreamKError(
            "blocks_per_sm",
            f"blocks_per_sm={bps!r}",
            f"Pass a positive int, {PTXAS!r} (count the built kernel's registers with nvcc), "
            "or None (estimate them from the IR).",
        )
    if request.group is not None and (not isinstance(request.group, int) or request.group < 1):
        raise StreamKError("group", f"group={request.group!r}", "Pass a positive int, or None.")
    try:
        decomposition.check_policy_args(request.policy, request.splits, request.variant)
    except decomposition.DecompositionError as err:
        raise StreamKError.stated(COND_KNOB, str(err)) from None


@dataclass(frozen=True)
class SmCount:
    """The SM count a decision plans for now (``planned``), and what it records (``recorded``:
    the count itself, :data:`~.record.DEVICE_SMS` or :data:`~.record.TARGET_SMS`)."""

    planned: int
    recorded: int

    @property
    def deferred(self) -> bool:
        return self.recorded in (DEVICE_SMS, TARGET_SMS)


def sm_count(request: Request, site, target: tvm.target.Target | None) -> SmCount:
    """The SM count of ``request`` on ``target``.

    With no count and no target the table knows, a concrete policy's decision (not a
    fragment's, whose aligned split is chosen now) is left to the target the module is
    compiled for; ``"device"`` reads it at run time. Both plan for one SM now: the lowering
    evaluates the same closed forms on the run-time grid, or plans again for the target.
    """
    if request.num_sms == "device":
        rules.check_runtime_grid(request.policy, site)
        return SmCount(1, DEVICE_SMS)
    try:
        count = gpus.num_sms_for_target(request.num_sms, target)
        return SmCount(count, count)
    except gpus.UnknownGPUError as err:
        deferrable = (
            request.num_sms is None
            and policies.chooser(request.policy) is None
            and not site.fragment_accumulator
            and (target is None or target.kind.name == "opencl")
        )
        if deferrable:
            return SmCount(1, TARGET_SMS)
        raise StreamKError.stated(COND_NUM_SMS, str(err)) from None


def fixup_for(request: Request, site, target) -> str:
    """The fix-up of ``request``: its own, or the registry's default for ``"auto"``."""
    if request.fixup != fixup_registry.AUTO:
        return request.fixup
    return fixup_registry.default(
        site, target, request.deterministic, batch_invariant=request.batch_invariant
    )


def decide(
    site,
    request: Request,
    target: tvm.target.Target | None,
    blocks_per_sm: int,
    dp_blocks_per_sm: int | None = None,
    warps_per_block: int | None = None,
) -> tuple[Decision, decomposition.Plan]:
    """The concrete decision and its plan for ``request`` on ``site`` with ``blocks_per_sm``
    resident blocks (``dp_blocks_per_sm`` and ``warps_per_block``: the data-parallel
    kernel's occupancy, when known, for a chooser's model).

    Raises
    ------
    StreamKError
        The first precondition the decision fails (:func:`~.check.check`).
    """
    validate(request)
    chunk = 0
    if request.batch_invariant:
        rules.check_invariant_ragged(site)
        # Every decomposition below plans over the chunk grid (decomposition.chunks); a
        # tensor-core fragment's is the aligned split of its own panels (_invariant_fragment).
        chunk = chunks.chunk_panels(site.kernel_panels)
        if counts_chunks(site, chunk):
            site = site.chunked(chunk)
    rules.check_one_panel_loop(site)
    rules.check_group(request.group, site)
    rules.check_ragged(site, request.policy, target)
    rules.check_runtime_tiles(site, request.policy, request.group)
    sms = sm_count(request, site, target)
    fixup = fixup_for(request, site, target)
    if request.fixup != fixup_registry.AUTO and policies.chooser(request.policy) is None:
        # A fix-up asked for by name with a policy asked for by name: refused whatever the
        # plan turns out to be. A chooser's choice comes first (_chosen).
        rules.check_fixup(site, fixup, target)
    if chunk and site.fragment_accumulator:
        decision, chosen = _invariant_fragment(site, request, sms, fixup, blocks_per_sm, chunk)
    elif _chooses(site, request):
        decision, chosen = _chosen(
            site, request, sms, fixup, target, blocks_per_sm, dp_blocks_per_sm, warps_per_block
        )
    else:
        # A concrete policy is planned by the check itself: the primitive refuses it with the
        # very message the lowering and MetaSchedule would.
        rule = policies.get(request.policy, request.variant)
        decision = Decision(
            policy=rule.name,
            variant=rule.variant,
            num_sms=sms.recorded,
            blocks_per_sm=blocks_per_sm,
            splits=request.splits if rule.takes_splits else 1,
            fixup=fixup,
            group=request.group or 0,
        )
        chosen = None
    decision = replace(decision, chunk=chunk)
    # A decision left to the compile target's count is checked as planned now (for one SM);
    # the lowering checks it again for the target's count.
    checked = replace(decision, num_sms=sms.planned) if sms.recorded == TARGET_SMS else decision
    plan = check(site, checked, target)
    chosen = plan if chosen is None else chosen
    if site.ragged is not None and site.ragged.reduction and not chosen.scheme.is_original:
        chosen = chosen.with_reason(
            "Stream-K over the ragged K of a grouped weight gradient: each tile has its group's "
            "panels, their iterations are counted on the device, and the persistent grid walks "
            "equal slices of them (the kernel as written runs every tile over the panels of "
            "all the tokens)"
        )
    elif site.ragged is not None and not chosen.scheme.is_original:
        chosen = chosen.with_reason(
            "Stream-K over the grouped GEMM's tiles: their count is known only on the device, "
            "so the grid is the persistent one and the kernel reads the count from the group "
            "offsets (the kernel as written launches a tile per group for the largest group's "
            "every row tile)"
        )
    if chosen.scheme.is_original and rules.walks_reserved_grid_z(site, target):
        chosen = chosen.with_reason(
            f"{chosen.reason}; one block per tile walked on blockIdx.x: the kernel as written "
            f"binds blockIdx.z, which {target.kind.name} reserves"
        )
    if chunk:
        count = chunks.chunk_count(site.kernel_panels, chunk)
        counted = "its aligned split" if site.fragment_accumulator else "the plan"
        chosen = chosen.with_reason(
            f"{chosen.reason}; batch-invariant: K in {count} chunk(s) of {chunk} panels, each "
            f"summed from zero and merged in chunk order ({counted} counts chunks)"
        )
    if decision.group and rules.takes_aligned_nest(chosen, counts_chunks(site, chunk), target):
        chosen = chosen.with_reason(
            f"{chosen.reason}; group={decision.group} not applied: the aligned split keeps the "
            "band's row-major tile order"
        )
    if sms.deferred:
        when = (
            "the run-time grid" if sms.recorded == DEVICE_SMS else "the compile target's SM count"
        )
        also = f"{chosen.reason}; " if site.runtime_tiles else ""
        chosen = chosen.with_reason(f"{also}planned for one SM: the kernel uses {when}")
    return decision, chosen


def _invariant_fragment(site, request: Request, sms, fixup, bps, chunk):
    """``(decision, plan)`` of a batch-invariant tensor-core fragment: the aligned split with
    one block per chunk (``S = n``; data-parallel for one chunk), the only decomposition that
    keeps the canonical order there (:func:`.rules.check_batch_invariant`). Asked for by a
    chooser or a policy that adapts to fragments, it is chosen; any other policy is taken as
    asked, and the check refuses it with the reason."""
    count = rules.fragment_chunks(site, chunk)
    rule = (
        policies.get(request.policy, request.variant)
        if not policies.chooser(request.policy)
        else None
    )
    adapts = rule is None or rule.aligned_for_fragments or rule.is_original
    if not adapts or rule is not None and rule.takes_splits and request.splits not in (None, count):
        taken = policies.get(request.policy, request.variant)
        splits = request.splits if taken.takes_splits and request.splits else 1
        policy, variant = taken.name, taken.variant
    else:
        policy = rules.original_policy() if count == 1 else rules.aligned_policy()
        splits, variant = count, None
    decision = Decision(
        policy=policy,
        variant=variant,
        num_sms=sms.recorded,
        blocks_per_sm=bps,
        splits=splits if policies.get(policy, variant).takes_splits else 1,
        fixup=fixup,
        group=request.group or 0,
        chunk=chunk,
    )
    return decision, None


def _chooses(site, request: Request) -> bool:
    """Whether the decision is chosen here rather than taken as asked: a chooser's, a
    fragment's aligned split for a policy that adapts to fragments, a grouped GEMM's walk."""
    if policies.chooser(request.policy) is not None:
        return True
    rule = policies.get(request.policy, request.variant)
    return bool(site.fragment_accumulator and rule.aligned_for_fragments and not site.runtime_tiles)


def _chosen(site, request, sms, fixup, target, bps, dp_bps, warps):
    """``(decision, plan)`` of a request whose plan is chosen (:func:`_chooses`). A chooser
    keeps every tile whole where the site cannot use the fix-up, or where the target's
    integers cannot hold the chosen plan's closed forms (a run-time tile count on WebGPU)."""
    keep_whole = None
    chooser = policies.chooser(request.policy) is not None
    if chooser:
        try:
            rules.check_fixup(site, fixup, target)
        except StreamKError as err:
            keep_whole = f"the fix-up cannot split a tile here ({err})"
    busy = None
    if dp_bps is not None and warps is not None:
        busy = cost_model.saturation(warps, dp_bps)
    # In microseconds on a GPU the model has a specification of, else in units.
    cost = cost_model.cost_for(site, target, fixup)
    try:
        chosen = _choose(site, request, sms, bps, fixup, dp_bps, busy, cost)
        if chooser and keep_whole is None and not chosen.scheme.is_original:
            try:
                rules.check_index_width(chosen, site, target)
            except StreamKError as err:
                keep_whole = f"the {target.kind.name} kernel's integers cannot walk it ({err})"
        if keep_whole is not None and not chosen.scheme.is_original:
            # Resolved as the check resolves it: a run-time tile count's too (a grouped GEMM's
            # with the separate fix-up, found by the workload fuzz: it stopped on the
            # compile-time count it does not have).
            kept = Decision(
                policy=rules.original_policy(),
                variant=None,
                num_sms=sms.recorded,
                splits=1,
                blocks_per_sm=dp_bps or bps,
                fixup=fixup,
                group=request.group or 0,
            )
            chosen = resolve(site, kept, target).with_reason(f"data-parallel: {keep_whole}")
    except decomposition.DecompositionError as err:
        raise StreamKError.stated("decomposition", str(err)) from None
    decision = Decision(
        policy=chosen.policy,
        variant=chosen.variant,
        num_sms=sms.recorded,
        blocks_per_sm=chosen.blocks_per_sm,
        splits=chosen.splits,
        fixup=fixup,
        group=request.group or 0,
        buckets=chosen.buckets,
    )
    return decision, chosen


def _choose(site, request, sms: SmCount, bps, fixup, dp_bps, busy, cost) -> decomposition.Plan:
    if site.runtime_tiles:
        return _run_time_plan(site, request.policy, sms, bps, fixup, cost)
    if site.fragment_accumulator:
        return _aligned_plan(site, request, sms.planned, bps, dp_bps, busy, cost)
    return decomposition.plan(
        site.tiles,
        site.panels,
        sms.planned,
        blocks_per_sm=bps,
        policy=request.policy,
        splits=request.splits,
        variant=request.variant,
        cost=cost,
        fixup=fixup,
        dp_blocks_per_sm=dp_bps,
        saturation=busy,
    )


def _aligned_plan(site, request: Request, sms: int, bps: int, dp_bps, busy, cost):
    """The aligned split ``S`` (a divisor of the panel count, 1 being data-parallel) the cost
    model predicts fastest, for a tensor-core fragment accumulator asked for by a chooser or a
    policy that adapts to fragments (:func:`.rules.check_fragment_plan` says why only these)."""
    panels = site.panels
    dp_bps = bps if dp_bps is None else dp_bps
    candidates = [decomposition.plan(site.tiles, panels, sms, dp_bps, rules.original_policy())]
    candidates += [
        decomposition.plan(site.tiles, panels, sms, bps, rules.aligned_policy(), d)
        for d in range(2, panels + 1)
        if panels % d == 0
    ]
    times = [cost_model.predicted_time(c, sms, cost=cost, saturation=busy) for c in candidates]
    best = min(range(len(candidates)), key=lambda i: (times[i], i))
    if best and times[best] > times[0] * (1 - cost.min_gain):
        best = 0
    unit = cost.unit
    return candidates[best].with_reason(
        f"{candidates[best].label} predicted {times[best]:.3g} {unit} vs data_parallel "
        f"{times[0]:.3g} {unit} (aligned splits of {panels} panels for a tensor-core fragment; "
        f"a split must gain more than the {cost.min_gain:.0%} margin)"
    )


def _run_time_plan(site, policy: str, sms: SmCount, bps: int, fixup: str, cost):
    """A chooser's plan of a run-time tile count: Stream-K or data-parallel chosen per tile
    count when the kernel runs (:mod:`tvm_streamk.run_time_choice`); the Stream-K walk for a
    grouped GEMM; data-parallel for a tensor-core fragment (whose splits are fixed at compile
    time)."""
    device = sms.recorded == DEVICE_SMS
    if site.ragged is not None:
        return decomposition.plan_at_run_time(
            site.tile_count,
            site.panels,
            sms.planned,
            bps,
            rules.run_time_walker(),
            runtime_sms=device,
        )
    if site.fragment_accumulator:
        chosen = decomposition.plan_at_run_time(
            site.tile_count, site.panels, sms.planned, bps, rules.original_policy()
        )
        return chosen.with_reason(
            "data-parallel: a tensor-core fragment takes only aligned splits, and one split "
            "count fixed at compile time would serve every run-time tile count alike (ask for "
            "one with policy='split_k', splits=S)"
        )
    chosen = decomposition.plan_at_run_time(
        site.tile_count,
        site.panels,
        sms.planned,
        bps,
        StreamKOrDataParallel.name,
        variant=StreamKOrDataParallel.variant,
    )
    buckets = stream_k_buckets(site.panels, sms.planned, bps, fixup, cost)
    return chosen.with_buckets(buckets).with_reason(describe(buckets))

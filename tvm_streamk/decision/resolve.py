"""What a concrete decision stands for on a site: its plan, for a target."""

from __future__ import annotations

import tvm

from .. import decomposition, gpus
from ..errors import StreamKError
from .record import DEVICE_SMS, TARGET_SMS, Decision

COND_NUM_SMS = "num-sms"


def planned_sms(decision: Decision, target: tvm.target.Target | None) -> int:
    """The SM count a decision is planned for: its own, the compile target's for
    :data:`~.record.TARGET_SMS`, and 1 for a grid read at run time (whose closed forms are
    then evaluated on the launched grid).

    Raises
    ------
    StreamKError
        Condition ``num-sms``, for a decision left to the target's count with no target, or a
        target whose count is not known.
    """
    if decision.num_sms == DEVICE_SMS:
        return 1
    if decision.num_sms != TARGET_SMS:
        return decision.num_sms
    if target is None:
        raise StreamKError(
            COND_NUM_SMS,
            "a decision left to the compile target's SM count, and no target",
            "Lower through tvm.compile(..., target=...) or tvm_streamk.lower(mod, target), or "
            "pass num_sms to stream_k.",
        )
    try:
        return gpus.num_sms_for_target(None, target, opencl_compute_units=True)
    except gpus.UnknownGPUError as err:
        raise StreamKError.stated(
            COND_NUM_SMS,
            f"a decision left to the compile target's SM count cannot be planned: {err}; or "
            "compile for a target whose tag tvm_streamk.gpus knows",
        ) from None


def counts_chunks(site, chunk: int) -> bool:
    """Whether a batch-invariant plan of ``chunk`` panels per chunk counts chunks on ``site``
    (:meth:`~tvm_streamk.analysis.StreamKSite.chunked`): it does but on a tensor-core
    fragment, whose plan is the aligned split of its own panels, one block per chunk."""
    return bool(chunk) and not site.fragment_accumulator


def planned_site(site, decision: Decision):
    """``site`` as ``decision`` plans and prices it: chunks where the plan counts them
    (:func:`counts_chunks`), panels otherwise."""
    if counts_chunks(site, decision.chunk):
        return site.chunked(decision.chunk)
    return site


def resolve(
    site,
    decision: Decision,
    target: tvm.target.Target | None = None,
    sizes: dict[str, int] | None = None,
) -> decomposition.Plan:
    """The plan ``decision`` stands for on ``site``, for ``target``.

    A batch-invariant decision's plan counts the chunks of its tiles' K
    (:meth:`~tvm_streamk.analysis.StreamKSite.chunked`). A run-time tile count gives the
    lowering's view
    (:func:`~tvm_streamk.decomposition.run_time.at_run_time`), or with ``sizes`` (the run-time
    shape variables by name) the plan the kernel runs at them.

    Raises
    ------
    ValueError
        (:class:`~tvm_streamk.decomposition.DecompositionError`) when the decision's numbers
        are outside its policy's domain for this site; :func:`~.check.check` turns that into a
        ``StreamKError``.
    """
    site = planned_site(site, decision)
    sms = planned_sms(decision, target)
    tiles = site.tiles_at(sizes) if sizes is not None and site.runtime_tiles else None
    rule = decomposition.policy.get(decision.policy, decision.variant)
    if site.runtime_tiles and tiles is None:
        return decomposition.plan_at_run_time(
            site.tile_count,
            site.panels,
            sms,
            decision.blocks_per_sm,
            decision.policy,
            runtime_sms=decision.num_sms == DEVICE_SMS,
            variant=decision.variant,
            buckets=decision.buckets,
            splits=decision.splits if rule.takes_splits else None,
        )
    if tiles is not None:
        chosen = rule.plan_at_count(
            tiles, site.panels, sms, decision.blocks_per_sm, decision.fixup, decision.buckets
        )
        if chosen is not None:
            return chosen
    return decomposition.plan(
        site.tiles if tiles is None else tiles,
        site.panels,
        sms,
        blocks_per_sm=decision.blocks_per_sm,
        policy=decision.policy,
        splits=decision.splits if rule.takes_splits else None,
        variant=decision.variant,
    )

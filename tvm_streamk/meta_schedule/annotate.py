"""Record a Stream-K decision whose knobs may be MetaSchedule random variables.

:func:`tvm_streamk.stream_k` takes concrete knobs and decomposes the reduction itself. Inside a
MetaSchedule design space the knobs are sampled (``sch.sample_categorical``) so the trace records
them and mutators can change them, and the reduction is decomposed later by the stock
``RewriteReductionBlock`` postproc. :func:`annotate_stream_k` is the primitive for that setting:
it validates the tiled reduction with :func:`tvm_streamk.analysis.analyze`, checks the decision
its knobs currently stand for, and records every knob as an ``annotate`` instruction whose value
is either an ``IntImm`` or the sampled ``ExprRV`` itself (as ``meta_schedule.unroll_explicit``
does), so a replay with other decisions re-annotates with the new values.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir.schedule import ExprRV

from .. import decomposition, fixup_registry
from .._compat import Schedule
from ..analysis import StreamKSite, analyze_block, sblock_rv
from ..decision import check, record, rules
from ..decomposition import policy as policies
from ..errors import StreamKError


def policy_code(name: str) -> int:
    """The annotation code of a policy knob name: a registered policy's
    :attr:`~tvm_streamk.decomposition.policy.Policy.key` (``"split_k"``, ``"hybrid_one_tile"``).

    Examples
    --------
    >>> policy_code("stream_k"), policy_code("hybrid_two_tile")
    (2, 4)
    """
    try:
        return policies.by_key(name).code
    except decomposition.DecompositionError:
        known = [p.key for p in policies.concrete()]
        raise StreamKError("policy", f"policy {name!r}", f"Use one of {known}.") from None


def fixup_code(name: str) -> int:
    """The annotation code of a registered fix-up (:mod:`tvm_streamk.fixup_registry`).

    Examples
    --------
    >>> fixup_code("atomic")
    0
    """
    return fixup_registry.get(name).code


def site_of(sch: Schedule, block) -> StreamKSite:
    """Analyse the tiled reduction around ``block`` (an ``SBlockRV`` or a block name).

    Raises
    ------
    StreamKError
        Naming the first precondition of the Stream-K rewrite the kernel does not meet.
    """
    return analyze_block(sch.mod, sch.get(sblock_rv(sch, block)))


def applicable_fixups(site: StreamKSite, target: tvm.target.Target | None) -> tuple[str, ...]:
    """The registered fix-ups (:mod:`tvm_streamk.fixup_registry`) whose own check accepts this
    site and target: a new fix-up becomes a tuning choice as soon as it is registered.
    """
    usable = []
    for fixup in fixup_registry.names():
        try:
            rules.check_fixup(site, fixup, target)
        except StreamKError:
            continue
        usable.append(fixup)
    return tuple(usable)


def _is_rv(value) -> bool:
    return isinstance(value, ExprRV) and not isinstance(value, tirx.IntImm)


def _concrete(sch: Schedule, value) -> int:
    if _is_rv(value):
        return int(sch.get(value))
    return int(value.value if isinstance(value, tirx.IntImm) else value)


def _recorded(value):
    if _is_rv(value):
        return value
    return tirx.IntImm("int32", int(value.value if isinstance(value, tirx.IntImm) else value))


def annotate_stream_k(
    sch: Schedule,
    block,
    *,
    num_sms: int | str,
    policy="stream_k",
    blocks_per_sm=1,
    splits=1,
    fixup="atomic",
    group=0,
    target=None,
    chunk=0,
) -> decomposition.Plan:
    """Record a Stream-K decision on a tiled reduction block, knobs possibly sampled.

    The block must meet every precondition of :func:`tvm_streamk.stream_k` except that it may
    still carry ``T.init``: unlike ``stream_k`` this primitive never decomposes the reduction.
    Decompose it at the panel loop afterwards (MetaSchedule's ``RewriteReductionBlock`` postproc
    does), then remove the decision the decomposition copies onto the init block
    (:class:`tvm_streamk.postproc.RewriteStreamKInit` does).

    Each knob is a plain value or an ``ExprRV`` from ``sch.sample_categorical`` whose candidates
    are codes: policy codes (see :func:`policy_code`), fix-up codes (see :func:`fixup_code`),
    and plain ints for the others. The decision the knobs take now is checked by
    :func:`tvm_streamk.decision.check`, as the primitive and the lowering check theirs; a
    replay with other decisions is checked again by :class:`tvm_streamk.postproc.VerifyStreamK`.

    Parameters
    ----------
    sch : tvm.s_tir.Schedule
        The schedule.
    block : SBlockRV or str
        The reduction block, under its ``blockIdx`` band.
    num_sms : int or "device"
        Streaming multiprocessors (or compute units) of the device: a fact, never sampled.
        ``"device"`` reads the count at run time (stream_k only).
    policy : str, int or ExprRV
        A policy key (see :func:`policy_code`), or a policy code.
    blocks_per_sm, splits, group : int or ExprRV
        As for :func:`tvm_streamk.stream_k`; ``splits`` is used by ``split_k`` only and
        ``group=0`` means row-major tile order.
    fixup : str, int or ExprRV
        A registered fix-up (``"auto"`` is not one: the choice is the tuner's), or its code.
    target : Target, optional
        Checks that the fix-up can be emitted for the target (atomics for the accumulator dtype).
    chunk : int
        A batch-invariant decision's K-panels per chunk
        (:mod:`tvm_streamk.decomposition.chunks`): a fact of the tiling, never sampled; 0 for
        none. ``policy`` and ``splits`` then count chunks.

    Returns
    -------
    Plan
        The decomposition the knobs stand for now.

    Raises
    ------
    StreamKError
        When the kernel or the current decision does not qualify.

    Examples
    --------
    Inside a schedule rule, after ``MultiLevelTiling`` bound the tile loops to ``blockIdx.x``::

        policy = sch.sample_categorical(
            candidates=[policy_code("stream_k"), policy_code("hybrid_two_tile")],
            probs=[0.5, 0.5],
        )
        annotate_stream_k(sch, block, num_sms=132, policy=policy, target=target)

    The trace then holds::

        v7 = sch.sample_categorical(candidates=[2, 4], probs=[0.5, 0.5], decision=1)
        sch.annotate(block_or_loop=b0, ann_key="tvm_streamk.policy", ann_val=v7)
        sch.annotate(block_or_loop=b0, ann_key="tvm_streamk.num_sms", ann_val=132)
        ...
    """
    block_rv = sblock_rv(sch, block)
    if isinstance(target, str | dict):
        target = tvm.target.Target(target)
    site = site_of(sch, block_rv)
    if record.has_decision(site.block.annotations):
        raise StreamKError(
            "reduction-block",
            f"block {site.block.name_hint!r} already carries a Stream-K decision",
            "Annotate a block once.",
        )
    policy = policy_code(policy) if isinstance(policy, str) else policy
    fixup = fixup_code(fixup) if isinstance(fixup, str) else fixup
    num_sms = record.DEVICE_SMS if num_sms == "device" else num_sms
    knobs = {
        record.KEY_POLICY: policy,
        record.KEY_NUM_SMS: num_sms,
        record.KEY_BLOCKS_PER_SM: blocks_per_sm,
        record.KEY_SPLITS: splits,
        record.KEY_FIXUP: fixup,
        record.KEY_GROUP: group,
    }
    if chunk:
        knobs[record.KEY_CHUNK] = chunk
    concrete = {key: tirx.IntImm("int32", _concrete(sch, value)) for key, value in knobs.items()}
    chosen = check(site, record.decode(concrete, site.block.name_hint), target)
    for key, value in knobs.items():
        sch.annotate(block_rv, key, _recorded(value))
    return chosen


def without_stream_k(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every Stream-K decision removed: the data-parallel twin of a candidate.

    Examples
    --------
    >>> has_stream_k(without_stream_k(sch.mod))
    False
    """
    return record.without_decisions(mod)

"""The one ordered check of a concrete decision on a site.

The primitive (:func:`tvm_streamk.stream_k`, on the decision it is about to record), the
lowering (:class:`tvm_streamk.transform.LowerStreamK`, on what a block carries), MetaSchedule's
annotation step and :class:`tvm_streamk.postproc.VerifyStreamK` all call :func:`check` and
nothing else, so a decision is refused by each of them with the same message.
"""

from __future__ import annotations

import tvm

from .. import decomposition
from ..errors import StreamKError
from . import rules
from .record import DEVICE_SMS, Decision
from .resolve import planned_site, resolve

COND_DECOMPOSITION = "decomposition"


def check(site, decision: Decision, target: tvm.target.Target | None = None):
    """The plan ``decision`` stands for on ``site``, once every precondition holds.

    In order: the recorded numbers; batch invariance (after which a batch-invariant
    decision's plan counts chunks, :mod:`tvm_streamk.decomposition.chunks`); one K-panel
    loop; the tile-row group against the band; a grouped GEMM's and a run-time tile count's
    policies; a grid read at run time; the plan itself (its policy's domain); a tensor-core
    fragment's aligned split; the target's index width; and, unless the plan is the kernel
    as written (which merges nothing), the fix-up's own check.

    Raises
    ------
    StreamKError
        Naming the first precondition that fails, what was found and what to do.
    """
    rules.check_recorded(decision, site)
    rules.check_batch_invariant(site, decision)
    rules.check_one_panel_loop(site)
    rules.check_group(decision.group, site)
    rules.check_ragged(site, decision.policy, target)
    rules.check_runtime_tiles(site, decision.policy, decision.group)
    if decision.num_sms == DEVICE_SMS:
        rules.check_runtime_grid(decision.policy, site, target)
    try:
        plan = resolve(site, decision, target)
    except decomposition.DecompositionError as err:
        raise StreamKError.stated(
            COND_DECOMPOSITION,
            # The tile count as an expression: ``site.tiles`` raises for a run-time count,
            # which hid this error behind a precondition the decision had already met.
            f"{err} (block {site.block.name_hint!r}: {site.tile_count} tiles of "
            f"{site.panels} panels)",
        ) from None
    rules.check_fragment_plan(plan, site)
    rules.check_index_width(plan, planned_site(site, decision), target)
    if not plan.scheme.is_original:
        rules.check_fixup(site, decision.fixup, target)
    return plan

"""The decision: what is validated, resolved and recorded between analysis and lowering.

* :mod:`.record`: the :class:`Decision` a block carries and its annotation encoding;
* :mod:`.rules`: each precondition of a decision, stated once;
* :mod:`.check`: :func:`check`, the one ordered check every entry point calls;
* :mod:`.resolve`: :func:`resolve`, the plan a decision stands for on a site and target;
* :mod:`.decide`: :func:`decide`, from a caller's :class:`Request` (choosers, ``"auto"``,
  deferred SM counts) to a checked decision.

Callers: the primitive (:func:`tvm_streamk.stream_k`), the lowering
(:class:`tvm_streamk.transform.LowerStreamK`), MetaSchedule's annotation step and
:class:`tvm_streamk.postproc.VerifyStreamK`. The fix-ups a decision may name live in
:mod:`tvm_streamk.fixup_registry`.
"""

from .check import check
from .decide import Request, decide, validate
from .record import (
    DEVICE_SMS,
    KEYS,
    TARGET_SMS,
    Decision,
    decode,
    has_decision,
    stripped,
    without_decisions,
)
from .resolve import counts_chunks, planned_site, planned_sms, resolve

__all__ = [
    "DEVICE_SMS",
    "KEYS",
    "TARGET_SMS",
    "Decision",
    "Request",
    "check",
    "counts_chunks",
    "decide",
    "decode",
    "has_decision",
    "planned_site",
    "planned_sms",
    "resolve",
    "stripped",
    "validate",
    "without_decisions",
]

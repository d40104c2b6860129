"""Exception types, one per layer of the package."""

from __future__ import annotations

from ._compat import ScheduleError


class StreamKError(ScheduleError):
    """A kernel does not meet a precondition of the Stream-K rewrite.

    Raised by the analysis, by :func:`tvm_streamk.stream_k` and again by the lowering pass. The
    message names the condition, what was found, and what to do.
    """

    def __init__(self, condition: str, found: str, remedy: str):
        self.condition = condition
        self.found = found
        self.remedy = remedy
        super().__init__(f"Stream-K precondition violated [{condition}]: found {found}. {remedy}")

"""Exception types, one per layer of the package."""

from __future__ import annotations

from ._compat import ScheduleError, register_ffi_error

_PREFIX = "Stream-K precondition violated ["
# The start of the message of every host check a kernel makes before it launches (a run-time size
# beyond what its index arithmetic holds): the PoCL backend evaluates these checks itself.
HOST_CHECK = "tvm-streamk: "


@register_ffi_error
class StreamKError(ScheduleError):
    """A kernel does not meet a precondition of the Stream-K rewrite.

    Raised by the analysis, by :func:`tvm_streamk.stream_k` and again by the lowering pass. The
    message names the condition, what was found, and what to do. Registered with TVM's FFI, so
    an error raised inside a pass reaches the caller of ``tvm.compile`` as a ``StreamKError``
    too (rebuilt from its message: ``condition`` is kept, ``found`` holds the whole message).
    """

    def __init__(self, condition: str, found: str | None = None, remedy: str | None = None):
        if found is None and remedy is None:
            # Rebuilt by the FFI from the message alone.
            message = condition
            end = message.find("]")
            known = message.startswith(_PREFIX) and end > 0
            self.condition = message[len(_PREFIX) : end] if known else "unknown"
            self.found, self.remedy = message, ""
            super().__init__(message)
            return
        self.condition = condition
        self.found = found
        self.remedy = remedy
        super().__init__(f"{_PREFIX}{condition}]: found {found}. {remedy}")

    @classmethod
    def stated(cls, condition: str, statement: str) -> StreamKError:
        """A refusal whose ``statement`` already says what was expected, what was found and
        what to do (a :class:`~tvm_streamk.decomposition.DecompositionError`'s message)."""
        error = cls(f"{_PREFIX}{condition}]: {statement}")
        error.found, error.remedy = statement, ""
        return error

"""Exception types of the PoCL execution backend.

Every failure of the backend is a :class:`PoclError`; the subclasses say which stage refused.
"""

from __future__ import annotations


class PoclError(RuntimeError):
    """Base class of everything the PoCL backend raises."""


class DeviceUnavailableError(PoclError):
    """No PoCL CPU device could be opened (pyopencl or pocl-binary-distribution missing)."""


class UnsupportedKernelError(PoclError):
    """The kernel uses a construct that OpenCL on PoCL cannot express faithfully.

    Raised while building, before anything is launched. The message names the construct, the
    kernel it was found in, and what to do instead.
    """

    def __init__(self, construct: str, kernel: str, remedy: str):
        self.construct = construct
        self.kernel = kernel
        self.remedy = remedy
        super().__init__(f"kernel {kernel!r} uses {construct}, which PoCL cannot run. {remedy}")


class KernelBuildError(PoclError):
    """Lowering, OpenCL code generation, or the OpenCL C compiler failed."""


class ArgumentError(PoclError, ValueError):
    """The arrays passed to a kernel do not match its PrimFunc signature."""

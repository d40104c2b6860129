"""Run GPU-scheduled TVM PrimFuncs on the CPU, on PoCL (or the Oclgrind simulator) through OpenCL.

The function is rebuilt for TVM's OpenCL target, its kernels compiled by PoCL, and launched in
the order the lowered host function launches them, with the grid and block it computes.
Work-groups run concurrently on PoCL, so races between blocks are as real as on a GPU.
"""

from .device import (
    ENV_EXECUTOR,
    Executor,
    available,
    compute_units,
    current,
    executors,
    oclgrind_log_offset,
    oclgrind_reports,
    usable_executors,
    use,
)
from .errors import (
    ArgumentError,
    DeviceUnavailableError,
    KernelBuildError,
    PoclError,
    UnsupportedKernelError,
)
from .launch import BufferArg, Deferred, Launch, ScalarArg, Workspace, WorkspaceArg
from .runner import CompiledKernel, compile, run, time
from .signature import Param
from .target import opencl_target

__all__ = [
    "ENV_EXECUTOR",
    "ArgumentError",
    "BufferArg",
    "CompiledKernel",
    "Deferred",
    "DeviceUnavailableError",
    "Executor",
    "KernelBuildError",
    "Launch",
    "Param",
    "PoclError",
    "ScalarArg",
    "UnsupportedKernelError",
    "Workspace",
    "WorkspaceArg",
    "available",
    "compile",
    "compute_units",
    "current",
    "executors",
    "oclgrind_log_offset",
    "oclgrind_reports",
    "opencl_target",
    "run",
    "time",
    "usable_executors",
    "use",
]

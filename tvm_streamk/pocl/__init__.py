"""Run GPU-scheduled TVM PrimFuncs on the CPU, through PoCL as a real OpenCL device.

The function is rebuilt for TVM's OpenCL target, its kernels compiled by PoCL, and launched in
the order the lowered host function launches them, with the grid and block it computes.
Work-groups run concurrently on PoCL, so races between blocks are as real as on a GPU.
"""

from .device import available, compute_units
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

__all__ = [
    "ArgumentError",
    "BufferArg",
    "CompiledKernel",
    "Deferred",
    "DeviceUnavailableError",
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
    "run",
    "time",
]

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
from .launch import BufferArg, Launch, ScalarArg, Workspace, WorkspaceArg
from .runner import CompiledKernel, compile, run, time

__all__ = [
    "ArgumentError",
    "BufferArg",
    "CompiledKernel",
    "DeviceUnavailableError",
    "KernelBuildError",
    "Launch",
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

"""Per-target memory models: the loads, stores, fences and atomics the fix-ups' hand-off uses.

One :class:`MemoryModel` subclass per target kind, in its own module, registered with
:func:`register`; :func:`for_target` finds a target's. The hand-off protocol itself (who
stores, fences, arrives and reads, in which order) is written once, in
:mod:`tvm_streamk.transform.fixup_workspace`; what differs between targets is here.
"""

from .base import MemoryModel, for_target, kinds, register
from .cuda import CudaMemoryModel
from .opencl import OpenCLMemoryModel
from .webgpu import WebGPUMemoryModel

__all__ = [
    "CudaMemoryModel",
    "MemoryModel",
    "OpenCLMemoryModel",
    "WebGPUMemoryModel",
    "for_target",
    "kinds",
    "register",
]

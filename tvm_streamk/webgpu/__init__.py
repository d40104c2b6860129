"""Run GPU-scheduled TVM PrimFuncs on WebGPU: TVM's WGSL, launched through ``wgpu``.

The function is rebuilt for TVM's WebGPU target (``target.build.webgpu``), each kernel's WGSL
compiled by the adapter (naga validates it), and launched in the order the lowered host
function launches them, with the grid it computes and the bindings TVM's WebGPU runtime gives
(:mod:`.lowering`). Here the adapter is Mesa's lavapipe, a CPU Vulkan whose thread pool runs
workgroups concurrently; elsewhere it is the machine's GPU. The contract is
:mod:`tvm_streamk.pocl`'s: numpy in, numpy out::

    c = tvm_streamk.webgpu.run(sch.mod, a, b, c)[2]

Stream-K decisions for WebGPU take the separate fix-up (:mod:`tvm_streamk.memory_model.webgpu`
says why the other two cannot be argued there).
"""

from .device import Adapter, available, compute_units, current, why_unavailable
from .errors import ShaderBuildError, WebGPUError, WebGPUUnavailableError
from .lowering import webgpu_target
from .runner import CompiledShader, compile, run, time

__all__ = [
    "Adapter",
    "CompiledShader",
    "ShaderBuildError",
    "WebGPUError",
    "WebGPUUnavailableError",
    "available",
    "compile",
    "compute_units",
    "current",
    "run",
    "time",
    "webgpu_target",
    "why_unavailable",
]

"""Exception types of the WebGPU execution backend: every failure is a :class:`WebGPUError`."""

from __future__ import annotations


class WebGPUError(RuntimeError):
    """Base class of everything the WebGPU backend raises."""


class WebGPUUnavailableError(WebGPUError):
    """No WebGPU adapter could be opened: ``wgpu`` missing, or no Vulkan/Metal/D3D12 driver."""


class ShaderBuildError(WebGPUError):
    """Lowering, TVM's WGSL code generation, or the adapter's shader compiler (naga) failed."""

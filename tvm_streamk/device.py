"""The device kernels run on by default: a CUDA GPU when TVM can use one, else PoCL on the CPU.

``"webgpu"`` (TVM's WGSL through ``wgpu``: lavapipe's CPU Vulkan here, the machine's GPU
elsewhere) is never the default; it runs when asked for.

Examples, tutorials and the command line never assume a device. They ask
:func:`default_device`, take the SM count from :func:`num_sms` (the multiprocessor count of the
GPU, or the compute units of the PoCL device: the blocks each can run at once), and build with
:func:`compile`, which returns a kernel with the same ``run``/``time`` interface on both devices.
"""

from __future__ import annotations

import statistics

import numpy as np
import tvm

from . import pocl, webgpu

__all__ = [
    "DEVICES",
    "NoDeviceError",
    "compile",
    "cuda_available",
    "default_device",
    "is_cpu",
    "num_sms",
    "target",
]

DEVICES = ("cuda", "pocl", "webgpu")


class NoDeviceError(RuntimeError):
    """No device can run kernels, or the one asked for cannot.

    The message says which devices were looked for, what was found and what to install.
    """


def cuda_available() -> bool:
    """Whether TVM can run kernels on a CUDA GPU in this process.

    The pip wheel has CUDA code generation but may lack a usable CUDA runtime or driver; probing
    it can then raise instead of answering False, which here means "no GPU".
    """
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - any failure of the probe means no usable GPU
        return False


def default_device() -> str:
    """The device to run kernels on: ``"cuda"`` when a GPU is usable, else ``"pocl"``.

    Returns
    -------
    str
        One of :data:`DEVICES`.

    Raises
    ------
    NoDeviceError
        When neither a CUDA GPU nor a PoCL CPU device can be opened.
    """
    if cuda_available():
        return "cuda"
    why = _no_pocl()
    if why is None:
        return "pocl"
    raise NoDeviceError(
        f"no device to run kernels on: TVM sees no CUDA GPU (tvm.cuda(0).exist is False), and {why}"
    )


def _no_pocl() -> str | None:
    """Why no OpenCL CPU executor opens (the probe's findings and the one remedy), or None."""
    try:
        pocl.current()
    except pocl.DeviceUnavailableError as err:
        return str(err)
    return None


def _check(device: str) -> str:
    if device not in DEVICES:
        raise NoDeviceError(f"device must be one of {list(DEVICES)}, found {device!r}")
    if device == "cuda" and not cuda_available():
        raise NoDeviceError(
            "device 'cuda' was asked for, but TVM sees no CUDA GPU (tvm.cuda(0).exist is False); "
            "use device 'pocl' or default_device()"
        )
    if device == "pocl":
        why = _no_pocl()
        if why is not None:
            raise NoDeviceError(f"device 'pocl' was asked for, but {why}")
    if device == "webgpu":
        why = webgpu.why_unavailable()
        if why is not None:
            raise NoDeviceError(f"device 'webgpu' was asked for, but {why}")
    return device


def is_cpu(device: str) -> bool:
    """Whether ``device`` runs its blocks as CPU threads (PoCL, lavapipe's WebGPU): its times
    show what a kernel's bookkeeping costs, not a GPU's speed-up."""
    if _check(device) == "pocl":
        return True
    return device == "webgpu" and webgpu.current().info.get("adapter_type") == "CPU"


def num_sms(device: str) -> int:
    """Blocks the device runs at once, one per SM: the ``num_sms`` a Stream-K plan needs.

    Parameters
    ----------
    device : str
        ``"cuda"`` (the multiprocessor count of GPU 0), ``"pocl"`` (the PoCL device's compute
        units) or ``"webgpu"`` (lavapipe's threads; WebGPU tells no other adapter's count, and
        asking raises ``ValueError``: pass ``num_sms`` yourself).

    Returns
    -------
    int
    """
    if _check(device) == "cuda":
        return int(tvm.cuda(0).multi_processor_count)
    if device == "webgpu":
        return webgpu.compute_units()
    return pocl.compute_units()


def target(device: str) -> tvm.target.Target:
    """The TVM target kernels for ``device`` are compiled for.

    ``"cuda"`` gives the target TVM detects from GPU 0 (with its arch); ``"pocl"`` gives the
    OpenCL target, whose source PoCL compiles (:func:`tvm_streamk.pocl.opencl_target`);
    ``"webgpu"`` the WebGPU target (:func:`tvm_streamk.webgpu.webgpu_target`).
    """
    if _check(device) == "cuda":
        return tvm.target.Target.from_device(tvm.cuda(0))
    if device == "webgpu":
        return webgpu.webgpu_target()
    return pocl.opencl_target()


class _CudaKernel:
    """A module ``tvm.compile`` built for GPU 0, with the interface of ``pocl.CompiledKernel``."""

    def __init__(self, mod, pipeline: str, func_name: str):
        self._dev = tvm.cuda(0)
        self._module = tvm.compile(mod, target=target("cuda"), tir_pipeline=pipeline).jit()
        self._name = func_name

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        tensors = [tvm.runtime.tensor(np.ascontiguousarray(a), self._dev) for a in arrays]
        self._module[self._name](*tensors)
        self._dev.sync()
        return [t.numpy() for t in tensors]

    def time(self, *arrays: np.ndarray, repeat: int = 10, warmup: int = 1) -> float:
        tensors = [tvm.runtime.tensor(np.ascontiguousarray(a), self._dev) for a in arrays]
        for _ in range(warmup):
            self._module[self._name](*tensors)
        timer = self._module.time_evaluator(self._name, self._dev, number=1, repeat=repeat)
        return statistics.median(timer(*tensors).results)


def _func_name(mod) -> str:
    if isinstance(mod, tvm.tirx.PrimFunc):
        return "main"
    names = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    if len(names) != 1:
        raise ValueError(
            f"expected a module with one PrimFunc to run, found {sorted(names)}; pass that "
            "function alone"
        )
    return names[0]


def compile(mod, device: str, pipeline: str = "tvm_streamk"):  # noqa: A001
    """Build ``mod`` for ``device``; return a kernel with ``run(*arrays)`` and ``time(*arrays)``.

    Parameters
    ----------
    mod : PrimFunc, IRModule or tvm.s_tir.Schedule
        A GPU-scheduled kernel (its ``mod`` is taken from a schedule).
    device : str
        One of :data:`DEVICES`, e.g. :func:`default_device`.
    pipeline : str
        The TIR pipeline: ``"tvm_streamk"`` rewrites Stream-K decisions; kernels without one
        pass through it unchanged.

    Returns
    -------
    object
        ``run(*arrays)`` runs once on copies of ``arrays`` (numpy, one per parameter) and returns
        every argument after the call; ``time(*arrays, repeat=10, warmup=1)`` returns the median
        seconds of one call. On PoCL this is a :class:`tvm_streamk.pocl.CompiledKernel`, on
        WebGPU a :class:`tvm_streamk.webgpu.CompiledShader`.
    """
    if hasattr(mod, "mod") and hasattr(mod, "trace"):
        mod = mod.mod
    if _check(device) == "pocl":
        return pocl.compile(mod, pipeline)
    if device == "webgpu":
        return webgpu.compile(mod, pipeline)
    return _CudaKernel(mod, pipeline, _func_name(mod))

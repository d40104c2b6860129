"""Lowering a scheduled PrimFunc to WGSL, the way ``tvm.compile`` would for a WebGPU target.

The steps are those of ``tvm.tirx.build`` (bind the target, run the named TIR pipeline, split
host from device, finalize the device module); each kernel is printed alone by TVM's own
``target.build.webgpu``, so every kernel has its own WGSL module with its own bindings. The host
function is kept in IR form and read by the launch reader the OpenCL backend uses
(:func:`tvm_streamk.pocl.launch.extract_launches`): TVM writes the same host code around WGSL
kernels as around OpenCL ones.

How TVM's WebGPU runtime (``web/src/webgpu.ts``) calls a kernel, which :mod:`.runner` follows:
the kernel's pointer parameters are storage buffers at bindings ``0..n-1`` in parameter order;
its scalar parameters are the leading 32-bit members of a ``PODArgs`` uniform bound at binding
``n`` (an int64 one as an i32), followed by ``packGridDimX``, the launch's ``blockIdx.x``
extent; a grid wider than the adapter's limit per dimension is folded into ``blockIdx.z``
(reserved for it), and the WGSL returns early past ``packGridDimX``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm

from .._compat import codegen_source, is_pointer_var, param_buffers, prim_dtype_of
from ..pocl.lowering import select_primfunc, split_lowered
from .errors import ShaderBuildError

__all__ = ["Kernel", "Lowered", "lower", "select_primfunc", "webgpu_target"]

# Scalars the PODArgs uniform can carry (4 bytes each), by TVM dtype. An int64 scalar (a
# Relax shape variable, a dynamic M) TVM's WGSL generator declares as i32, and its runtime
# packs it so; the runner checks the value fits (:mod:`.runner`).
POD_DTYPES = {"int32": "i32", "uint32": "u32", "float32": "f32", "int64": "i32"}
# Element types a WGSL storage buffer holds: 32-bit scalars, and f16 with the ``shader-f16``
# feature TVM's WGSL enables. TVM's generator writes an int8 buffer as ``array<i8>`` and a
# bfloat16 one as ``array<u16>``, which no WGSL compiler accepts.
STORAGE_DTYPES = ("float32", "int32", "uint32", "float16")
_BINDING = re.compile(
    r"@group\(0\) @binding\((\d+)\) var<(storage, read|storage, read_write|uniform)> (\w+)"
)


def webgpu_target() -> tvm.target.Target:
    """The WebGPU target kernels are built for (host ``llvm``: only its name is used)."""
    return tvm.target.Target("webgpu", host="llvm")


@dataclass(frozen=True)
class Kernel:
    """One WGSL kernel: its source and the access of each storage binding."""

    name: str
    source: str
    writable: tuple[bool, ...]  # per storage binding (pointer parameter), in order
    uses_f16: bool


@dataclass(frozen=True)
class Lowered:
    """The pieces of one lowered PrimFunc."""

    name: str
    host_func: tvm.tirx.PrimFunc
    device_funcs: dict
    kernels: dict  # name -> Kernel


def _attr(func, key: str):
    return func.attrs.get(key, None) if func.attrs is not None else None


def lower(name: str, func: tvm.tirx.PrimFunc, pipeline: str) -> Lowered:
    """Lower ``func`` for WebGPU through the TIR pipeline ``pipeline`` ("default": "s_tir").

    A ``target`` attribute from an earlier schedule is dropped: the schedule is kept, the code
    is regenerated for WebGPU (Stream-K decisions made for another target are checked against
    WebGPU's memory model again by the ``tvm_streamk`` pipeline, which refuses a fix-up WGSL
    cannot order).

    Raises
    ------
    ShaderBuildError
        When TVM fails to lower the function or to generate WGSL for it, a kernel takes a
        scalar the ``PODArgs`` uniform cannot carry, or a buffer of an element type WGSL
        storage cannot hold (:data:`STORAGE_DTYPES`).
    """
    for buf in param_buffers(func):
        element = str(buf.dtype).split("x")[0]
        if element not in STORAGE_DTYPES:
            raise ShaderBuildError(
                f"{name!r} takes buffer {buf.name} of {element}; WGSL storage buffers hold only "
                f"{', '.join(STORAGE_DTYPES)} (no 8-, 16- or 64-bit integers, no bfloat16), so "
                f"TVM's WGSL for it cannot compile. Run {element} kernels on CUDA or OpenCL, or "
                "give the function float32, int32 or float16 buffers."
            )
    if _attr(func, "target") is not None:
        func = func.without_attr("target")
    target = webgpu_target()
    try:
        host_mod, device_mods = split_lowered(name, func, pipeline, target)
    except Exception as err:  # TVM reports failures as assorted builtin exception types
        raise ShaderBuildError(
            f"lowering {name!r} for WebGPU through the {pipeline!r} TIR pipeline failed: {err}"
        ) from err
    device_funcs, kernels = {}, {}
    for device_mod in device_mods:
        for gv, kernel in device_mod.functions.items():
            symbol = str(_attr(kernel, "global_symbol") or gv.name_hint)
            device_funcs[symbol] = kernel
            kernels[symbol] = _kernel(symbol, kernel, target)
    if not kernels:
        raise ShaderBuildError(
            f"{name!r} lowered to no device kernel; bind its loops to blockIdx/threadIdx first"
        )
    return Lowered(name, host_mod[name], device_funcs, kernels)


def _kernel(symbol: str, kernel: tvm.tirx.PrimFunc, target) -> Kernel:
    for param in kernel.params:
        if not is_pointer_var(param) and prim_dtype_of(param) not in POD_DTYPES:
            raise ShaderBuildError(
                f"kernel {symbol!r} takes the scalar {param.name}: {prim_dtype_of(param)}; "
                f"WebGPU's PODArgs uniform carries only {sorted(POD_DTYPES)} (WGSL has no "
                "64-bit integers; an int64 goes as an i32). Keep the kernel's scalar arguments "
                "32-bit."
            )
    try:
        source = codegen_source(tvm.IRModule({tvm.ir.GlobalVar(symbol): kernel}), target)
    except Exception as err:  # TVM reports failures as assorted builtin exception types
        raise ShaderBuildError(f"TVM's WGSL codegen failed for {symbol!r}: {err}") from err
    pointers = sum(1 for p in kernel.params if is_pointer_var(p))
    bindings = sorted((int(i), kind) for i, kind, _ in _BINDING.findall(source))
    storage = [kind for _, kind in bindings if kind != "uniform"]
    if len(storage) != pointers or [i for i, _ in bindings] != list(range(len(bindings))):
        raise ShaderBuildError(
            f"the WGSL of {symbol!r} binds {bindings} for {pointers} pointer parameters; TVM's "
            "WebGPU calling convention (storage buffers in parameter order, then the PODArgs "
            "uniform) does not hold. Report this kernel."
        )
    writable = tuple(kind == "storage, read_write" for kind in storage)
    return Kernel(symbol, source, writable, "f16" in re.findall(r"\bf16\b", source))

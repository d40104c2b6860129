"""Lowering a scheduled PrimFunc to OpenCL C, the way ``tvm.compile`` would for an OpenCL target.

The steps are those of ``tvm.tirx.build``: bind the target, run the named TIR pipeline, split host
from device, finalize the device module, and print it with TVM's own ``target.build.opencl``. The
host module is kept in IR form: :mod:`.launch` reads the kernel launches from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tvm

from .._compat import Schedule, codegen_source, get_tir_pipeline, split_host_device_mods
from ..transform.device_sms import bind_multiprocessors
from .byte_gathers import legalize_byte_gathers
from .checks import check_supported
from .device import compute_units
from .errors import KernelBuildError, PoclError
from .fp16 import legalize_fp16
from .target import opencl_target

# Lowering only needs the host target's name; no host code is ever generated.
_HOST = "llvm"


@dataclass(frozen=True)
class Lowered:
    """The pieces of one lowered PrimFunc."""

    name: str
    func: tvm.tirx.PrimFunc
    host_func: tvm.tirx.PrimFunc
    device_funcs: dict
    source: str


def select_primfunc(mod, func_name: str | None = None) -> tuple[str, tvm.tirx.PrimFunc]:
    """The ``(name, PrimFunc)`` to run from a PrimFunc, an IRModule or a Schedule.

    An IRModule must hold exactly one public PrimFunc (or, lacking any, exactly one PrimFunc, as
    after Relax legalization) unless ``func_name`` picks one.
    """
    if isinstance(mod, Schedule):
        mod = mod.mod
    if isinstance(mod, tvm.tirx.PrimFunc):
        symbol = _attr(mod, "global_symbol")
        return func_name or (str(symbol) if symbol is not None else "main"), mod
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(
            f"expected a PrimFunc, an IRModule or a Schedule; found {type(mod).__name__}"
        )
    prims = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    if func_name is not None:
        if func_name not in prims:
            raise KeyError(f"no PrimFunc named {func_name!r} in the module; found {sorted(prims)}")
        return func_name, prims[func_name]
    public = {n: f for n, f in prims.items() if _attr(f, "global_symbol") is not None}
    candidates = public or prims
    if len(candidates) != 1:
        raise ValueError(
            f"the module holds PrimFuncs {sorted(candidates)}; pick one with func_name="
        )
    ((name, func),) = candidates.items()
    return name, func


def _attr(func, key: str):
    return func.attrs.get(key, None) if func.attrs is not None else None


def split_lowered(name: str, func: tvm.tirx.PrimFunc, pipeline: str, target) -> tuple:
    """``(host module, finalized device modules)`` of ``func`` built as ``name`` for
    ``target`` through the TIR pipeline ``pipeline``: the steps of ``tvm.tirx.build`` before
    code generation, shared by the execution backends. TVM's exceptions pass through."""
    func = func.with_attr("global_symbol", name)
    mod = tvm.IRModule({tvm.ir.GlobalVar(name): func})
    pipeline_pass, _, finalize_device = get_tir_pipeline(pipeline)
    mod = tvm.tirx.transform.BindTarget(target)(mod)
    mod = pipeline_pass(mod)
    host_mod, device_mods = split_host_device_mods(mod)
    return host_mod, [finalize_device()(device_mod) for device_mod in device_mods.values()]


def lower(name: str, func: tvm.tirx.PrimFunc, pipeline: str) -> Lowered:
    """Lower ``func`` for OpenCL through the TIR pipeline ``pipeline`` ("default" is "s_tir").

    A ``target`` attribute from an earlier schedule (dlight under a CUDA target) is dropped: the
    schedule is kept, the code is regenerated for OpenCL.

    Raises
    ------
    UnsupportedKernelError
        When the schedule or a lowered kernel uses a construct OpenCL cannot run.
    KernelBuildError
        When TVM fails to lower the function or to generate OpenCL for it.
    """
    check_supported(func, name)
    if _attr(func, "target") is not None:
        func = func.without_attr("target")
    func = func.with_attr("global_symbol", name)
    target = opencl_target(host=_HOST)
    try:
        host_mod, device_mods = split_lowered(name, func, pipeline, target)
    except PoclError:
        raise
    except Exception as err:  # TVM reports failures as assorted builtin exception types
        raise KernelBuildError(
            f"lowering {name!r} through the {pipeline!r} TIR pipeline failed: {err}"
        ) from err
    device_funcs = {}
    for device_mod in device_mods:
        for gv, kernel in device_mod.functions.items():
            # Launches name kernels by symbol, which SplitHostDevice sets to the GlobalVar's name.
            symbol = str(_attr(kernel, "global_symbol") or gv.name_hint)
            check_supported(kernel, symbol)
            device_funcs[symbol] = kernel
    if not device_funcs:
        raise KernelBuildError(
            f"{name!r} lowered to no device kernel; bind its loops to blockIdx/threadIdx first"
        )
    device_funcs, bytes_prelude = legalize_byte_gathers(device_funcs)
    device_funcs, prelude = legalize_fp16(device_funcs)
    prelude += bytes_prelude
    device_mod = tvm.IRModule({tvm.ir.GlobalVar(n): f for n, f in device_funcs.items()})
    try:
        source = codegen_source(device_mod, target)
    except Exception as err:  # TVM reports failures as assorted builtin exception types
        raise KernelBuildError(f"TVM's OpenCL codegen failed for {name!r}: {err}") from err
    # PoCL's compute units are the multiprocessors of num_sms="device" kernels.
    host_func = bind_multiprocessors(host_mod[name], compute_units())
    return Lowered(name, func, host_func, device_funcs, prelude + _internal_helpers(source))


def _internal_helpers(source: str) -> str:
    """TVM's helper functions (``atomic_add_float_emu``) with internal linkage.

    TVM defines them ``__inline`` alone, which in C99 (and so OpenCL C) is an inline definition
    only: a compiler that does not inline the call (any, built with ``-cl-opt-disable``) links
    against an external definition that no one provides. ``static inline`` always defines it.
    """
    return re.sub(r"^__inline ", "static __inline ", source, flags=re.MULTILINE)

"""TVM 0.27 names the PoCL backend needs beyond those in :mod:`tvm_streamk._compat`.

Kept private to the backend so that a later consolidation into ``_compat`` is a one-file move.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx.buffer import BufferType

from .._compat import (
    get_tir_pipeline,
    split_host_device_mods,
    structural_map,
    structural_walk,
    tir_build_module,
)

__all__ = [
    "BufferLoad",
    "BufferStore",
    "BufferType",
    "PointerType",
    "PrimType",
    "call_pure_extern",
    "codegen_source",
    "dtype_of",
    "get_tir_pipeline",
    "is_buffer_var",
    "is_pointer_var",
    "op_name",
    "split_host_device_mods",
    "structural_map",
    "structural_walk",
]

PointerType = tvm.ir.PointerType
PrimType = tvm.ir.PrimType


def codegen_source(device_mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """OpenCL C source of a finalized device module, from TVM's own ``target.build.opencl``."""
    return tir_build_module.codegen_build(device_mod, target).inspect_source()


def dtype_of(expr) -> str | None:
    """The dtype string of a primitive expression, ``None`` for handles and buffers."""
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, PrimType) else None


def is_buffer_var(value) -> bool:
    """Whether ``value`` is a buffer (in 0.27 a ``Var`` whose type is ``BufferType``)."""
    return isinstance(value, tvm.ir.Var) and isinstance(value.ty, BufferType)


def is_pointer_var(value) -> bool:
    """Whether ``value`` is a data pointer (a ``Var`` whose type is ``PointerType``)."""
    return isinstance(value, tvm.ir.Var) and isinstance(value.ty, PointerType)


def op_name(call) -> str:
    """The name of a call's operator: ``"tirx.call_extern"``, or a GlobalVar's name."""
    op = call.op
    if isinstance(op, tvm.ir.Op):
        return op.name
    return getattr(op, "name_hint", str(op))


# Constructors whose home moved in 0.27 (``BufferLoad`` is a function returning ``TensorLoad``).
BufferLoad = tirx.BufferLoad
BufferStore = tirx.BufferStore
call_pure_extern = tirx.call_pure_extern

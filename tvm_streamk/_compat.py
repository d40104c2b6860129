"""The one place that knows which TVM names moved between versions.

The package targets the installed apache-tvm 0.27; every import of a moved name goes through here
so that a future TVM rename is a one-file change. The numbers of TVM's host calling convention
that the PoCL backend replays (struct field kinds, ffi type indices) live here too, at the end.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.tirx.buffer import BufferType

# The arithmetic analysis package (``tvm.arith`` before 0.27).
arith = importlib.import_module("tvm.sym")

Schedule = s_tir.Schedule
ScheduleError = s_tir.ScheduleError
meta_schedule = s_tir.meta_schedule
dlight = s_tir.dlight

# ``tvm.tirx.build`` is shadowed by the ``build`` function on the package.
tir_build_module = importlib.import_module("tvm.tirx.build")
split_host_device_mods = tir_build_module.split_host_device_mods

structural_walk = tvm_ffi.structural_walk
structural_hash = tvm_ffi.structural_hash
structural_equal = tvm_ffi.structural_equal
structural_map = tvm_ffi.structural_map
# Maps a Python exception class to its name for errors crossing the FFI (and back).
register_ffi_error = tvm_ffi.register_error

get_tir_pipeline = tirx.get_tir_pipeline
register_tir_pipeline = tirx.register_tir_pipeline


def registered_tir_pipelines() -> dict:
    """Name -> factory of every registered TIR pipeline (TVM's registry itself, not a copy)."""
    return importlib.import_module("tvm.tirx.compilation_pipeline").PIPELINE_MAP


SBlock = s_tir.SBlock
SBlockRealize = s_tir.SBlockRealize
Call = tvm.ir.Call


def target(value) -> tvm.target.Target:
    """Return a ``Target`` from a ``Target``, a tag (``"nvidia/nvidia-h100"``) or a config dict.

    TVM 0.27 refuses CLI-style strings such as ``"cuda -arch=sm_90"``; tags and dicts work.
    """
    if isinstance(value, tvm.target.Target):
        return value
    return tvm.target.Target(value)


# ``tirx.BufferLoad`` is a constructor function in 0.27; the node class is ``tvm.ir.TensorLoad``.
BufferLoadNode = tvm.ir.TensorLoad


def replace_block(block: SBlock, **changes) -> SBlock:
    """A copy of ``block`` with some fields replaced."""
    fields = {
        "iter_vars": block.iter_vars,
        "reads": block.reads,
        "writes": block.writes,
        "name_hint": block.name_hint,
        "body": block.body,
        "init": block.init,
        "alloc_buffers": block.alloc_buffers,
        "match_buffers": block.match_buffers,
        "annotations": block.annotations,
    }
    fields.update(changes)
    return SBlock(**fields)


def loaded_buffer(load) -> tirx.Buffer:
    """The buffer a ``TensorLoad`` or ``TensorRegion`` refers to (``.buffer`` before 0.27)."""
    return load.source


def param_buffers(func: tirx.PrimFunc) -> list[tirx.Buffer]:
    """The buffers of a PrimFunc's parameters, in order (0.27 params are the buffers themselves)."""
    return list(func.params)


def with_concrete_shapes(func: tirx.PrimFunc, value: int) -> tirx.PrimFunc:
    """``func`` with every symbolic extent of its parameters' shapes set to ``value`` (0.27
    specializes a parameter by a buffer of the new shape)."""
    concrete = {}
    for buf in param_buffers(func):
        for dim in buf.shape:
            if isinstance(dim, tirx.Var):
                concrete[dim] = tirx.IntImm(prim_dtype_of(dim) or "int64", value)
    if not concrete:
        return func
    return func.specialize(
        {
            buf: tirx.decl_buffer([concrete.get(d, d) for d in buf.shape], buf.dtype, buf.name)
            for buf in param_buffers(func)
            if any(isinstance(d, tirx.Var) for d in buf.shape)
        }
    )


def dtype_of(expr) -> str:
    """The dtype of a scalar TIR expression or variable, as a string."""
    return str(expr.ty)


PointerType = tvm.ir.PointerType
PrimType = tvm.ir.PrimType


def prim_dtype_of(expr) -> str | None:
    """The dtype string of a primitive expression, ``None`` for handles and buffers.

    Unlike :func:`dtype_of`, which prints any type (``T.handle(...)`` for a pointer), this tells
    scalars from the rest.
    """
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, PrimType) else None


def buffer_type_like(ty, *, element=None, shape=None):
    """A ``BufferType`` like ``ty`` with another element type (a ``PrimType``) or shape."""
    return BufferType(
        ty.dtype if element is None else element,
        ty.storage_scope,
        ty.shape if shape is None else shape,
        ty.strides,
        ty.elem_offset,
        ty.data_alignment,
        ty.offset_factor,
        ty.layout,
        ty.allocated_addr,
    )


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


def assert_stmt(condition, kind: str, message: str) -> tirx.Stmt:
    """``assert condition, (kind, [message])``: a host check raising the Python exception
    ``kind`` (``"ValueError"``) with ``message`` when ``condition`` is false.

    0.27's ``tirx.AssertStmt.__init__`` passes its arguments to the constructor in another order
    than the constructor takes them (kind first, condition second): the constructor is called
    directly.
    """
    return tirx._ffi_api.AssertStmt(
        condition, tvm.ir.StringImm(kind), [tvm.ir.StringImm(message)], None
    )


def codegen_source(device_mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """Source of a finalized device module from TVM's own ``target.build.<kind>`` (OpenCL C)."""
    return tir_build_module.codegen_build(device_mod, target).inspect_source()


# -- The host calling convention ---------------------------------------------------------------
#
# After ``MakePackedAPI`` the host PrimFunc reads its packed arguments and their DLTensors through
# ``tvm_struct_get(handle, index, kind)``. The PoCL backend replays that host code without TVM's
# runtime (``tvm_streamk.pocl.host_code``), so it must know the numbers TVM 0.27 writes there.
# They are C enums with no Python binding. The type indices and the device type are those of the
# headers the tvm_ffi wheel ships (``tvm/ffi/c_api.h``, ``dlpack/dlpack.h``); the field kinds are
# those of TVM's ``tirx/builtin.h``, which the wheel does not ship; every PoCL test replays real
# host code through them.


class StructFieldKind:
    """``builtin::TVMStructFieldKind`` values as MakePackedAPI emits them in TVM 0.27."""

    # Fields of a ``DLTensor``.
    ARR_DATA = 1
    ARR_SHAPE = 2
    ARR_STRIDES = 3
    ARR_NDIM = 4
    ARR_BYTE_OFFSET = 8
    ARR_DEVICE_ID = 9
    ARR_DEVICE_TYPE = 10
    # Fields of a packed argument (a ``TVMFFIAny``).
    ANY_TYPE_INDEX = 13
    ANY_VALUE = 15
    # Element ``i`` of an int64 array: how ``shape[i]`` is read.
    INT64_ARRAY_ELEM = 17


class FFITypeIndex:
    """tvm-ffi type indices (``tvm/ffi/c_api.h``) a packed argument's ``type_index`` holds.

    A buffer argument reported as a bare ``DLTensor*`` keeps the host code off its
    ``ffi.Tensor`` header-skipping branch.
    """

    INT = 1
    BOOL = 2
    FLOAT = 3
    DLTENSOR_PTR = 7


# ``DLDeviceType::kDLOpenCL``, the device type the host code checks its tensors against.
DL_OPENCL = 4

# The ``launch_params`` flag of a kernel using dynamic shared memory ends with this (its prefix
# is the IR namespace, ``tirx.`` in 0.27).
DYN_SHARED_LAUNCH_PARAM = "use_dyn_shared_memory"


def _target_config(t: tvm.target.Target) -> dict:
    exported = dict(t.export())
    exported.pop("host", None)
    exported.pop("tag", None)
    return exported


@functools.cache
def _tag_configs() -> tuple:
    """``(name, config)`` of every registered tag, built once (a Target per tag costs ~15 ms
    in all)."""
    import tvm.target.tag as tags

    return tuple((str(name), _target_config(tvm.target.Target(name))) for name in tags.list_tags())


def target_tag(target: tvm.target.Target) -> str | None:
    """The registered tag a target was built from, or None.

    TVM 0.27 expands a tag into its attributes and leaves ``Target.tag`` empty, so the tag is
    found again by matching the attributes (host excluded) against the registered tags.
    """
    if target.tag:
        return str(target.tag)
    return _tag_of(str(target))


@functools.lru_cache(maxsize=64)
def _tag_of(text: str) -> str | None:
    mine = _target_config(tvm.target.Target(text))
    found = [name for name, config in _tag_configs() if tvm_ffi.structural_equal(config, mine)]
    return found[0] if len(found) == 1 else None


def target_arch(target: tvm.target.Target | None) -> str | None:
    """The ``arch`` attribute of a target (``"sm_90a"``), or None when it has none."""
    attrs = None if target is None else target.attrs
    return str(attrs["arch"]) if attrs is not None and "arch" in attrs else None


def dlight_cuda_target(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` as dlight's ``gpu.Matmul`` should see it.

    TVM 0.27's ``check_sm_version`` parses the arch as digits only, so ``sm_90a`` (the arch of
    the ``nvidia/nvidia-h100`` tag) reads as -1 and fp16/int8 matmuls never get the tensor-core
    schedule. The same target with the arch-specific suffix dropped (``sm_90``) gets it; the
    schedule is built for the original target.
    """
    arch = target_arch(target)
    if target.kind.name != "cuda" or arch is None:
        return target
    base = arch.rstrip("af")
    if base == arch or not base.replace("sm_", "").isdigit():
        return target
    config = dict(target.export())
    config["arch"] = base
    return tvm.target.Target(config)


def without_int8_tensorization(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` marked for dlight's SIMT schedule where it is an int8 x int8 -> int32 matmul.

    TVM 0.27's int8 tensor-core schedule (``gpu.Matmul`` gives every int8 matmul whose extents
    all pass 64 to ``MatmulInt8Tensorization``) does not build: ``InjectSoftwarePipeline`` stops
    on it ("Check failed: (it != fragment_info_.end())") for sm_75, sm_80, sm_86 and sm_90, any
    shape, so stock ``tvm.compile`` builds no such model. ``dlight.do_not_tensorize`` makes
    ``gpu.Matmul`` give its SIMT schedule, which builds (and PoCL runs: int8 products summed in
    int32 are exact). tests/integrations/test_dlight_relax.py holds TVM's failure as a canary.
    """
    found = []

    def on_block(block) -> None:
        if block.init is None or not block.writes:
            return
        reads = {str(loaded_buffer(r).dtype) for r in block.reads}
        if "int8" in reads and all(str(loaded_buffer(w).dtype) == "int32" for w in block.writes):
            found.append(block)

    structural_walk(func.body, (SBlock, on_block))
    return func.with_attr("dlight.do_not_tensorize", True) if found else func


@contextlib.contextmanager
def unnamed_handlers_detached(logger_name: str = "tvm.s_tir.meta_schedule"):
    """Run the body with the unnamed handlers of ``logger_name`` detached, then put them back.

    TVM 0.27's ``meta_schedule.logging.create_loggers`` (run by every ``tune_tir``) configures
    its logger with the names of the handlers already on it, and an unnamed one (``None``; a
    handler added with ``addHandler``, pytest's ``LogCaptureHandler``) fails it with
    "'NoneType' object has no attribute 'format'". A second tuning run in one pytest process
    met it. TVM's ``dictConfig`` replaces that logger's handlers anyway.
    """
    logger = logging.getLogger(logger_name)
    unnamed = [h for h in logger.handlers if h.get_name() is None]
    for handler in unnamed:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for handler in unnamed:
            if handler not in logger.handlers:
                logger.addHandler(handler)

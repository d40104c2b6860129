"""An interpreter of the host function TVM 0.27 writes around the kernels it launches.

After ``SplitHostDevice`` and ``MakePackedAPI`` the host PrimFunc is a packed function
``(self_handle, args, num_args, result)`` that unpacks its DLTensor arguments, allocates any global
workspace (``AllocBuffer``), and makes one ``tirx.call_ffi_kernel`` call per kernel, in launch
order::

    T.call_ffi_kernel("f_kernel", A_1.data, W.data, m, 64, 4, 8,
                      launch_params=["blockIdx.x", "threadIdx.y", "threadIdx.x"])

The first arguments match the device kernel's parameters one for one; the rest are the launch
extents named by ``launch_params``. :class:`HostCode` walks that function once, recording its
bindings, its allocations and its launches with the host conditions guarding them, and evaluates
host expressions over those bindings, with the packed arguments read as TVM's runtime would lay
them out (:class:`tvm_streamk._compat.StructFieldKind`). It is the one reader of that calling
convention; :mod:`.launch` turns what it reads into launch records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tvm

from .._compat import (
    DL_OPENCL,
    FFITypeIndex,
    StructFieldKind,
    is_buffer_var,
    op_name,
    prim_dtype_of,
    structural_walk,
)
from ..errors import HOST_CHECK
from .errors import UnsupportedKernelError
from .signature import Param
from .tir_arith import BINARY_OPS, cast


class NeedsArguments(Exception):
    """A host value depends on the call's arguments (a symbolic extent, a scalar parameter)."""


@dataclass(frozen=True)
class ParamData:
    """The value of a host expression that is the data pointer of PrimFunc parameter ``param``."""

    param: int


@dataclass(frozen=True)
class HostCheck:
    """A check the host function makes before it launches anything, one of the package's own
    (its message starts with :data:`~tvm_streamk.errors.HOST_CHECK`): when ``condition`` is
    false the call raises the Python exception named ``kind`` with ``message``."""

    condition: object
    kind: str
    message: str


@dataclass(frozen=True)
class Allocation:
    """A global buffer the host function allocates itself; ``shape`` holds host expressions."""

    name: str
    dtype: str
    shape: tuple


@dataclass(frozen=True)
class KernelCall:
    """One ``call_ffi_kernel`` of the host function, split into its parts.

    ``args`` are the host expressions passed as the kernel's parameters, ``extents`` pairs each
    ``launch_params`` tag with its host expression, and ``guards`` are the host conditions that
    must all hold for the launch to happen.
    """

    kernel: str
    args: tuple
    extents: tuple
    guards: tuple


@dataclass(frozen=True)
class _Tensor:
    param: int


@dataclass(frozen=True)
class _ShapeArray:
    param: int


_ARGS = object()
_NULL = object()


class HostCode:
    """The bindings, allocations and launches of one host function, and an evaluator over them.

    Parameters
    ----------
    func
        The host PrimFunc after the TIR pipeline (``MakePackedAPI`` applied). Bindings are keyed
        by object address, so it must outlive this reader.
    params
        The original PrimFunc's signature, in the packed-argument order.
    func_name
        The PrimFunc's name, for messages.

    Attributes
    ----------
    allocations : list[Allocation]
        The buffers the host function allocates itself, in order; a pointer to one of them
        evaluates to its index here.
    calls : list[tuple]
        ``(call, guards)`` of every ``call_ffi_kernel``, in launch order.
    checks : list[HostCheck]
        The package's own host checks (a run-time size beyond a kernel's index arithmetic), in
        order; TVM's argument checks are :func:`~.signature.check_arguments`'s.

    Raises
    ------
    UnsupportedKernelError
        For host code this backend cannot replay: launches inside host loops, host-side
        computation, calls into other packed functions, or launches of unknown kernels or
        with unknown launch parameters.
    """

    def __init__(self, func, params: Sequence[Param], func_name: str):
        if len(func.params) != 4:
            raise UnsupportedKernelError(
                "a host function without the packed calling convention",
                func_name,
                "Lower through a TIR pipeline that ends with MakePackedAPI (the 's_tir' pipeline "
                "does).",
            )
        self.func = func
        self.func_name = func_name
        self.params = list(params)
        self.args_var = func.params[1]
        self.bindings: dict[int, object] = {}
        self.buffers: dict[int, object] = {}
        self.allocations: list[Allocation] = []
        self.calls: list[tuple[object, tuple]] = []
        self.checks: list[HostCheck] = []
        self._walk(func.body, ())

    def _walk(self, stmt, guards: tuple) -> None:
        tirx = tvm.tirx
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self._walk(s, guards)
        elif isinstance(stmt, tirx.AttrStmt):
            self._walk(stmt.body, guards)
        elif isinstance(stmt, tirx.Bind):
            self.bindings[stmt.var.__chandle__()] = stmt.value
        elif isinstance(stmt, tirx.DeclBuffer):
            self.buffers[stmt.buffer.__chandle__()] = stmt.data
        elif isinstance(stmt, tirx.AllocBuffer):
            buf = stmt.buffer
            self.buffers[buf.__chandle__()] = len(self.allocations)
            self.allocations.append(
                Allocation(buf.name, str(buf.ty.dtype.dtype), tuple(buf.ty.shape))
            )
        elif isinstance(stmt, tirx.IfThenElse):
            self._walk(stmt.then_case, (*guards, stmt.condition))
            if stmt.else_case is not None:
                self._walk(stmt.else_case, (*guards, tvm.ir.prim.expr.Not(stmt.condition)))
        elif isinstance(stmt, (tirx.For, tirx.While)):
            if _contains_launch(stmt):
                raise UnsupportedKernelError(
                    "kernel launches inside a host-side loop",
                    self.func_name,
                    "Bind the loop to blockIdx or unroll it so the host makes a fixed sequence "
                    "of launches.",
                )
        elif isinstance(stmt, tirx.Evaluate):
            self._evaluate_stmt(stmt.value, guards)
        elif isinstance(stmt, tirx.BufferStore):
            raise UnsupportedKernelError(
                f"host-side computation (a store to {stmt.buffer.name!r} outside any kernel)",
                self.func_name,
                "Bind every loop nest that writes memory to blockIdx/threadIdx.",
            )
        elif isinstance(stmt, tirx.AssertStmt):
            message = "".join(_string(part) or str(part) for part in stmt.message_parts)
            if message.startswith(HOST_CHECK):
                self.checks.append(HostCheck(stmt.condition, _string(stmt.error_kind), message))
        # TVM's argument checks (AssertStmt, done by check_arguments instead), Return, and
        # no-ops need nothing.

    def _evaluate_stmt(self, value, guards: tuple) -> None:
        if not isinstance(value, tvm.ir.Call):
            return
        name = op_name(value)
        if name == "tirx.call_ffi_kernel":
            self.calls.append((value, guards))
        elif name == "tirx.tvm_call_packed" and _string(value.args[0]) == "__tvm_set_device":
            return
        else:
            raise UnsupportedKernelError(
                f"the host-side call {name}({', '.join(str(a) for a in value.args)})",
                self.func_name,
                "Only kernel launches can be replayed on PoCL; move the work into a kernel.",
            )

    def kernel_call(self, call, guards: tuple, device_funcs: dict) -> KernelCall:
        """The parts of one recorded ``call_ffi_kernel``; ``device_funcs`` give its arity."""
        kernel = call.args[0].value
        if kernel not in device_funcs:
            raise UnsupportedKernelError(
                f"a launch of {kernel!r}, which is not among the device kernels "
                f"{sorted(device_funcs)}",
                self.func_name,
                "Lower the PrimFunc without external kernels.",
            )
        num_params = len(device_funcs[kernel].params)
        extents = list(call.args[1 + num_params :])
        tags = [str(t) for t in call.attrs.launch_params]
        if len(extents) != len(tags):
            raise UnsupportedKernelError(
                f"launch parameters {tags} with {len(extents)} values",
                kernel,
                "This TVM emits launch flags the PoCL backend does not know; report it.",
            )
        args = tuple(call.args[1 : 1 + num_params])
        return KernelCall(kernel, args, tuple(zip(tags, extents)), guards)

    def evaluate(self, expr, values: Sequence | None):
        """Evaluate a host expression.

        ``values`` are the checked call arguments; with ``None``, an expression that needs them
        raises :class:`NeedsArguments`. A data pointer evaluates to a :class:`ParamData` or to
        the index of an allocation.
        """
        return _Evaluator(self, values).eval(expr)


class _Evaluator:
    """A small interpreter for the expressions MakePackedAPI writes into the host function."""

    def __init__(self, host: HostCode, values: Sequence | None):
        self.host = host
        self.values = values
        self.memo: dict[int, object] = {}

    def eval(self, e):
        p = tvm.ir.prim.expr
        if isinstance(e, (int, float, bool)):
            return e
        if isinstance(e, tvm.tirx.IntImm):
            return bool(e.value) if prim_dtype_of(e) == "bool" else int(e.value)
        if isinstance(e, tvm.tirx.FloatImm):
            return float(e.value)
        if isinstance(e, tvm.ir.StringImm):
            return e.value
        if isinstance(e, tvm.ir.Var):
            return self._var(e)
        if isinstance(e, p.Cast):
            return cast(self.eval(e.value), prim_dtype_of(e))
        if isinstance(e, tvm.ir.Call):
            return self._call(e)
        if isinstance(e, p.Let):
            self.memo[e.var.__chandle__()] = self.eval(e.value)
            return self.eval(e.body)
        if isinstance(e, p.Select):
            return self.eval(e.true_value) if self.eval(e.condition) else self.eval(e.false_value)
        if isinstance(e, p.Not):
            return not self.eval(e.a)
        if isinstance(e, p.And):
            return bool(self.eval(e.a)) and bool(self.eval(e.b))
        if isinstance(e, p.Or):
            return bool(self.eval(e.a)) or bool(self.eval(e.b))
        binary = BINARY_OPS.get(type(e))
        if binary is not None:
            a, b = self.eval(e.a), self.eval(e.b)
            result = binary(a, b)
            dtype = prim_dtype_of(e)
            return cast(result, dtype) if dtype and dtype != "bool" else result
        raise UnsupportedKernelError(
            f"the host expression {e} ({type(e).__name__})",
            self.host.func_name,
            "Keep launch extents and kernel scalars to integer arithmetic on shapes and "
            "scalar parameters.",
        )

    def _var(self, var):
        if var.same_as(self.host.args_var):
            return _ARGS
        key = var.__chandle__()
        if key in self.memo:
            return self.memo[key]
        if key in self.host.bindings:
            value = self.eval(self.host.bindings[key])
            self.memo[key] = value
            return value
        raise UnsupportedKernelError(
            f"the host variable {var.name!r}, which is bound nowhere this backend can see",
            self.host.func_name,
            "Report this kernel: its host code is not the one MakePackedAPI writes.",
        )

    def _call(self, call):
        name = op_name(call)
        args = call.args
        if name == "tirx.tvm_struct_get":
            return self._struct_get(self.eval(args[0]), int(args[1].value), int(args[2].value))
        if name == "prim.if_then_else":
            return self.eval(args[1]) if self.eval(args[0]) else self.eval(args[2])
        if name == "tirx.reinterpret":
            return self.eval(args[0])
        if name == "tirx.isnullptr":
            return self.eval(args[0]) is _NULL
        if name == "tirx.buffer_data":
            return self._buffer_data(args[0])
        raise UnsupportedKernelError(
            f"the host call {name}",
            self.host.func_name,
            "Keep launch extents and kernel scalars to integer arithmetic on shapes and "
            "scalar parameters.",
        )

    def _buffer_data(self, buf):
        if isinstance(buf, tvm.ir.TensorLoad):
            # A scalar buffer view (``T.decl_scalar``) is a load; its data is its source's.
            buf = buf.source
        if not is_buffer_var(buf):
            return self.eval(buf)
        source = self.host.buffers.get(buf.__chandle__())
        if source is None:
            raise UnsupportedKernelError(
                f"the buffer {buf.name!r}, declared nowhere in the host function",
                self.host.func_name,
                "Report this kernel: its host code is not the one MakePackedAPI writes.",
            )
        if isinstance(source, int):
            return source
        return self.eval(source)

    def _struct_get(self, handle, index: int, kind: int):
        params = self.host.params
        field = StructFieldKind
        if handle is _ARGS:
            param = params[index]
            if kind == field.ANY_TYPE_INDEX:
                if param.is_buffer:
                    return FFITypeIndex.DLTENSOR_PTR
                if param.dtype == "bool":
                    return FFITypeIndex.BOOL
                if param.dtype.startswith(("float", "bfloat")):
                    return FFITypeIndex.FLOAT
                return FFITypeIndex.INT
            if kind == field.ANY_VALUE:
                if param.is_buffer:
                    return _Tensor(index)
                if self.values is None:
                    raise NeedsArguments
                return self.values[index].item()
        elif isinstance(handle, _Tensor):
            if kind == field.ARR_DATA:
                return ParamData(handle.param)
            if kind == field.ARR_SHAPE:
                return _ShapeArray(handle.param)
            if kind == field.ARR_STRIDES:
                return _NULL
            if kind == field.ARR_NDIM:
                return len(params[handle.param].shape)
            if kind == field.ARR_BYTE_OFFSET or kind == field.ARR_DEVICE_ID:
                return 0
            if kind == field.ARR_DEVICE_TYPE:
                return DL_OPENCL
        elif isinstance(handle, _ShapeArray) and kind == field.INT64_ARRAY_ELEM:
            extent = params[handle.param].shape[index]
            if isinstance(extent, int):
                return extent
            if self.values is None:
                raise NeedsArguments
            return int(self.values[handle.param].shape[index])
        raise UnsupportedKernelError(
            f"a read of field kind {kind} from {handle!r}",
            self.host.func_name,
            "Report this kernel: its host code is not the one MakePackedAPI writes.",
        )


def _string(expr) -> str | None:
    return expr.value if isinstance(expr, tvm.ir.StringImm) else None


def _contains_launch(stmt) -> bool:
    found = []

    def visit(call):
        if op_name(call) == "tirx.call_ffi_kernel":
            found.append(call)

    structural_walk(stmt, [(tvm.ir.Call, visit)])
    return bool(found)

"""Kernel launches read from the lowered host function.

After ``SplitHostDevice`` and ``MakePackedAPI`` the host PrimFunc is a packed function
``(self_handle, args, num_args, result)`` that unpacks its DLTensor arguments, allocates any global
workspace (``AllocBuffer``), and makes one ``tirx.call_ffi_kernel`` call per kernel, in launch
order::

    T.call_ffi_kernel("f_kernel", A_1.data, W.data, m, 64, 4, 8,
                      launch_params=["blockIdx.x", "threadIdx.y", "threadIdx.x"])

The first arguments match the device kernel's parameters one for one; the rest are the launch
extents named by ``launch_params``. This module interprets just enough of that host code to say,
for every launch, which PrimFunc parameter or workspace each pointer is, what each scalar is, and
the grid and block extents. Values that depend on the call (symbolic shapes, scalar parameters)
stay :class:`Deferred` until :meth:`LaunchPlan.resolve` is given the call's arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import tvm

from ._tvm import dtype_of, is_buffer_var, is_pointer_var, op_name, structural_walk
from .errors import UnsupportedKernelError
from .signature import Param, numpy_dtype

# ``builtin::TVMStructFieldKind`` as MakePackedAPI emits it in TVM 0.27: the DLTensor fields it
# reads, the packed-argument fields, and the int64-array element read of ``shape[i]``.
_ARR_DATA = 1
_ARR_SHAPE = 2
_ARR_STRIDES = 3
_ARR_NDIM = 4
_ARR_BYTE_OFFSET = 8
_ARR_DEVICE_ID = 9
_ARR_DEVICE_TYPE = 10
_ANY_TYPE_INDEX = 13
_ANY_VALUE = 15
_INT64_ARRAY_ELEM = 17

# tvm-ffi type indices (``tvm/ffi/c_api.h``); a buffer argument is reported as a bare
# ``DLTensor*`` so that the ``ffi.Tensor`` header-skipping branch is never taken.
_TYPE_INT = 1
_TYPE_BOOL = 2
_TYPE_FLOAT = 3
_TYPE_DLTENSOR_PTR = 7
_DL_OPENCL = 4

_GRID_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
_BLOCK_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
_DYN_SHARED_TAG = "use_dyn_shared_memory"


@dataclass(frozen=True)
class Deferred:
    """A host expression that needs the call's arguments (a symbolic extent, a scalar param)."""

    expr: object

    def __str__(self) -> str:
        return str(self.expr)


@dataclass(frozen=True)
class BufferArg:
    """Kernel pointer ``name`` is the data of PrimFunc parameter number ``param``.

    ``written`` says whether the kernel may store to it (stores, or its address taken).
    """

    name: str
    param: int
    param_name: str
    written: bool = False

    def __str__(self) -> str:
        return f"{self.name}=<{'out ' if self.written else ''}param {self.param_name}>"


@dataclass(frozen=True)
class WorkspaceArg:
    """Kernel pointer ``name`` is a global buffer the host function allocates itself."""

    name: str
    workspace: int
    workspace_name: str
    written: bool = False

    def __str__(self) -> str:
        return f"{self.name}=<{'out ' if self.written else ''}workspace {self.workspace_name}>"


@dataclass(frozen=True)
class ScalarArg:
    """Kernel scalar ``name`` of ``dtype``, a number or a :class:`Deferred` host expression."""

    name: str
    dtype: str
    value: object

    def __str__(self) -> str:
        return f"{self.name}:{self.dtype}={self.value}"


@dataclass(frozen=True)
class Workspace:
    """A global buffer allocated by the host function (``T.alloc_buffer`` outside any kernel)."""

    name: str
    dtype: str
    shape: tuple

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(str(s) for s in self.shape)}]"


@dataclass(frozen=True)
class Launch:
    """One kernel launch made by the host function.

    ``grid`` and ``block`` are ``(x, y, z)`` extents of ``blockIdx`` and ``threadIdx``; the OpenCL
    global size is their product per dimension. ``guards`` are host conditions that must all hold
    for the launch to happen.
    """

    kernel: str
    args: tuple
    grid: tuple
    block: tuple
    guards: tuple = ()

    def __str__(self) -> str:
        args = ", ".join(str(a) for a in self.args)
        grid = ", ".join(str(g) for g in self.grid)
        block = ", ".join(str(b) for b in self.block)
        guard = f" if {' and '.join(str(g) for g in self.guards)}" if self.guards else ""
        return f"{self.kernel}<<<({grid}), ({block})>>>({args}){guard}"


@dataclass(frozen=True)
class ResolvedLaunch:
    """A :class:`Launch` with every value made concrete for one call."""

    kernel: str
    args: tuple
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    enabled: bool


@dataclass(frozen=True)
class _Tensor:
    param: int


@dataclass(frozen=True)
class _ShapeArray:
    param: int


_ARGS = object()
_NULL = object()


class _NeedsArguments(Exception):
    """A value depends on the call's arguments; keep it :class:`Deferred`."""


@dataclass
class LaunchPlan:
    """Every launch of one host function, and the workspaces it allocates."""

    launches: tuple[Launch, ...]
    workspaces: tuple[Workspace, ...]
    _host: _HostInterpreter = field(repr=False)

    def resolve(self, values: Sequence) -> tuple[list[ResolvedLaunch], list[int]]:
        """Concrete launches and workspace byte sizes for a call with ``values`` (checked args)."""

        def concrete(x):
            return self._host.evaluate(x.expr, values) if isinstance(x, Deferred) else x

        resolved = []
        for launch in self.launches:
            args = tuple(
                ScalarArg(a.name, a.dtype, concrete(a.value)) if isinstance(a, ScalarArg) else a
                for a in launch.args
            )
            resolved.append(
                ResolvedLaunch(
                    launch.kernel,
                    args,
                    tuple(int(concrete(g)) for g in launch.grid),
                    tuple(int(concrete(b)) for b in launch.block),
                    all(bool(concrete(g)) for g in launch.guards),
                )
            )
        sizes = [
            math.prod(int(concrete(s)) for s in ws.shape) * _itemsize(ws.dtype)
            for ws in self.workspaces
        ]
        return resolved, sizes


def _itemsize(dtype: str) -> int:
    t = tvm.DataType(dtype)
    return max(1, t.bits * t.lanes // 8)


def extract_launches(
    host_func: tvm.tirx.PrimFunc,
    device_funcs: dict[str, tvm.tirx.PrimFunc],
    params: Sequence[Param],
    func_name: str,
) -> LaunchPlan:
    """Read the launches of a lowered (packed) host function.

    Parameters
    ----------
    host_func
        The host PrimFunc after the TIR pipeline (``MakePackedAPI`` applied).
    device_funcs
        The finalized device kernels by name; their parameters give each launch's arity.
    params
        The original PrimFunc's signature, in the packed-argument order.
    func_name
        The PrimFunc's name, for messages.

    Raises
    ------
    UnsupportedKernelError
        For host code this backend cannot replay: launches inside host loops, host-side
        computation, calls into other packed functions, or unknown launch parameters.
    """
    host = _HostInterpreter(host_func, params, func_name)
    host.walk(host_func.body, ())
    launches = []
    for call, guards in host.calls:
        launches.append(host.launch(call, guards, device_funcs))
    return LaunchPlan(tuple(launches), tuple(host.workspaces), host)


class _HostInterpreter:
    """Bindings of the host function and an evaluator over them."""

    def __init__(self, func, params: Sequence[Param], func_name: str):
        if len(func.params) != 4:
            raise UnsupportedKernelError(
                "a host function without the packed calling convention",
                func_name,
                "Lower through a TIR pipeline that ends with MakePackedAPI (the 's_tir' pipeline "
                "does).",
            )
        # Bindings are keyed by object address, so the function must outlive this interpreter.
        self.func = func
        self.func_name = func_name
        self.params = list(params)
        self.args_var = func.params[1]
        self.bindings: dict[int, object] = {}
        self.buffers: dict[int, object] = {}
        self.workspaces: list[Workspace] = []
        self.calls: list[tuple[object, tuple]] = []

    # -- statements ---------------------------------------------------------------------------

    def walk(self, stmt, guards: tuple) -> None:
        """Record bindings, buffers and launches of ``stmt`` in execution order."""
        tirx = tvm.tirx
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self.walk(s, guards)
        elif isinstance(stmt, tirx.AttrStmt):
            self.walk(stmt.body, guards)
        elif isinstance(stmt, tirx.Bind):
            self.bindings[stmt.var.__chandle__()] = stmt.value
        elif isinstance(stmt, tirx.DeclBuffer):
            self.buffers[stmt.buffer.__chandle__()] = stmt.data
        elif isinstance(stmt, tirx.AllocBuffer):
            buf = stmt.buffer
            self.buffers[buf.__chandle__()] = len(self.workspaces)
            shape = tuple(self._fold(s) for s in buf.ty.shape)
            self.workspaces.append(Workspace(buf.name, str(buf.ty.dtype.dtype), shape))
        elif isinstance(stmt, tirx.IfThenElse):
            self.walk(stmt.then_case, (*guards, stmt.condition))
            if stmt.else_case is not None:
                self.walk(stmt.else_case, (*guards, tvm.ir.prim.expr.Not(stmt.condition)))
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
        # AssertStmt (argument checks, done by check_arguments instead), Return, and no-ops need
        # nothing.

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

    # -- launches -----------------------------------------------------------------------------

    def launch(self, call, guards: tuple, device_funcs: dict) -> Launch:
        """The :class:`Launch` of one ``call_ffi_kernel`` call."""
        kernel = call.args[0].value
        if kernel not in device_funcs:
            raise UnsupportedKernelError(
                f"a launch of {kernel!r}, which is not among the device kernels "
                f"{sorted(device_funcs)}",
                self.func_name,
                "Lower the PrimFunc without external kernels.",
            )
        kparams = list(device_funcs[kernel].params)
        kargs = list(call.args[1 : 1 + len(kparams)])
        extents = list(call.args[1 + len(kparams) :])
        tags = [str(t) for t in call.attrs.launch_params]
        if len(extents) != len(tags):
            raise UnsupportedKernelError(
                f"launch parameters {tags} with {len(extents)} values",
                kernel,
                "This TVM emits launch flags the PoCL backend does not know; report it.",
            )
        written = written_pointers(device_funcs[kernel])
        args = tuple(self._kernel_arg(kernel, p, a, written) for p, a in zip(kparams, kargs))
        grid, block = [1, 1, 1], [1, 1, 1]
        for tag, extent in zip(tags, extents):
            if tag in _GRID_TAGS:
                grid[_GRID_TAGS.index(tag)] = self._fold(extent)
            elif tag in _BLOCK_TAGS:
                block[_BLOCK_TAGS.index(tag)] = self._fold(extent)
            elif tag.endswith(_DYN_SHARED_TAG):
                raise UnsupportedKernelError(
                    "dynamic shared memory ('shared.dyn')",
                    kernel,
                    "TVM's OpenCL codegen turns it into private memory; use static 'shared' "
                    "buffers.",
                )
            else:
                raise UnsupportedKernelError(
                    f"the launch parameter {tag!r}",
                    kernel,
                    "Schedule without it (only blockIdx/threadIdx launches map onto OpenCL).",
                )
        return Launch(kernel, args, tuple(grid), tuple(block), tuple(self._fold(g) for g in guards))

    def _kernel_arg(self, kernel: str, kparam, host_arg, written: set):
        if is_pointer_var(kparam):
            ref = self.evaluate(host_arg, None)
            out = kparam.name in written
            if isinstance(ref, _Data):
                return BufferArg(kparam.name, ref.param, self.params[ref.param].name, out)
            if isinstance(ref, int) and not isinstance(ref, bool):
                return WorkspaceArg(kparam.name, ref, self.workspaces[ref].name, out)
            raise UnsupportedKernelError(
                f"a pointer argument {kparam.name!r} = {host_arg} that is neither a parameter "
                "nor a host allocation",
                kernel,
                "Pass the buffer as a PrimFunc parameter.",
            )
        return ScalarArg(kparam.name, dtype_of(kparam), self._fold(host_arg))

    def _fold(self, expr):
        """``expr`` evaluated now if it does not depend on the call, else :class:`Deferred`."""
        try:
            return self.evaluate(expr, None)
        except _NeedsArguments:
            return Deferred(expr)

    # -- expressions --------------------------------------------------------------------------

    def evaluate(self, expr, values: Sequence | None):
        """Evaluate a host expression; ``values`` are the checked call arguments, or ``None``."""
        return _Evaluator(self, values).eval(expr)


@dataclass(frozen=True)
class _Data:
    param: int


class _Evaluator:
    """A small interpreter for the expressions MakePackedAPI writes into the host function."""

    def __init__(self, host: _HostInterpreter, values: Sequence | None):
        self.host = host
        self.values = values
        self.memo: dict[int, object] = {}

    def eval(self, e):
        p = tvm.ir.prim.expr
        if isinstance(e, (int, float, bool)):
            return e
        if isinstance(e, tvm.tirx.IntImm):
            return bool(e.value) if dtype_of(e) == "bool" else int(e.value)
        if isinstance(e, tvm.tirx.FloatImm):
            return float(e.value)
        if isinstance(e, tvm.ir.StringImm):
            return e.value
        if isinstance(e, tvm.ir.Var):
            return self._var(e)
        if isinstance(e, p.Cast):
            return _cast(self.eval(e.value), dtype_of(e))
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
        binary = _BINARY.get(type(e))
        if binary is not None:
            a, b = self.eval(e.a), self.eval(e.b)
            result = binary(a, b)
            dtype = dtype_of(e)
            return _cast(result, dtype) if dtype and dtype != "bool" else result
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
        if handle is _ARGS:
            param = params[index]
            if kind == _ANY_TYPE_INDEX:
                if param.is_buffer:
                    return _TYPE_DLTENSOR_PTR
                if param.dtype == "bool":
                    return _TYPE_BOOL
                return _TYPE_FLOAT if param.dtype.startswith(("float", "bfloat")) else _TYPE_INT
            if kind == _ANY_VALUE:
                if param.is_buffer:
                    return _Tensor(index)
                if self.values is None:
                    raise _NeedsArguments
                return self.values[index].item()
        elif isinstance(handle, _Tensor):
            if kind == _ARR_DATA:
                return _Data(handle.param)
            if kind == _ARR_SHAPE:
                return _ShapeArray(handle.param)
            if kind == _ARR_STRIDES:
                return _NULL
            if kind == _ARR_NDIM:
                return len(params[handle.param].shape)
            if kind == _ARR_BYTE_OFFSET or kind == _ARR_DEVICE_ID:
                return 0
            if kind == _ARR_DEVICE_TYPE:
                return _DL_OPENCL
        elif isinstance(handle, _ShapeArray) and kind == _INT64_ARRAY_ELEM:
            extent = params[handle.param].shape[index]
            if isinstance(extent, int):
                return extent
            if self.values is None:
                raise _NeedsArguments
            return int(self.values[handle.param].shape[index])
        raise UnsupportedKernelError(
            f"a read of field kind {kind} from {handle!r}",
            self.host.func_name,
            "Report this kernel: its host code is not the one MakePackedAPI writes.",
        )


def _string(expr) -> str | None:
    return expr.value if isinstance(expr, tvm.ir.StringImm) else None


def _trunc_div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


def _trunc_mod(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _trunc_div(a, b)
    return math.fmod(a, b)


_BINARY = {
    tvm.ir.prim.expr.Add: lambda a, b: a + b,
    tvm.ir.prim.expr.Sub: lambda a, b: a - b,
    tvm.ir.prim.expr.Mul: lambda a, b: a * b,
    tvm.ir.prim.expr.Div: _trunc_div,
    tvm.ir.prim.expr.Mod: _trunc_mod,
    tvm.ir.prim.expr.FloorDiv: lambda a, b: a // b,
    tvm.ir.prim.expr.FloorMod: lambda a, b: a % b,
    tvm.ir.prim.expr.Min: min,
    tvm.ir.prim.expr.Max: max,
    tvm.ir.prim.expr.EQ: lambda a, b: a == b,
    tvm.ir.prim.expr.NE: lambda a, b: a != b,
    tvm.ir.prim.expr.LT: lambda a, b: a < b,
    tvm.ir.prim.expr.LE: lambda a, b: a <= b,
    tvm.ir.prim.expr.GT: lambda a, b: a > b,
    tvm.ir.prim.expr.GE: lambda a, b: a >= b,
    tvm.ir.prim.expr.LShift: lambda a, b: a << b,
    tvm.ir.prim.expr.RShift: lambda a, b: a >> b,
    tvm.ir.prim.expr.BitwiseAnd: lambda a, b: a & b,
    tvm.ir.prim.expr.BitwiseOr: lambda a, b: a | b,
    tvm.ir.prim.expr.BitwiseXor: lambda a, b: a ^ b,
}


def _cast(value, dtype: str | None):
    """``value`` converted as a TIR ``Cast`` to ``dtype`` would (integers wrap)."""
    if dtype is None or not isinstance(value, (int, float, bool)):
        return value
    if dtype == "bool":
        return bool(value)
    if dtype.startswith(("int", "uint")):
        return int(np.array(int(value), dtype=np.int64).astype(dtype))
    return float(np.array(value, dtype=np.float64).astype(numpy_dtype(dtype)))


def written_pointers(kernel: tvm.tirx.PrimFunc) -> set[str]:
    """Names of the pointer parameters ``kernel`` may write through.

    A buffer counts as written when it is stored to or its address escapes (``address_of`` for an
    atomic, ``tvm_access_ptr``, a pointer handed to an extern function): over-approximate, never
    under.
    """
    pointers = {p.__chandle__(): p.name for p in kernel.params if is_pointer_var(p)}
    data_of: dict[int, int] = {}
    touched: set[int] = set()
    escaped: set[int] = set()

    def on_decl(decl):
        if isinstance(decl.data, tvm.ir.Var):
            data_of[decl.buffer.__chandle__()] = decl.data.__chandle__()

    def on_store(store):
        touched.add(store.buffer.__chandle__())

    def on_call(call):
        name = op_name(call)
        if name == "tirx.address_of":
            for arg in call.args:
                if isinstance(arg, tvm.ir.TensorLoad):
                    touched.add(arg.source.__chandle__())
        elif name != "tirx.buffer_data":
            for arg in call.args:
                if is_pointer_var(arg) or is_buffer_var(arg):
                    escaped.add(arg.__chandle__())

    structural_walk(
        kernel.body,
        [
            (tvm.tirx.DeclBuffer, on_decl),
            (tvm.tirx.BufferStore, on_store),
            (tvm.ir.Call, on_call),
        ],
    )
    written = {data_of.get(b, b) for b in touched | escaped}
    return {pointers[p] for p in written if p in pointers}


def _contains_launch(stmt) -> bool:
    found = []

    def visit(call):
        if op_name(call) == "tirx.call_ffi_kernel":
            found.append(call)

    structural_walk(stmt, [(tvm.ir.Call, visit)])
    return bool(found)

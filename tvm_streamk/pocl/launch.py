"""The kernel launches of one lowered PrimFunc, as records the PoCL runner replays.

:func:`extract_launches` reads them from the lowered host function (through
:class:`~.host_code.HostCode`, the reader of TVM's host calling convention): for every launch,
which PrimFunc parameter or workspace each pointer is, what each scalar is, and the grid and block
extents. Values that depend on the call (symbolic shapes, scalar parameters) stay
:class:`Deferred` until :meth:`LaunchPlan.resolve` is given the call's arguments.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm

from .._compat import (
    DYN_SHARED_LAUNCH_PARAM,
    is_buffer_var,
    is_pointer_var,
    op_name,
    prim_dtype_of,
    structural_walk,
)
from .errors import UnsupportedKernelError
from .host_code import HostCode, KernelCall, NeedsArguments, ParamData
from .signature import Param

_GRID_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
_BLOCK_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


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


@dataclass
class LaunchPlan:
    """Every launch of one host function, and the workspaces it allocates."""

    launches: tuple[Launch, ...]
    workspaces: tuple[Workspace, ...]
    _host: HostCode = field(repr=False)

    def resolve(self, values: Sequence) -> tuple[list[ResolvedLaunch], list[int]]:
        """Concrete launches and workspace byte sizes for a call with ``values`` (checked args)."""

        def concrete(x):
            return self._host.evaluate(x.expr, values) if isinstance(x, Deferred) else x

        for check in self._host.checks:
            # As the compiled host function does before its first launch.
            if not bool(self._host.evaluate(check.condition, values)):
                raise getattr(builtins, check.kind, RuntimeError)(check.message)
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
    host = HostCode(host_func, params, func_name)
    workspaces = tuple(
        Workspace(a.name, a.dtype, tuple(_fold(host, s) for s in a.shape)) for a in host.allocations
    )
    launches = tuple(
        _launch(host, host.kernel_call(call, guards, device_funcs), device_funcs, workspaces)
        for call, guards in host.calls
    )
    return LaunchPlan(launches, workspaces, host)


def _fold(host: HostCode, expr):
    """``expr`` evaluated now if it does not depend on the call, else :class:`Deferred`."""
    try:
        return host.evaluate(expr, None)
    except NeedsArguments:
        return Deferred(expr)


def _launch(host: HostCode, call: KernelCall, device_funcs: dict, workspaces: tuple) -> Launch:
    """The :class:`Launch` of one kernel call of the host function."""
    kernel = call.kernel
    written = written_pointers(device_funcs[kernel])
    args = []
    for kparam, host_arg in zip(device_funcs[kernel].params, call.args):
        if not is_pointer_var(kparam):
            args.append(ScalarArg(kparam.name, prim_dtype_of(kparam), _fold(host, host_arg)))
            continue
        ref = host.evaluate(host_arg, None)
        out = kparam.name in written
        if isinstance(ref, ParamData):
            args.append(BufferArg(kparam.name, ref.param, host.params[ref.param].name, out))
        elif isinstance(ref, int) and not isinstance(ref, bool):
            args.append(WorkspaceArg(kparam.name, ref, workspaces[ref].name, out))
        else:
            raise UnsupportedKernelError(
                f"a pointer argument {kparam.name!r} = {host_arg} that is neither a parameter "
                "nor a host allocation",
                kernel,
                "Pass the buffer as a PrimFunc parameter.",
            )
    grid, block = [1, 1, 1], [1, 1, 1]
    for tag, extent in call.extents:
        if tag in _GRID_TAGS:
            grid[_GRID_TAGS.index(tag)] = _fold(host, extent)
        elif tag in _BLOCK_TAGS:
            block[_BLOCK_TAGS.index(tag)] = _fold(host, extent)
        elif tag.endswith(DYN_SHARED_LAUNCH_PARAM):
            raise UnsupportedKernelError(
                "dynamic shared memory ('shared.dyn')",
                kernel,
                "TVM's OpenCL codegen turns it into private memory; use static 'shared' buffers.",
            )
        else:
            raise UnsupportedKernelError(
                f"the launch parameter {tag!r}",
                kernel,
                "Schedule without it (only blockIdx/threadIdx launches map onto OpenCL).",
            )
    guards = tuple(_fold(host, g) for g in call.guards)
    return Launch(kernel, tuple(args), tuple(grid), tuple(block), guards)


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

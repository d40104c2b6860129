"""Per-block buffers of a dynamic-shape kernel sized by their compile-time bound.

A tile of a kernel whose M is a run-time value may hang over the matrix edge, so TVM's
``CompactBufferAllocation`` sizes the tile's register and shared buffers as the tile clipped to
the matrix: ``C_local[min(m, 2) * 2]``, ``A_shared[min(m, 16) * 8]``. Register and shared memory
are sized at compile time (OpenCL and CUDA codegen refuse the allocation: "Can only handle
constant size stack allocation"), and the clip never exceeds the tile. ``BoundRunTimeAllocations``
runs after TVM's pipeline and gives each such allocation the upper bound of its extent (the
unclipped tile): the accesses stay within the smaller run-time region, so the larger allocation
changes no index. Dynamic shared memory (``shared.dyn``, where TVM merges shared buffers) is
sized by the launch: its extent keeps its run-time value, and must have a bound too. An extent
without a finite bound is refused with its buffer's name.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import (
    arith,
    buffer_type_like,
    dtype_of,
    op_name,
    structural_map,
    structural_walk,
)
from ..errors import StreamKError
from ..register_estimate import lowered_prefix
from ._ir import LAUNCH_OP, map_prim_funcs

# Storage a kernel sizes at compile time.
_STATIC_SCOPES = ("local", "shared", "warp")
# Storage the launch sizes (dynamic shared memory, where TVM merges shared buffers): kept at its
# run-time size, refused without a compile-time bound.
_LAUNCH_SCOPES = ("shared.dyn",)
COND_ALLOCATION = "run-time-allocation"


def _variables(expr) -> set:
    """The handles of the variables ``expr`` reads."""
    found: set = set()
    structural_walk(expr, (tirx.Var, lambda v: found.add(v.__chandle__())))
    return found


def _bound(buf, extent, analyzer) -> int:
    """The compile-time bound of ``extent``, one of ``buf``'s; refused when it has none."""
    high = analyzer.const_int_bound(extent).max_value
    if high >= arith.ConstIntBound.POS_INF:
        scope = str(buf.ty.storage_scope)
        consequence = (
            "launched, it would ask for shared memory that grows with the run-time axis"
            if scope in _LAUNCH_SCOPES
            else "stock TVM's code generators refuse it too"
        )
        raise StreamKError(
            COND_ALLOCATION,
            f"the {scope} buffer {buf.name} has the extent {extent}, which has no "
            "compile-time bound: TVM's buffer compaction did not narrow it to one block's part "
            f"of the run-time axis ({consequence})",
            "Tile the run-time axis (sch.split with a constant inner factor) so each "
            "block's part of it is constant. If it is tiled, TVM could not bound the "
            "copy into this buffer within a tile: a Stream-K walk bounds such copies "
            "where the kernel as written does not (policy='stream_k').",
        )
    return high


def _bounded(buf, analyzer):
    """A buffer variable like ``buf`` with constant extents, or None when they already are."""
    ty = buf.ty
    if all(isinstance(e, tirx.IntImm) for e in ty.shape):
        return None
    shape = [
        e if isinstance(e, tirx.IntImm) else tirx.IntImm(dtype_of(e), _bound(buf, e, analyzer))
        for e in ty.shape
    ]
    new_ty = buffer_type_like(ty, shape=shape)
    return tvm.ir.Var(buf.name, new_ty)


def bound_allocations(func: tirx.PrimFunc, known=()) -> tirx.PrimFunc:
    """``func`` with every register/shared allocation of run-time size at its bound (one of
    dynamic shared memory checked for a bound, its size left to the launch); ``known``:
    ``(parameter, value)`` pairs, what the host binds a kernel's parameters to."""
    dynamic, launched = [], []

    def on_alloc(stmt: tirx.AllocBuffer) -> None:
        ty = stmt.buffer.ty
        if all(isinstance(e, tirx.IntImm) for e in ty.shape):
            return
        if str(ty.storage_scope) in _STATIC_SCOPES:
            dynamic.append(stmt.buffer)
        elif str(ty.storage_scope) in _LAUNCH_SCOPES:
            launched.append(stmt.buffer)

    structural_walk(func.body, (tirx.AllocBuffer, on_alloc))
    if not dynamic and not launched:
        return func
    # Common-subexpression elimination may have bound part of an extent to a variable
    # (``cse_v6 * 56``), here or in the host: bound the variables first. Only those the extents
    # depend on, in definition order, and only in a kernel with such an extent: the analyzer
    # bounds each value it is given, and binding every one of a ragged walk's took 7 s of the
    # 11.5 s that building a ragged-K kernel took (3.5 s now).
    bindings = list(known)
    structural_walk(func.body, (tirx.Bind, lambda stmt: bindings.append((stmt.var, stmt.value))))
    needed = set()
    for buf in dynamic + launched:
        for extent in buf.ty.shape:
            needed |= _variables(extent)
    used = []
    for var, value in reversed(bindings):
        if var.__chandle__() in needed:
            needed |= _variables(value)
            used.append((var, value))
    analyzer = arith.Analyzer()
    for var, value in reversed(used):
        try:
            analyzer.bind(var, value)
        except Exception:  # noqa: BLE001 - a variable bound twice keeps its first value
            pass
    for buf in launched:
        for extent in buf.ty.shape:
            _bound(buf, extent, analyzer)
    renamed = {buf.__chandle__(): _bounded(buf, analyzer) for buf in dynamic}
    body = structural_map(func.body, (tvm.ir.Var, lambda v: renamed.get(v.__chandle__(), v)))
    return func.with_body(body)


def bounded_as_written(func: tirx.PrimFunc) -> bool:
    """Whether TVM's lowering of ``func`` as written (up to buffer compaction,
    :func:`~tvm_streamk.register_estimate.lowered_prefix`, 10-40 ms) leaves every register
    and shared buffer an extent with a compile-time bound: what :func:`bound_allocations`
    needs to build it at a run-time size. A kernel the prefix cannot lower counts as bounded:
    it is built as written, and its own build says what fails."""
    try:
        lowered = lowered_prefix(tvm.IRModule({"main": func}), concrete=False)["main"]
    except Exception:  # noqa: BLE001 - TVM raises assorted types; the build reports them
        return True
    try:
        bound_allocations(lowered)
    except StreamKError:
        return False
    return True


@tvm.transform.module_pass(opt_level=0, name="tvm_streamk.BoundRunTimeAllocations")
def BoundRunTimeAllocations(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass
    """The module pass of :func:`bound_allocations` (module docstring)."""
    known = _host_bindings(mod)
    return map_prim_funcs(mod, lambda name, func: bound_allocations(func, known.get(name, ())))


def _host_bindings(mod: tvm.IRModule) -> dict[str, list]:
    """Per kernel name, ``(parameter, value)`` for each parameter a host function passes a
    variable it binds (``Bind``): common-subexpression elimination hoists an extent that two
    kernels of one call share (``min(m, 2) * 2``) into the host, and the kernels get it as a
    parameter."""
    kernels = {
        gv.name_hint: func for gv, func in mod.functions.items() if isinstance(func, tirx.PrimFunc)
    }
    known: dict[str, list] = {}
    for func in kernels.values():
        binds: dict = {}

        def on_bind(stmt, binds=binds) -> None:
            binds.setdefault(stmt.var.__chandle__(), stmt.value)

        structural_walk(func.body, (tirx.Bind, on_bind))
        if not binds:
            continue

        def on_call(call, binds=binds) -> None:
            if op_name(call) != LAUNCH_OP or not call.args:
                return
            name = getattr(call.args[0], "value", None)
            kernel = kernels.get(name)
            if kernel is None:
                return
            for param, arg in zip(kernel.params, call.args[1:]):
                value = binds.get(arg.__chandle__()) if isinstance(arg, tvm.ir.Var) else None
                if value is not None:
                    known.setdefault(name, []).append((param, value))

        structural_walk(func.body, (tvm.ir.Call, on_call))
    return known

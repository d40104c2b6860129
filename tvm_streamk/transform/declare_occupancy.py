"""The persistent kernel declares the resident blocks per SM its grid was sized for.

A persistent grid of ``num_sms x blocks_per_sm`` blocks runs in one wave only if every SM holds
``blocks_per_sm`` of them; one block too many per SM and the last ones wait for a second,
nearly empty wave, which costs more than Stream-K gains. The decision sizes the grid from the
data-parallel kernel's occupancy without compiling the Stream-K kernel (``schedule.py``), so
the kernel states the count instead: ``__launch_bounds__(threads, blocks_per_sm)``, and ptxas
keeps the registers within what that many blocks may use (the ptxas suite checks that it does
so without spills).

``LowerStreamK`` marks the persistent loop's body (:func:`mark`); after TVM's pipeline has split
host from device, :func:`DeclareOccupancy` moves the mark of each CUDA kernel to the function
attribute TVM's CUDA code generator prints as the second argument of ``__launch_bounds__``, and
drops it elsewhere.
"""

from __future__ import annotations

import contextlib
import threading

import tvm
from tvm import tirx

from .._compat import structural_map, structural_walk

__all__ = ["DeclareOccupancy", "mark", "suspended"]

MARK = "tvm_streamk.min_blocks_per_sm"
LAUNCH_BOUNDS = "tirx.launch_bounds_min_blocks_per_sm"
_state = threading.local()


@contextlib.contextmanager
def suspended():
    """Builds inside the ``with`` block declare nothing: for reading the registers a kernel
    takes when free to (the decision's exact path, ``schedule.py``)."""
    before = getattr(_state, "suspended", False)
    _state.suspended = True
    try:
        yield
    finally:
        _state.suspended = before


def mark(body: tirx.Stmt, blocks_per_sm: int) -> tirx.Stmt:
    """``body`` (a persistent block's work) marked with the resident blocks it was sized for."""
    return tirx.AttrStmt(0, MARK, tirx.IntImm("int32", int(blocks_per_sm)), body)


def _declare(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
    found: list[int] = []
    structural_walk(
        func.body,
        (tirx.AttrStmt, lambda a: found.append(int(a.value)) if a.attr_key == MARK else None),
    )
    if not found:
        return func
    func = func.with_body(
        structural_map(func.body, (tirx.AttrStmt, lambda a: a.body if a.attr_key == MARK else a))
    )
    target = func.attrs.get("target") if func.attrs is not None else None
    if target is None or target.kind.name != "cuda" or getattr(_state, "suspended", False):
        return func
    # Two persistent loops in one kernel (never built today) would share its launch bounds.
    return func.with_attr(LAUNCH_BOUNDS, min(found))


def DeclareOccupancy() -> tvm.transform.Pass:
    """Turn the marks of :func:`mark` into ``__launch_bounds__`` of the CUDA kernels."""
    return tvm.tirx.transform.prim_func_pass(
        _declare, opt_level=0, name="tvm_streamk.DeclareOccupancy"
    )

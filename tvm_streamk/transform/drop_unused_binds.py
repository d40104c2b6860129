"""``DropUnusedBinds``: bindings of the Stream-K walk that nothing reads leave the kernel.

The walk binds its unit range, tile and panel range (``sk_lo``, ``sk_hi``, ``sk_tile``,
``sk_k_begin``, ...) at the top of the persistent kernel. Where the plan makes them constants
(a block per whole tile, nothing split) TVM's simplifier folds every use and leaves the
bindings, which the OpenCL code generator prints as nine dead scalars before the K loop. nvcc
drops them; pip's PoCL 3.0 keeps them live across the K loop's barriers (its work-group loops
save such values per work-item), and the kernel, whose body is otherwise the data-parallel
kernel's line for line, ran 30% slower: dlight's fp32 matmul of 96 x 64 x 16384, 3 tiles on 3
blocks, 52 ms against data-parallel's 40 ms (medians of 5 rounds); without the dead scalars
40 ms (``tests/transform/test_hot_loop.py::test_time_on_pip_pocl``).

A binding is dropped when its variable is read nowhere and its value calls nothing (only
arithmetic on variables and constants: nothing to keep for its effect), until no more go.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import structural_map, structural_walk
from ._ir import map_prim_funcs

__all__ = ["DropUnusedBinds", "drop_unused_binds"]


def _calls(expr) -> bool:
    found = [False]

    def on_call(_call) -> None:
        found[0] = True

    structural_walk(expr, (tvm.ir.Call, on_call))
    return found[0]


def _dead(func: tirx.PrimFunc) -> set:
    """Handles of the variables of ``func``'s droppable bindings."""
    uses: dict = {}

    def on_var(var) -> None:
        uses[var.__chandle__()] = uses.get(var.__chandle__(), 0) + 1

    bound = []
    structural_walk(func.body, (tirx.Var, on_var))
    structural_walk(func.body, (tirx.Bind, bound.append))
    # A binding's own variable is one occurrence: read nowhere else, it is unused.
    return {
        b.var.__chandle__()
        for b in bound
        if uses.get(b.var.__chandle__(), 0) <= 1 and not _calls(b.value)
    }


def drop_unused_binds(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` without the bindings nothing reads (module docstring)."""
    while dead := _dead(func):

        def on_seq(seq):
            kept = [
                s for s in seq.seq if not (isinstance(s, tirx.Bind) and s.var.__chandle__() in dead)
            ]
            if len(kept) == len(seq.seq):
                return seq
            if not kept:
                return tirx.Evaluate(tirx.IntImm("int32", 0))
            return kept[0] if len(kept) == 1 else tirx.SeqStmt(kept)

        body = structural_map(func.body, (tirx.SeqStmt, on_seq))
        if body.same_as(func.body):
            break
        func = func.with_body(body)
    return func


@tvm.transform.module_pass(opt_level=0, name="tvm_streamk.DropUnusedBinds")
def DropUnusedBinds(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass
    """The module pass of :func:`drop_unused_binds`, for every PrimFunc."""
    return map_prim_funcs(mod, lambda _, func: drop_unused_binds(func))

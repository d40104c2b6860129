"""``DropUnusedBinds``: the walk's bindings that nothing reads leave a persistent kernel's code.

The walk binds its unit range, tile and panel range (``sk_lo``, ``sk_hi``, ``sk_tile``,
``sk_k_begin``, ...) at the top of the persistent kernel. TVM's simplifier substitutes every
pure integer binding into its uses and leaves the binding, which the OpenCL code generator
prints as a dead scalar. nvcc drops them. pip's PoCL 3.0 pays for them: its work-group loops
save values that live across a barrier once per work-item, and it seems not to drop these
first (the mechanism is inferred; the cost is measured). With one whole tile per block
(nothing split) the Stream-K kernel, otherwise the data-parallel kernel's line for line, ran
30% slower: dlight's fp32 matmul of 96 x 64 x 16384, 3 tiles on 3 blocks, 52 ms against
data-parallel's 40 ms (medians of 7 interleaved rounds); without its dead scalars 40 ms
(``tests/transform/test_hot_loop.py::test_time_on_pip_pocl``, marked slow).

Two steps, because the bindings stay useful in the pipeline's output (the index-width tests
evaluate the walk's closed forms from them, ``tests/transform/test_index_width.py``):

- :func:`mark_persistent` (in the pipeline, once host and device code are split): the kernels
  launched by a function ``LowerStreamK`` rewrote (:data:`LOWERED_ATTR`) get :data:`ATTR`.
- :data:`DropUnusedBinds` (first of the device finalization): in the marked kernels, a binding
  is dropped when its variable is read nowhere and its value calls nothing that acts
  (arithmetic, ``if_then_else``, reads: nothing to keep for its effect), until no more go.

It runs before TVM's own finalization, whose ``StmtSimplify`` then inlines the common
subexpressions TVM's CSE pass bound (``cse_v1``, ...) and leaves those bindings dead in every
kernel, data-parallel's too; they stay, as in TVM's own kernels. Dropping them as well, after
the finalization, made the split kernel slower on pip's PoCL: the 96 x 64 x 16384 matmul on 2
blocks (3 tiles) took 0.94-0.98x data-parallel's time, against 0.86-0.88x with them.
Kernels the project did not rewrite (a data-parallel decision) stay TVM's own.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import structural_map, structural_walk
from ._ir import launched_by, map_prim_funcs

__all__ = [
    "ATTR",
    "LOWERED_ATTR",
    "DropUnusedBinds",
    "MarkPersistent",
    "drop_unused_binds",
    "mark_persistent",
]

# On a function LowerStreamK rewrote into a persistent walk.
LOWERED_ATTR = "tvm_streamk.persistent"
# On a device kernel such a function launches.
ATTR = "tvm_streamk.persistent_kernel"


# A call at most this effectful can go unread: it reads state at most (TVM removes an unread let
# by the same line). ``if_then_else`` is pure, ``likely`` an annotation; an extern, an
# atomic or a call to another function may act.
_DROPPABLE = int(tirx.CallEffectKind.ReadState.value)


def _calls(expr) -> bool:
    """Whether ``expr`` calls anything that may act (an effect beyond reading)."""
    found = [False]

    def on_call(call) -> None:
        op = call.op
        effect = op.get_attr("TCallEffectKind") if isinstance(op, tvm.ir.Op) else None
        found[0] = found[0] or effect is None or int(effect) > _DROPPABLE

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

        def on_seq(seq, dead=dead):
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


def _marked(func: tirx.PrimFunc, attr: str) -> bool:
    return func.attrs is not None and attr in func.attrs


def mark_persistent(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with :data:`ATTR` on every kernel a rewritten function launches."""
    names = launched_by(mod, LOWERED_ATTR)
    if not names:
        return mod
    return map_prim_funcs(
        mod.clone(), lambda name, func: func.with_attr(ATTR, True) if name in names else func
    )


@tvm.transform.module_pass(opt_level=0, name="tvm_streamk.MarkPersistent")
def MarkPersistent(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass
    """The module pass of :func:`mark_persistent`."""
    return mark_persistent(mod)


@tvm.transform.module_pass(opt_level=0, name="tvm_streamk.DropUnusedBinds")
def DropUnusedBinds(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass
    """The module pass of :func:`drop_unused_binds`, for every kernel marked :data:`ATTR`."""
    return map_prim_funcs(
        mod, lambda _, func: drop_unused_binds(func) if _marked(func, ATTR) else func
    )

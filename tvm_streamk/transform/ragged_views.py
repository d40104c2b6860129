"""``LowerRaggedViews``: a grouped GEMM's view accesses become guarded accesses of real buffers.

A view ``V`` of the real buffer ``R`` (:mod:`tvm_streamk.analysis.ragged`) is addressed
``V[g, i, *rest]``; its element is ``R[offsets[g] + i, *rest]`` while ``i`` is below group
``g``'s row count. The pass rewrites, in every function declaring views:

- a store ``V[g, i, *rest] = v`` into ``if i < rows(g): R[offsets[g] + i, *rest] = v``;
- an atomic add on ``&V[g, i, *rest]`` (the atomic fix-up) into the guarded atomic on ``R``;
- any other load ``V[g, i, *rest]`` into ``rows(g) > i ? R[offsets[g] + i, *rest] : 0``;

and the blocks' regions of a view into the whole real buffer, then drops the views and the
declaration. It runs after ``LowerStreamK`` and before TVM's pipeline, on data-parallel and
Stream-K kernels alike.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import (
    SBlock,
    SBlockRealize,
    dtype_of,
    loaded_buffer,
    replace_block,
    structural_map,
    structural_walk,
)
from ..analysis.ragged import RAGGED_ATTR, RaggedViews, ragged_views
from ._ir import cast_to, whole


def _address_of_view(call, views: RaggedViews) -> bool:
    return (
        isinstance(call, tvm.ir.Call)
        and call.op.same_as(tvm.ir.Op.get("tirx.address_of"))
        and isinstance(call.args[0], tvm.ir.TensorLoad)
        and views.real_of(call.args[0].source) is not None
    )


class _Rewriter:
    def __init__(self, views: RaggedViews):
        self.views = views

    def real(self, view: tirx.Buffer, indices):
        """The real buffer, its indices, and the condition the element exists under."""
        real = self.views.real_of(view)
        g, i, *rest = indices
        row = self.views.start(g) + cast_to("int64", i)
        row = cast_to(dtype_of(real.shape[0]), row) if dtype_of(real.shape[0]) != "int64" else row
        valid = cast_to("int64", i) < self.views.rows(g)
        return real, [row, *rest], valid

    def guard_atomics(self, stmt):
        """Evaluate nodes whose atomic adds address a view: the guarded atomic on the real one."""
        conditions = []

        def address(call):
            if not _address_of_view(call, self.views):
                return call
            load = call.args[0]
            real, indices, valid = self.real(load.source, load.indices)
            conditions.append(valid)
            return tirx.address_of(tirx.BufferLoad(real, indices))

        def evaluate(node):
            hits = []
            structural_walk(
                node,
                (
                    tvm.ir.Call,
                    lambda c: hits.append(c) if _address_of_view(c, self.views) else None,
                ),
            )
            if not hits:
                return node
            conditions.clear()
            mapped = structural_map(node, (tvm.ir.Call, address))
            cond = conditions[0]
            for extra in conditions[1:]:
                cond = tirx.And(cond, extra)
            return tirx.IfThenElse(cond, mapped, None)

        return structural_map(stmt, (tirx.Evaluate, evaluate))

    def accesses(self, stmt):
        def store(node):
            if self.views.real_of(node.buffer) is None:
                return node
            real, indices, valid = self.real(node.buffer, node.indices)
            return tirx.IfThenElse(valid, tirx.BufferStore(real, node.value, indices), None)

        def load(node):
            if self.views.real_of(node.source) is None:
                return node
            real, indices, valid = self.real(node.source, node.indices)
            zero = tirx.const(0, str(real.dtype))
            return tirx.if_then_else(valid, tirx.BufferLoad(real, indices), zero)

        def regions(block):
            def widen(region_list):
                out = []
                for region in region_list:
                    real = self.views.real_of(loaded_buffer(region))
                    out.append(region if real is None else whole(real))
                return out

            reads = widen(block.reads)
            if any(self.views.real_of(loaded_buffer(r)) is not None for r in block.reads) or any(
                self.views.real_of(loaded_buffer(w)) is not None for w in block.writes
            ):
                reads = [*reads, whole(self.views.offsets)]
            return replace_block(block, reads=reads, writes=widen(block.writes))

        # Regions first (they hold views by reference), then the accesses.
        stmt = structural_map(stmt, (SBlock, regions))
        return structural_map(stmt, [(tirx.BufferStore, store), (tvm.ir.TensorLoad, load)])


def lower_views(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its ragged views lowered (unchanged without a declaration)."""
    views = ragged_views(func)
    if views is None:
        return func
    rewriter = _Rewriter(views)
    realize: SBlockRealize = func.body
    root = realize.block
    body = rewriter.accesses(rewriter.guard_atomics(root.body))
    view_buffers = [v for v, _ in views.views]
    kept = [b for b in root.alloc_buffers if not any(b.same_as(v) for v in view_buffers)]
    new_root = replace_block(root, body=body, alloc_buffers=kept)
    func = func.with_body(SBlockRealize(realize.iter_values, realize.predicate, new_root))
    return func.without_attr(RAGGED_ATTR)


def LowerRaggedViews() -> tvm.transform.Pass:
    """Lower the ragged views of every grouped function (see the module docstring)."""

    def run(func, _mod, _ctx):
        return lower_views(func)

    return tvm.tirx.transform.prim_func_pass(run, opt_level=0, name="tvm_streamk.LowerRaggedViews")

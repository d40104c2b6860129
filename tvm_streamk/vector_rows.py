"""``VectorRows``: a vector times a matrix, given a row, so it runs the matmul kernel.

A Relax pass for batch invariance (docs/batch_invariance.md). Under the mode every M of one
weight runs one matmul kernel: ``StreamKMatmul`` makes a static row count a run-time extent
(:mod:`tvm_streamk.transform.run_time_rows`). A left operand without a row axis, a vector
``x[K]`` times ``W[K, N]`` (``nn.Linear`` on one token without a batch axis), has no row count
to make run-time: its kernel is a GEMV, which reduces K in its own order, so the token's output
would differ from the same token's row in a batch. This pass rewrites each such
``R.matmul(x, W)`` into ``R.squeeze(R.matmul(R.expand_dims(x, [0]), W), [-2])`` before
legalization: the matmul then has one row, which the rule makes run-time like any other, and
the row is dropped by a reshape. What the matmul's consumers computed on the vector they now
compute on the squeezed row, in a kernel of their own instead of the matmul's epilogue (the
same operations on the same values: the same bits).
"""

from __future__ import annotations

import tvm
from tvm import relax

_MATMUL = tvm.ir.Op.get("relax.matmul")


def _ndim(expr) -> int:
    ty = expr.ty
    return int(ty.ndim) if isinstance(ty, relax.TensorType) else -1


@relax.expr_functor.mutator
class _VectorRows(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        args = call.args
        if not call.op.same_as(_MATMUL) or _ndim(args[0]) != 1 or _ndim(args[1]) < 2:
            return call
        row = self.builder_.emit(relax.op.expand_dims(args[0], [0]))
        out_dtype = call.attrs.out_dtype
        product = self.builder_.emit(relax.op.matmul(row, args[1], out_dtype=out_dtype))
        return relax.op.squeeze(product, [-2])


@tvm.transform.module_pass(opt_level=0, name="tvm_streamk.VectorRows")
def VectorRows(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - a pass, named as one
    """Give every vector-times-matrix ``R.matmul`` of ``mod``'s Relax functions a row (see the
    module's docstring); other calls and functions are left as they are.

    Examples
    --------
    Before::

        y = R.matmul(x, w)  # x: R.Tensor((64,)), w: R.Tensor((64, 40))

    After::

        lv = R.expand_dims(x, axis=[0])
        lv1 = R.matmul(lv, w)
        y = R.squeeze(lv1, axis=[-2])
    """
    mutator = _VectorRows(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()

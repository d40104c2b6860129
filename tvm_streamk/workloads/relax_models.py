"""Relax models of the kernels, for the paths that schedule what Relax hands them (dlight)."""

from __future__ import annotations

import tvm


def relax_matmul(M: int, N: int, K: int, dtype: str = "float32") -> tvm.IRModule:
    """``matmul(a[M, K], b[K, N])`` as a Relax model, legalized to TensorIR as dlight gets it."""
    from tvm import relax

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((M, K), dtype))
    b = relax.Var("b", relax.TensorType((K, N), dtype))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            c = bb.emit_output(relax.op.matmul(a, b))
        bb.emit_func_output(c)
    return relax.transform.LegalizeOps()(bb.get())

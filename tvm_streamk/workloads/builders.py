"""TVMScript builders of the reductions the project targets: GEMM, batched GEMM and GEMV.

Every builder returns an ``s_tir`` PrimFunc named ``main`` whose single reduction block is called
``"C"`` (``"C_update"`` after ``decompose_reduction``). Accumulation is always in ``acc_dtype``;
the stored output is cast to ``out_dtype`` where the two differ.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

from .errors import check_choice, check_extents, run_time_extent

LAYOUTS = ("NN", "NT", "TN")
IN_DTYPES = ("float32", "float16", "bfloat16", "int8")
EPILOGUES = (None, "bias_relu")


def gemm(
    M: int,
    N: int,
    K: int,
    *,
    layout: str = "NN",
    in_dtype: str = "float32",
    acc_dtype: str | None = None,
    out_dtype: str | None = None,
    epilogue: str | None = None,
    batch: int | None = None,
) -> tvm.tirx.PrimFunc:
    """``C = epilogue(A @ B)`` with A, B stored by ``layout`` ("NN", "NT" = B transposed, "TN").

    Parameters
    ----------
    M, N, K : int
        Problem extents. ``M`` may be a run-time extent: an integer ``tvm.tirx.Var`` or the
        name of a new int64 one (a dynamic-shape kernel, as Relax models with a symbolic token
        count have).
    layout : str
        "NN": A is (M, K), B is (K, N). "NT": B is (N, K). "TN": A is (K, M).
    in_dtype : str
        Dtype of A and B.
    acc_dtype : str, optional
        Accumulation dtype; ``"int32"`` for int8 inputs, else ``"float32"``.
    out_dtype : str, optional
        Dtype of C; defaults to ``acc_dtype``.
    epilogue : str, optional
        ``"bias_relu"`` adds a bias vector of length N (``acc_dtype``) and applies ReLU in the
        block that stores C, after the reduction (the shape a fused Relax epilogue takes).
    batch : int, optional
        When given, A, B and C get a leading batch axis (batched GEMM); a bias is one vector
        for every batch.
    """
    M = run_time_extent("M", M)
    check_extents(N=N, K=K, **({} if batch is None else {"batch": batch}))
    check_choice("layout", layout, LAYOUTS)
    check_choice("in_dtype", in_dtype, IN_DTYPES)
    check_choice("epilogue", epilogue, EPILOGUES)
    acc_dtype = acc_dtype or ("int32" if in_dtype == "int8" else "float32")
    out_dtype = out_dtype or acc_dtype
    a_shape = (M, K) if layout in ("NN", "NT") else (K, M)
    b_shape = (K, N) if layout in ("NN", "TN") else (N, K)
    lead = () if batch is None else (batch,)

    def a_at(A, b, i, k):
        idx = (i, k) if layout in ("NN", "NT") else (k, i)
        return A[(*b, *idx)]

    def b_at(B, b, k, j):
        idx = (k, j) if layout in ("NN", "TN") else (j, k)
        return B[(*b, *idx)]

    def prod(A, B, b, i, k, j):
        return T.Cast(acc_dtype, a_at(A, b, i, k)) * T.Cast(acc_dtype, b_at(B, b, k, j))

    zero = tvm.tirx.const(0, acc_dtype)
    batched = batch is not None
    if epilogue is None and out_dtype == acc_dtype:
        return _plain_gemm(
            lead, a_shape, b_shape, (M, N, K), in_dtype, acc_dtype, prod, zero, batched
        )
    return _gemm_with_epilogue(
        lead,
        a_shape,
        b_shape,
        (M, N, K),
        in_dtype,
        acc_dtype,
        out_dtype,
        epilogue,
        prod,
        zero,
        batched,
    )


# fmt: off
def _plain_gemm(lead, a_shape, b_shape, mnk, in_dtype, acc_dtype, prod, zero, batched):
    M, N, K = mnk
    c_shape = (*lead, M, N)
    if batched:
        @T.prim_func(s_tir=True)
        def main(A: T.Buffer((*lead, *a_shape), in_dtype), B: T.Buffer((*lead, *b_shape), in_dtype),
                 C: T.Buffer(c_shape, acc_dtype)):
            T.func_attr({"tirx.noalias": True})
            for bb, i, j, k in T.grid(lead[0], M, N, K):
                with T.sblock("C"):
                    vb, vi, vj, vk = T.axis.remap("SSSR", [bb, i, j, k])
                    with T.init():
                        C[vb, vi, vj] = zero
                    C[vb, vi, vj] = C[vb, vi, vj] + prod(A, B, (vb,), vi, vk, vj)
        return main

    @T.prim_func(s_tir=True)
    def main(A: T.Buffer(a_shape, in_dtype), B: T.Buffer(b_shape, in_dtype),
             C: T.Buffer(c_shape, acc_dtype)):
        T.func_attr({"tirx.noalias": True})
        for i, j, k in T.grid(M, N, K):
            with T.sblock("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = zero
                C[vi, vj] = C[vi, vj] + prod(A, B, (), vi, vk, vj)
    return main


def _gemm_with_epilogue(lead, a_shape, b_shape, mnk, in_dtype, acc_dtype, out_dtype, epilogue,
                        prod, zero, batched):
    M, N, K = mnk

    def finish(acc, bias_v):
        if epilogue == "bias_relu":
            acc = T.max(acc + bias_v, zero)
        return T.Cast(out_dtype, acc)

    if batched:
        return _batched_gemm_with_epilogue(
            lead[0], a_shape, b_shape, mnk, in_dtype, acc_dtype, out_dtype, epilogue, prod, zero,
            finish)
    if epilogue is None:
        @T.prim_func(s_tir=True)
        def main(A: T.Buffer(a_shape, in_dtype), B: T.Buffer(b_shape, in_dtype),
                 D: T.Buffer((M, N), out_dtype)):
            T.func_attr({"tirx.noalias": True})
            C = T.sblock_alloc_buffer((M, N), acc_dtype)
            for i, j, k in T.grid(M, N, K):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    with T.init():
                        C[vi, vj] = zero
                    C[vi, vj] = C[vi, vj] + prod(A, B, (), vi, vk, vj)
            for i, j in T.grid(M, N):
                with T.sblock("D"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    D[vi, vj] = finish(C[vi, vj], zero)
        return main

    @T.prim_func(s_tir=True)
    def main(A: T.Buffer(a_shape, in_dtype), B: T.Buffer(b_shape, in_dtype),
             bias: T.Buffer((N,), acc_dtype), D: T.Buffer((M, N), out_dtype)):
        T.func_attr({"tirx.noalias": True})
        C = T.sblock_alloc_buffer((M, N), acc_dtype)
        for i, j, k in T.grid(M, N, K):
            with T.sblock("C"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    C[vi, vj] = zero
                C[vi, vj] = C[vi, vj] + prod(A, B, (), vi, vk, vj)
        for i, j in T.grid(M, N):
            with T.sblock("D"):
                vi, vj = T.axis.remap("SS", [i, j])
                D[vi, vj] = finish(C[vi, vj], bias[vj])
    return main


def _batched_gemm_with_epilogue(batch, a_shape, b_shape, mnk, in_dtype, acc_dtype, out_dtype,
                                epilogue, prod, zero, finish):
    """The batched forms of :func:`_gemm_with_epilogue`: one bias vector for every batch."""
    M, N, K = mnk
    if epilogue is None:
        @T.prim_func(s_tir=True)
        def main(A: T.Buffer((batch, *a_shape), in_dtype), B: T.Buffer((batch, *b_shape), in_dtype),
                 D: T.Buffer((batch, M, N), out_dtype)):
            T.func_attr({"tirx.noalias": True})
            C = T.sblock_alloc_buffer((batch, M, N), acc_dtype)
            for bb, i, j, k in T.grid(batch, M, N, K):
                with T.sblock("C"):
                    vb, vi, vj, vk = T.axis.remap("SSSR", [bb, i, j, k])
                    with T.init():
                        C[vb, vi, vj] = zero
                    C[vb, vi, vj] = C[vb, vi, vj] + prod(A, B, (vb,), vi, vk, vj)
            for bb, i, j in T.grid(batch, M, N):
                with T.sblock("D"):
                    vb, vi, vj = T.axis.remap("SSS", [bb, i, j])
                    D[vb, vi, vj] = finish(C[vb, vi, vj], zero)
        return main

    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((batch, *a_shape), in_dtype), B: T.Buffer((batch, *b_shape), in_dtype),
             bias: T.Buffer((N,), acc_dtype), D: T.Buffer((batch, M, N), out_dtype)):
        T.func_attr({"tirx.noalias": True})
        C = T.sblock_alloc_buffer((batch, M, N), acc_dtype)
        for bb, i, j, k in T.grid(batch, M, N, K):
            with T.sblock("C"):
                vb, vi, vj, vk = T.axis.remap("SSSR", [bb, i, j, k])
                with T.init():
                    C[vb, vi, vj] = zero
                C[vb, vi, vj] = C[vb, vi, vj] + prod(A, B, (vb,), vi, vk, vj)
        for bb, i, j in T.grid(batch, M, N):
            with T.sblock("D"):
                vb, vi, vj = T.axis.remap("SSS", [bb, i, j])
                D[vb, vi, vj] = finish(C[vb, vi, vj], bias[vj])
    return main


def gemv(N: int, K: int, *, in_dtype: str = "float32", acc_dtype: str | None = None):
    """``y = W @ x`` with W of shape (N, K): one output row per reduction over K."""
    check_extents(N=N, K=K)
    check_choice("in_dtype", in_dtype, IN_DTYPES)
    acc_dtype = acc_dtype or ("int32" if in_dtype == "int8" else "float32")
    zero = tvm.tirx.const(0, acc_dtype)

    @T.prim_func(s_tir=True)
    def main(W: T.Buffer((N, K), in_dtype), x: T.Buffer((K,), in_dtype),
             y: T.Buffer((N,), acc_dtype)):
        T.func_attr({"tirx.noalias": True})
        for i, k in T.grid(N, K):
            with T.sblock("C"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    y[vi] = zero
                y[vi] = y[vi] + T.Cast(acc_dtype, W[vi, vk]) * T.Cast(acc_dtype, x[vk])
    return main
# fmt: on


def batched_gemm(batch: int, M: int, N: int, K: int, **kwargs) -> tvm.tirx.PrimFunc:
    """Batched GEMM: ``C[b] = A[b] @ B[b]`` (keyword arguments as for :func:`gemm`)."""
    return gemm(M, N, K, batch=batch, **kwargs)

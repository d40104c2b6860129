"""TVMScript builders of the reductions the project targets, and a reference GPU schedule.

Every builder returns an ``s_tir`` PrimFunc named ``main`` whose single reduction block is called
``"C"`` (``"C_update"`` after ``decompose_reduction``). Accumulation is always in ``acc_dtype``;
the stored output is cast to ``out_dtype`` where the two differ.

``reference_schedule`` writes the canonical data-parallel GPU nest that Stream-K rewrites: one
output tile of ``bm x bn`` per ``blockIdx``, a ``tm x tn`` register tile per thread, the K loop
split into panels of ``bk`` whose A/B slices are cooperatively staged in shared memory, and the
reduction decomposed at the panel loop so the accumulator is zeroed once per tile.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm.script import tirx as T

from ._compat import Schedule, param_buffers

LAYOUTS = ("NN", "NT", "TN")
IN_DTYPES = ("float32", "float16", "bfloat16", "int8")
EPILOGUES = (None, "bias_relu")


class WorkloadError(ValueError):
    """A workload was asked for with arguments it does not support."""


def _check(name: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise WorkloadError(f"{name} must be one of {list(allowed)}; found {value!r}")


def _check_extents(**extents: int) -> None:
    for name, value in extents.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise WorkloadError(f"{name} must be a positive int; found {value!r}")


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
        Problem extents.
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
        When given, every operand gets a leading batch axis (batched GEMM).
    """
    _check_extents(M=M, N=N, K=K, **({} if batch is None else {"batch": batch}))
    _check("layout", layout, LAYOUTS)
    _check("in_dtype", in_dtype, IN_DTYPES)
    _check("epilogue", epilogue, EPILOGUES)
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
    if batched:
        raise WorkloadError("a fused epilogue is built for unbatched GEMM only; found batch given")

    def finish(acc, bias_v):
        if epilogue == "bias_relu":
            acc = T.max(acc + bias_v, zero)
        return T.Cast(out_dtype, acc)

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


def gemv(N: int, K: int, *, in_dtype: str = "float32", acc_dtype: str | None = None):
    """``y = W @ x`` with W of shape (N, K): one output row per reduction over K."""
    _check_extents(N=N, K=K)
    _check("in_dtype", in_dtype, IN_DTYPES)
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


def reference_schedule(
    func: tvm.tirx.PrimFunc,
    *,
    bm: int = 32,
    bn: int = 32,
    bk: int = 8,
    tm: int = 4,
    tn: int = 4,
    block: str = "C",
) -> Schedule:
    """Schedule a GEMM built by :func:`gemm` as the canonical data-parallel GPU kernel.

    The nest is ``blockIdx.y x blockIdx.x`` over (bm x bn) output tiles (a leading batch axis gets
    ``blockIdx.z``), ``threadIdx.y x threadIdx.x`` over a (bm/tm x bn/tn) thread grid holding a
    (tm x tn) accumulator in ``local`` memory, and a K loop of panels of ``bk`` with A and B panels
    staged in ``shared`` memory by all threads. A fused epilogue block (``"D"``) becomes the
    accumulator's write-back. Shapes that are not tile multiples are predicated.
    """
    if bm % tm or bn % tn:
        raise WorkloadError(
            f"bm must be a multiple of tm and bn of tn; found bm={bm} tm={tm} bn={bn} tn={tn}"
        )
    threads_y, threads_x = bm // tm, bn // tn
    sch = Schedule(func)
    blk = sch.get_sblock(block)
    loops = sch.get_loops(blk)
    if len(loops) not in (3, 4):
        raise WorkloadError(
            f"reference_schedule expects a GEMM block with 3 or 4 loops (b, i, j, "
            f"k); found {len(loops)} loops on block {block!r}"
        )
    batch_loop = loops[0] if len(loops) == 4 else None
    i, j, k = loops[-3:]
    bi, ti, ii = sch.split(i, [None, threads_y, tm])
    bj, tj, jj = sch.split(j, [None, threads_x, tn])
    ko, ki = sch.split(k, [None, bk])
    order = ([batch_loop] if batch_loop is not None else []) + [bi, bj, ti, tj, ko, ki, ii, jj]
    sch.reorder(*order)
    if batch_loop is not None:
        sch.bind(batch_loop, "blockIdx.z")
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")

    consumers = sch.get_consumers(blk)
    if consumers:
        # A fused epilogue block reads the accumulator: keep the accumulator in registers and make
        # the epilogue block itself each thread's write-back.
        (epi,) = consumers
        sch.set_scope(blk, 0, "local")
        sch.reverse_compute_at(epi, tj)
    else:
        acc = sch.cache_write(blk, 0, "local")
        sch.reverse_compute_at(acc, tj)

    for idx in (0, 1):
        cr = sch.cache_read(blk, idx, "shared")
        sch.compute_at(cr, ko)
        # The copy's own loops are those below the panel loop it was computed at.
        copy_loops = sch.get_loops(cr)[len(order) - 3 :]
        fused = sch.fuse(*copy_loops)
        _, ty, tx = sch.split(fused, [None, threads_y, threads_x])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
    sch.decompose_reduction(blk, ko)
    return sch


def random_args(func: tvm.tirx.PrimFunc, rng: np.random.Generator | None = None) -> list:
    """Fresh random inputs for every parameter, the output (last parameter) poisoned with NaN.

    Integer outputs cannot hold NaN: they are filled with a sentinel (-12345) instead.
    """
    rng = rng or np.random.default_rng()
    args = []
    params = param_buffers(func)
    for n, buf in enumerate(params):
        shape = tuple(int(s) for s in buf.shape)
        dtype = str(buf.dtype)
        np_dtype = _numpy_dtype(dtype)
        if n == len(params) - 1:
            fill = (
                np.nan
                if np.issubdtype(np.dtype(np_dtype), np.floating) or dtype == "bfloat16"
                else -12345
            )
            args.append(np.full(shape, fill, dtype=np_dtype))
        elif dtype.startswith("int"):
            args.append(rng.integers(-4, 5, size=shape).astype(np_dtype))
        else:
            args.append(rng.uniform(-1.0, 1.0, size=shape).astype(np_dtype))
    return args


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def reference(func: tvm.tirx.PrimFunc, args: Sequence[np.ndarray], layout: str = "NN"):
    """The output of a workload built here, in float64 numpy, from ``args`` (inputs first).

    ``layout`` must be the one the workload was built with.
    """
    _check("layout", layout, LAYOUTS)
    names = [buf.name for buf in param_buffers(func)]
    inputs = {n: np.asarray(a, dtype=np.float64) for n, a in zip(names, args)}
    if "W" in inputs:
        return inputs["W"] @ inputs["x"]
    A, B = inputs["A"], inputs["B"]
    if layout == "TN":
        A = np.swapaxes(A, -1, -2)
    if layout == "NT":
        B = np.swapaxes(B, -1, -2)
    out = A @ B
    if "bias" in inputs:
        out = np.maximum(out + inputs["bias"], 0.0)
    return out


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """``max|out - ref| / max|ref|`` in float64; NaN anywhere in ``out`` gives ``inf``."""
    out = np.asarray(out, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    scale = max(float(np.max(np.abs(ref))), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(out - ref)) / scale)

"""Grouped GEMM and mixture-of-experts inputs: G GEMMs of different row counts in one kernel.

``Y[offsets[g] + i] = X[offsets[g] + i] @ W[g]`` for ``i < offsets[g + 1] - offsets[g]``: the
rows of ``X`` are the tokens sorted by expert, ``offsets`` the prefix sums of the per-expert
counts (``moe_offsets``). The function is written over ragged views
(:mod:`tvm_streamk.analysis.ragged`), so it schedules as a batched GEMM over the groups; build
it with the ``tvm_streamk`` TIR pipeline, which lowers the views.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm.script import tirx as T

from ..analysis.ragged import RAGGED_ATTR, RAGGED_SCOPE
from .errors import WorkloadError, check_choice, check_extents, run_time_extent
from .references import _numpy_dtype

GROUPED_LAYOUTS = ("NN", "NT")  # W[g] is (K, N), or (N, K) as a Linear layer stores it
GROUPED_IN_DTYPES = ("float32", "float16")


def grouped_gemm(
    groups: int,
    N: int,
    K: int,
    *,
    rows="rows",
    layout: str = "NN",
    in_dtype: str = "float32",
    out_dtype: str | None = None,
    offsets_dtype: str = "int64",
) -> tvm.tirx.PrimFunc:
    """The grouped GEMM of ``groups`` weight matrices over ``rows`` sorted rows.

    Parameters
    ----------
    groups, N, K : int
        The group (expert) count and each GEMM's N and K.
    rows : int, tvm.tirx.Var or str
        The real buffers' row count (all groups' rows together): an int, or a run-time extent
        (a Var, or the name of a new int64 one), as a token count is.
    layout : str
        "NN": ``W`` is (groups, K, N). "NT": ``W`` is (groups, N, K).
    in_dtype : str
        Dtype of ``X`` and ``W``; accumulation is in float32.
    out_dtype : str, optional
        Dtype of ``Y`` (float32 by default); another dtype is a cast in the write-back.
    offsets_dtype : str
        "int64" or "int32": the dtype of ``offsets`` (G + 1 entries, from 0, non-decreasing,
        the last at most ``rows``).

    The parameters are ``X (rows, K)``, ``W``, ``offsets (groups + 1,)`` and ``Y (rows, N)``.
    Experts of different widths (a sequence for ``N`` or ``K``) are refused: see
    :func:`check_one_width`.
    """
    check_one_width(N, K)
    check_extents(groups=groups, N=N, K=K)
    rows = run_time_extent("rows", rows)
    check_choice("layout", layout, GROUPED_LAYOUTS)
    check_choice("in_dtype", in_dtype, GROUPED_IN_DTYPES)
    check_choice("offsets_dtype", offsets_dtype, ("int64", "int32"))
    acc = "float32"
    out_dtype = out_dtype or acc
    if isinstance(rows, tvm.tirx.Var) and str(rows.ty) == "int64":
        # One index type throughout, as Relax's shapes have (dlight's layout rewrites refuse a
        # buffer indexed in two types).
        groups, N, K = (tvm.tirx.IntImm("int64", v) for v in (groups, N, K))
    w_shape = (groups, K, N) if layout == "NN" else (groups, N, K)
    declared = {"offsets": "offsets", "views": {"X_group": "X", "Y_group": "Y"}}

    def w_at(W, g, k, j):
        return W[g, k, j] if layout == "NN" else W[g, j, k]

    zero = tvm.tirx.const(0, acc)

    # fmt: off
    if out_dtype == acc:
        @T.prim_func(s_tir=True)
        def main(X: T.Buffer((rows, K), in_dtype), W: T.Buffer(w_shape, in_dtype),
                 offsets: T.Buffer((groups + 1,), offsets_dtype), Y: T.Buffer((rows, N), acc)):
            T.func_attr({"tirx.noalias": True, RAGGED_ATTR: declared})
            X_group = T.sblock_alloc_buffer((groups, rows, K), in_dtype, scope=RAGGED_SCOPE)
            Y_group = T.sblock_alloc_buffer((groups, rows, N), acc, scope=RAGGED_SCOPE)
            for g, i, j, k in T.grid(groups, rows, N, K):
                with T.sblock("C"):
                    vg, vi, vj, vk = T.axis.remap("SSSR", [g, i, j, k])
                    with T.init():
                        Y_group[vg, vi, vj] = zero
                    Y_group[vg, vi, vj] = Y_group[vg, vi, vj] + T.Cast(
                        acc, X_group[vg, vi, vk]) * T.Cast(acc, w_at(W, vg, vk, vj))
        return main

    @T.prim_func(s_tir=True)
    def main(X: T.Buffer((rows, K), in_dtype), W: T.Buffer(w_shape, in_dtype),
             offsets: T.Buffer((groups + 1,), offsets_dtype), Y: T.Buffer((rows, N), out_dtype)):
        T.func_attr({"tirx.noalias": True, RAGGED_ATTR: declared})
        X_group = T.sblock_alloc_buffer((groups, rows, K), in_dtype, scope=RAGGED_SCOPE)
        Y_group = T.sblock_alloc_buffer((groups, rows, N), out_dtype, scope=RAGGED_SCOPE)
        C = T.sblock_alloc_buffer((groups, rows, N), acc)
        for g, i, j, k in T.grid(groups, rows, N, K):
            with T.sblock("C"):
                vg, vi, vj, vk = T.axis.remap("SSSR", [g, i, j, k])
                with T.init():
                    C[vg, vi, vj] = zero
                C[vg, vi, vj] = C[vg, vi, vj] + T.Cast(acc, X_group[vg, vi, vk]) * T.Cast(
                    acc, w_at(W, vg, vk, vj))
        for g, i, j in T.grid(groups, rows, N):
            with T.sblock("D"):
                vg, vi, vj = T.axis.remap("SSS", [g, i, j])
                Y_group[vg, vi, vj] = T.Cast(out_dtype, C[vg, vi, vj])
    return main
    # fmt: on


def check_one_width(N, K) -> None:
    """Refuse per-group N or K (experts of different widths) with the reason.

    The ragged views make a group's *rows* ragged: ``X_group[g, i, k]`` is a row of one
    ``(rows, K)`` buffer, and the kernel is the batched GEMM of one ``N`` and one ``K`` over the
    groups. Weights of different shapes are not one ``(groups, K, N)`` buffer, and a band of one
    column extent cannot walk groups of different column counts; that needs per-group column
    views and a tile space of per-group column tiles, which are not built.
    """
    for name, value in (("N", N), ("K", K)):
        if isinstance(value, (list, tuple, np.ndarray)):
            raise WorkloadError(
                f"{name}={list(value)}: a grouped GEMM takes one N and one K for every group "
                "(its ragged views make only the rows ragged, and the weights are one "
                "(groups, K, N) buffer). Pad the experts to the widest (zero rows and columns "
                "add nothing to the product), or build one grouped kernel per width."
            )


def grouped_weight_grad(
    groups: int,
    N: int,
    K: int,
    *,
    rows="rows",
    in_dtype: str = "float32",
    out_dtype: str | None = None,
    offsets_dtype: str = "int64",
) -> tvm.tirx.PrimFunc:
    """The weight gradient of a grouped GEMM: ``dW[g] = dY_gᵀ · X_g`` for every group.

    ``X_g`` and ``dY_g`` are the rows ``offsets[g]`` to ``offsets[g + 1]`` of the tokens sorted
    by expert ``X (rows, K)`` and of the output gradient ``dY (rows, N)``: the reduction runs
    over a group's tokens, so every group's tiles have their own K (*ragged K*; an empty group's
    gradient is zero). Written over ragged views of ``X`` and ``dY`` (read with zeros past a
    group's rows) into the real ``dW (groups, N, K)``, it schedules as a batched GEMM whose
    reduction is the token axis. The parameters are ``X``, ``dY``, ``offsets`` and ``dW``;
    ``in_dtype`` float32, float16 or bfloat16, accumulated in float32, ``out_dtype`` a cast in
    the write-back.
    """
    check_one_width(N, K)
    check_extents(groups=groups, N=N, K=K)
    rows = run_time_extent("rows", rows)
    check_choice("in_dtype", in_dtype, (*GROUPED_IN_DTYPES, "bfloat16"))
    check_choice("offsets_dtype", offsets_dtype, ("int64", "int32"))
    acc = "float32"
    out_dtype = out_dtype or acc
    if isinstance(rows, tvm.tirx.Var) and str(rows.ty) == "int64":
        groups, N, K = (tvm.tirx.IntImm("int64", v) for v in (groups, N, K))
    declared = {"offsets": "offsets", "views": {"X_group": "X", "dY_group": "dY"}}
    zero = tvm.tirx.const(0, acc)

    # fmt: off
    if out_dtype == acc:
        @T.prim_func(s_tir=True)
        def main(X: T.Buffer((rows, K), in_dtype), dY: T.Buffer((rows, N), in_dtype),
                 offsets: T.Buffer((groups + 1,), offsets_dtype),
                 dW: T.Buffer((groups, N, K), acc)):
            T.func_attr({"tirx.noalias": True, RAGGED_ATTR: declared})
            X_group = T.sblock_alloc_buffer((groups, rows, K), in_dtype, scope=RAGGED_SCOPE)
            dY_group = T.sblock_alloc_buffer((groups, rows, N), in_dtype, scope=RAGGED_SCOPE)
            for g, n, k, t in T.grid(groups, N, K, rows):
                with T.sblock("C"):
                    vg, vn, vk, vt = T.axis.remap("SSSR", [g, n, k, t])
                    with T.init():
                        dW[vg, vn, vk] = zero
                    dW[vg, vn, vk] = dW[vg, vn, vk] + T.Cast(acc, dY_group[vg, vt, vn]) * T.Cast(
                        acc, X_group[vg, vt, vk])
        return main

    @T.prim_func(s_tir=True)
    def main(X: T.Buffer((rows, K), in_dtype), dY: T.Buffer((rows, N), in_dtype),
             offsets: T.Buffer((groups + 1,), offsets_dtype),
             dW: T.Buffer((groups, N, K), out_dtype)):
        T.func_attr({"tirx.noalias": True, RAGGED_ATTR: declared})
        X_group = T.sblock_alloc_buffer((groups, rows, K), in_dtype, scope=RAGGED_SCOPE)
        dY_group = T.sblock_alloc_buffer((groups, rows, N), in_dtype, scope=RAGGED_SCOPE)
        C = T.sblock_alloc_buffer((groups, N, K), acc)
        for g, n, k, t in T.grid(groups, N, K, rows):
            with T.sblock("C"):
                vg, vn, vk, vt = T.axis.remap("SSSR", [g, n, k, t])
                with T.init():
                    C[vg, vn, vk] = zero
                C[vg, vn, vk] = C[vg, vn, vk] + T.Cast(acc, dY_group[vg, vt, vn]) * T.Cast(
                    acc, X_group[vg, vt, vk])
        for g, n, k in T.grid(groups, N, K):
            with T.sblock("D"):
                vg, vn, vk = T.axis.remap("SSS", [g, n, k])
                dW[vg, vn, vk] = T.Cast(out_dtype, C[vg, vn, vk])
    return main
    # fmt: on


def grouped_weight_grad_args(
    counts: Sequence[int],
    N: int,
    K: int,
    *,
    in_dtype: str = "float32",
    out_dtype: str = "float32",
    offsets_dtype: str = "int64",
    rng: np.random.Generator | None = None,
) -> list:
    """Fresh random ``[X, dY, offsets, dW]`` for a grouped weight gradient with ``counts``
    tokens per group, ``dW`` poisoned with NaN."""
    rng = rng or np.random.default_rng()
    offsets = moe_offsets(counts, offsets_dtype)
    rows, groups = int(offsets[-1]), len(offsets) - 1
    x = rng.uniform(-1, 1, (rows, K)).astype(np.float32).astype(_numpy_dtype(in_dtype))
    dy = rng.uniform(-1, 1, (rows, N)).astype(np.float32).astype(_numpy_dtype(in_dtype))
    return [x, dy, offsets, np.full((groups, N, K), np.nan, out_dtype)]


def grouped_weight_grad_reference(x, dy, offsets) -> np.ndarray:
    """``dW`` of a grouped weight gradient in float64 numpy (zero for an empty group)."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    groups = len(offsets) - 1
    out = np.zeros((groups, dy.shape[1], x.shape[1]))
    for g in range(groups):
        lo, hi = int(offsets[g]), int(offsets[g + 1])
        out[g] = dy[lo:hi].T @ x[lo:hi]
    return out


def moe_offsets(counts: Sequence[int], dtype: str = "int64") -> np.ndarray:
    """The group offsets of per-expert token counts: 0, then their running sums (G + 1)."""
    counts = np.asarray(counts)
    if counts.ndim != 1 or counts.size == 0 or (counts < 0).any():
        raise WorkloadError(
            f"counts must be a non-empty vector of non-negative ints; found {counts.tolist()}"
        )
    return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)


def sort_by_expert(expert_of_row: Sequence[int], groups: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, counts)`` for rows routed to experts: ``x[order]`` is the rows sorted by
    expert (stable), ``counts[e]`` the rows of expert ``e``. Undo with ``y_sorted[inverse]``
    where ``inverse = np.argsort(order)``."""
    experts = np.asarray(expert_of_row)
    if experts.ndim != 1 or ((experts < 0) | (experts >= groups)).any():
        raise WorkloadError(
            f"expert_of_row must hold expert indices in [0, {groups}); found "
            f"{np.unique(experts).tolist()}"
        )
    order = np.argsort(experts, kind="stable")
    return order, np.bincount(experts, minlength=groups)


def grouped_args(
    counts: Sequence[int],
    N: int,
    K: int,
    *,
    layout: str = "NN",
    in_dtype: str = "float32",
    out_dtype: str = "float32",
    offsets_dtype: str = "int64",
    rng: np.random.Generator | None = None,
) -> list:
    """Fresh random ``[X, W, offsets, Y]`` for a grouped GEMM with ``counts`` rows per group,
    ``Y`` poisoned with NaN."""
    rng = rng or np.random.default_rng()
    offsets = moe_offsets(counts, offsets_dtype)
    rows, groups = int(offsets[-1]), len(offsets) - 1
    w_shape = (groups, K, N) if layout == "NN" else (groups, N, K)
    x = rng.uniform(-1, 1, (rows, K)).astype(in_dtype)
    w = rng.uniform(-1, 1, w_shape).astype(in_dtype)
    return [x, w, offsets, np.full((rows, N), np.nan, out_dtype)]


def grouped_reference(x, w, offsets, layout: str = "NN") -> np.ndarray:
    """``Y`` of a grouped GEMM in float64 numpy (rows outside every group are NaN)."""
    check_choice("layout", layout, GROUPED_LAYOUTS)
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n = w.shape[2] if layout == "NN" else w.shape[1]
    out = np.full((x.shape[0], n), np.nan)
    for g in range(len(offsets) - 1):
        lo, hi = int(offsets[g]), int(offsets[g + 1])
        wg = w[g] if layout == "NN" else w[g].T
        out[lo:hi] = x[lo:hi] @ wg
    return out

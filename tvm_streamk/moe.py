"""Mixture-of-experts layers: the grouped GEMM of tokens sorted by expert, with Stream-K.

A mixture-of-experts projection multiplies each token by the weights of the expert it is routed
to. With the tokens sorted by expert (:func:`tvm_streamk.workloads.sort_by_expert`) and the
per-expert counts, that is a grouped GEMM (:func:`tvm_streamk.workloads.grouped_gemm`): one
kernel whose persistent grid walks only the tiles that hold tokens, however unevenly the router
spread them (:mod:`tvm_streamk.analysis.ragged`).

``grouped_matmul_kernel`` builds and schedules the kernel; ``emit_moe_matmul`` is the Relax
entry: inside a ``relax.BlockBuilder`` function it computes the group offsets from the counts
(``cumsum``) and calls the kernel::

    y = tvm_streamk.moe.emit_moe_matmul(bb, x_sorted, w, counts, kernel)

The backward pass's weight gradient, ``dW[g] = dY_gᵀ · X_g`` over the tokens routed to expert
``g``, reduces over a different number of tokens per expert (*ragged K*):
``grouped_weight_grad_kernel`` builds it, Stream-K balancing the experts' unequal K over the
whole GPU (:mod:`tvm_streamk.transform.ragged_k`), and ``emit_moe_weight_grad`` calls it::

    dw = tvm_streamk.moe.emit_moe_weight_grad(bb, x_sorted, dy_sorted, counts, kernel)

Build the module with ``tir_pipeline="tvm_streamk"`` (and, for the rest of a model,
``relax_pipeline=tvm_streamk.relax_pipeline(target)``).
"""

from __future__ import annotations

import numpy as np
from tvm import relax, tirx

from .errors import StreamKError
from .schedule import stream_k
from .workloads.grouped import grouped_gemm, grouped_weight_grad
from .workloads.schedules import reference_schedule


def grouped_matmul_kernel(
    groups: int,
    N: int,
    K: int,
    *,
    layout: str = "NT",
    in_dtype: str = "float32",
    out_dtype: str | None = None,
    tiles: tuple[int, int, int, int, int] = (32, 32, 8, 4, 4),
    num_sms=None,
    blocks_per_sm: int | None = None,
    policy: str = "stream_k",
    fixup: str = "auto",
    target=None,
    batch_invariant: bool = False,
) -> tirx.PrimFunc:
    """The scheduled grouped GEMM ``Y = X @ W[expert]`` with its Stream-K decision.

    ``layout`` "NT" takes ``W`` as (groups, N, K), as a Linear layer per expert stores it;
    "NN" as (groups, K, N). ``tiles`` is ``(bm, bn, bk, tm, tn)`` of
    :func:`~tvm_streamk.workloads.reference_schedule`. ``num_sms``, ``blocks_per_sm``,
    ``policy``, ``fixup``, ``target`` and ``batch_invariant`` are :func:`tvm_streamk.stream_k`'s;
    ``policy="data_parallel"`` keeps the padded kernel as scheduled (a tile per expert for the
    largest possible expert's every row tile). With ``batch_invariant=True`` a token's output
    has the same bits whatever the other experts received, the grid or the policy
    (docs/batch_invariance.md). The function is marked scheduled, so dlight leaves it as it is.
    """
    func = grouped_gemm(groups, N, K, layout=layout, in_dtype=in_dtype, out_dtype=out_dtype)
    knobs = (num_sms, blocks_per_sm, policy, fixup, target, batch_invariant)
    return _scheduled(func, tiles, *knobs)


def _scheduled(
    func, tiles, num_sms, blocks_per_sm, policy, fixup, target, batch_invariant=False
) -> tirx.PrimFunc:
    """``func`` under the reference schedule of ``tiles`` with its Stream-K decision, marked
    scheduled (dlight leaves it as it is)."""
    bm, bn, bk, tm, tn = tiles
    sch = reference_schedule(func, bm=bm, bn=bn, bk=bk, tm=tm, tn=tn)
    stream_k(
        sch,
        "C_update",
        num_sms=num_sms,
        blocks_per_sm=blocks_per_sm,
        policy=policy,
        fixup=fixup,
        target=target,
        batch_invariant=batch_invariant,
    )
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def grouped_weight_grad_kernel(
    groups: int,
    N: int,
    K: int,
    *,
    in_dtype: str = "float32",
    out_dtype: str | None = None,
    tiles: tuple[int, int, int, int, int] = (32, 32, 8, 4, 4),
    num_sms=None,
    blocks_per_sm: int | None = None,
    policy: str = "stream_k",
    fixup: str = "auto",
    target=None,
    batch_invariant: bool = False,
) -> tirx.PrimFunc:
    """The scheduled MoE weight gradient ``dW[g] = dY_gᵀ · X_g`` with its Stream-K decision.

    Its arguments, in order: the tokens sorted by expert ``X (T, K)``, the output gradient
    ``dY (T, N)`` in the same order, the group offsets ``(groups + 1,)`` (as
    :func:`grouped_matmul_kernel`'s), and the output ``dW (groups, N, K)``; ``T`` is a run-time
    extent. ``in_dtype`` float32, float16 or bfloat16, accumulated in float32; ``out_dtype`` a
    cast in the write-back. ``tiles`` is ``(bn, bk, tokens per panel, tn, tk)`` of
    :func:`~tvm_streamk.workloads.reference_schedule` (its ``bm, bn, bk, tm, tn``). The other
    keywords are :func:`tvm_streamk.stream_k`'s; ``policy="data_parallel"`` keeps the kernel as
    written, every tile over the panels of all the tokens (zeros past its group's). An empty
    expert's gradient is written as zeros. ``batch_invariant=True`` is refused with the reason
    (the data-parallel kernel already sums each expert's tokens in one order).
    """
    func = grouped_weight_grad(groups, N, K, in_dtype=in_dtype, out_dtype=out_dtype)
    knobs = (num_sms, blocks_per_sm, policy, fixup, target, batch_invariant)
    return _scheduled(func, tiles, *knobs)


def emit_moe_matmul(
    bb: relax.BlockBuilder,
    x: relax.Expr,
    w: relax.Expr,
    counts: relax.Expr,
    kernel: tirx.PrimFunc,
    name: str = "moe_grouped_matmul",
) -> relax.Expr:
    """``y[t] = x[t] @ W[expert of t]`` for tokens ``x`` sorted by expert, inside ``bb``'s
    function: ``counts`` (int64, one per expert) are turned into the group offsets on the
    device and ``kernel`` (:func:`grouped_matmul_kernel`) is called on them."""
    x_info, w_info, c_info = (e.ty for e in (x, w, counts))
    params = {b.name: b for b in kernel.params}
    groups = int(params["offsets"].shape[0]) - 1
    want_w = [int(e) for e in params["W"].shape]
    found = {
        "x": list(x_info.shape) if x_info.shape is not None else None,
        "w": list(w_info.shape) if w_info.shape is not None else None,
        "counts": list(c_info.shape) if c_info.shape is not None else None,
    }
    want_k = int(params["X"].shape[1])
    shapes_ok = (
        x_info.ndim == 2
        and x_info.shape is not None
        and isinstance(x_info.shape[1], tirx.IntImm)
        and int(x_info.shape[1]) == want_k
        and w_info.shape is not None
        and [int(e) for e in w_info.shape] == want_w
        and c_info.shape is not None
        and len(c_info.shape) == 1
        and int(c_info.shape[0]) == groups
        and str(c_info.dtype) == "int64"
    )
    if not shapes_ok:
        raise StreamKError(
            "moe-shapes",
            f"x, w, counts of shapes {found} (counts {c_info.dtype}) for a kernel of {groups} "
            f"experts with weights {want_w} and tokens of {want_k} features",
            "Pass tokens (T, K) sorted by expert, the kernel's weights, and int64 counts (G,).",
        )
    zero = relax.const(np.zeros(1, "int64"), "int64")
    offsets = bb.emit(relax.op.concat([zero, relax.op.cumsum(counts, axis=0, dtype="int64")]))
    gv = bb.add_func(kernel.without_attr("global_symbol"), name)
    out = relax.TensorType([x_info.shape[0], params["Y"].shape[1]], str(params["Y"].dtype))
    return bb.emit(relax.call_tir(gv, [x, w, offsets], out))


def emit_moe_weight_grad(
    bb: relax.BlockBuilder,
    x: relax.Expr,
    dy: relax.Expr,
    counts: relax.Expr,
    kernel: tirx.PrimFunc,
    name: str = "moe_grouped_weight_grad",
) -> relax.Expr:
    """``dW[g] = dy[tokens of g]ᵀ @ x[tokens of g]`` for tokens sorted by expert, inside ``bb``'s
    function: ``counts`` (int64, one per expert) become the group offsets on the device and
    ``kernel`` (:func:`grouped_weight_grad_kernel`) is called on them."""
    params = {b.name: b for b in kernel.params}
    groups = int(params["offsets"].shape[0]) - 1
    want_k, want_n = int(params["X"].shape[1]), int(params["dY"].shape[1])
    infos = {"x": x.ty, "dy": dy.ty, "counts": counts.ty}
    found = {n: (list(i.shape) if i.shape is not None else None) for n, i in infos.items()}

    def static(info, axis) -> int | None:
        if info.shape is None or info.ndim != 2 or not isinstance(info.shape[axis], tirx.IntImm):
            return None
        return int(info.shape[axis])

    c_info = infos["counts"]
    shapes_ok = (
        static(infos["x"], 1) == want_k
        and static(infos["dy"], 1) == want_n
        and c_info.shape is not None
        and len(c_info.shape) == 1
        and int(c_info.shape[0]) == groups
        and str(c_info.dtype) == "int64"
    )
    if not shapes_ok:
        raise StreamKError(
            "moe-shapes",
            f"x, dy, counts of shapes {found} (counts {c_info.dtype}) for a weight-gradient "
            f"kernel of {groups} experts, tokens of {want_k} features and output gradients of "
            f"{want_n}",
            "Pass tokens (T, K) and their output gradients (T, N) sorted by expert, and int64 "
            "counts (G,).",
        )
    zero = relax.const(np.zeros(1, "int64"), "int64")
    offsets = bb.emit(relax.op.concat([zero, relax.op.cumsum(counts, axis=0, dtype="int64")]))
    gv = bb.add_func(kernel.without_attr("global_symbol"), name)
    out = relax.TensorType([groups, want_n, want_k], str(params["dW"].dtype))
    return bb.emit(relax.call_tir(gv, [x, dy, offsets], out))

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

Build the module with ``tir_pipeline="tvm_streamk"`` (and, for the rest of a model,
``relax_pipeline=tvm_streamk.relax_pipeline(target)``).
"""

from __future__ import annotations

import numpy as np
from tvm import relax, tirx

from .errors import StreamKError
from .schedule import stream_k
from .workloads.grouped import grouped_gemm
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
) -> tirx.PrimFunc:
    """The scheduled grouped GEMM ``Y = X @ W[expert]`` with its Stream-K decision.

    ``layout`` "NT" takes ``W`` as (groups, N, K), as a Linear layer per expert stores it;
    "NN" as (groups, K, N). ``tiles`` is ``(bm, bn, bk, tm, tn)`` of
    :func:`~tvm_streamk.workloads.reference_schedule`. ``num_sms``, ``blocks_per_sm``,
    ``policy``, ``fixup`` and ``target`` are :func:`tvm_streamk.stream_k`'s;
    ``policy="data_parallel"`` keeps the padded kernel as scheduled (a tile per expert for the
    largest possible expert's every row tile). The function is marked scheduled, so dlight
    leaves it as it is.
    """
    bm, bn, bk, tm, tn = tiles
    func = grouped_gemm(groups, N, K, layout=layout, in_dtype=in_dtype, out_dtype=out_dtype)
    sch = reference_schedule(func, bm=bm, bn=bn, bk=bk, tm=tm, tn=tn)
    block = "C_update"
    stream_k(
        sch,
        block,
        num_sms=num_sms,
        blocks_per_sm=blocks_per_sm,
        policy=policy,
        fixup=fixup,
        target=target,
    )
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


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

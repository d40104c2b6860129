"""``StreamKGEMV``: a low-batch matmul whose weight is K-major, scheduled for Stream-K.

A fully connected layer at batch 1 (``y[1, N] = x[1, K] @ W[K, N]``, as ONNX ``MatMul`` and
``Gemm`` without ``transB`` import) has no I axis for dlight's ``gpu.Matmul`` and the wrong
layout for ``gpu.GEMV`` (which reduces along the weight's innermost axis across threads), so
dlight's ``Reduction`` or ``Fallback`` rule takes it. It is also the textbook Stream-K case: few
output tiles (N / 128), a long K. This rule schedules it the way Stream-K takes it:

* each thread owns one output column ``j`` for every row (at most ``MAX_ROWS`` rows), the rows'
  partial sums in registers; a block owns ``THREADS`` consecutive columns (one tile);
* K is one serial loop of ``PANEL``-deep panels; in each, the block stages the rows' slice of
  ``x`` in shared memory, and thread ``j`` reads ``W[k, j]``: consecutive threads read
  consecutive addresses (coalesced), and each weight element is read once for all rows;
* the epilogue (bias, activation) is inlined into the write-back; blocks the function computes
  besides (a dropout's mask) get dlight's fallback schedule.

Then it records a Stream-K decision as :class:`~tvm_streamk.dlight.StreamKMatmul` does. It
declines (returns ``None``) anything else: more than one reduction, more rows, a weight whose
innermost axis is not the output column, a symbolic extent.
"""

from __future__ import annotations

from math import prod

from tvm import tirx

from .._compat import Schedule, dlight, structural_walk
from .decisions import OwnScheduleRule, bind_leftovers, only_reduction

MAX_ROWS = 8
THREADS = 128
PANEL = 64

_matmul_rules = dlight.gpu.matmul


class StreamKGEMV(OwnScheduleRule):
    """Low-batch matmul with a K-major weight: one column per thread, K in serial panels, then
    :func:`tvm_streamk.stream_k` on its reduction.

    Parameters
    ----------
    num_sms, blocks_per_sm, policy, fixup, decisions
        As for :class:`~tvm_streamk.dlight.StreamKMatmul`.
    """

    def schedule(self, sch: Schedule) -> bool:
        shape = _low_batch_shape(sch)
        if shape is None:
            return False
        _schedule(sch, *shape)
        return True


def _low_batch_shape(sch: Schedule):
    """``(main block, column var, row vars, vector read index)`` when the function is a
    low-batch matmul with a K-major weight; else None."""
    main = only_reduction(sch)
    if main is None:
        return None
    block = sch.get(main)
    if len(block.reads) != 2 or len(block.writes) != 1:
        return None
    if not all(isinstance(iv.dom.extent, tirx.IntImm) for iv in block.iter_vars):
        return None
    loops = sch.get_loops(main)
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(loops) != len(block.iter_vars) or len(spatial) + len(reduce) != len(loops):
        return None
    extents = {iv.var: int(iv.dom.extent) for iv in block.iter_vars}
    # The weight: its innermost index is a spatial variable (the column), and it reads K.
    weights = []
    for index, region in enumerate(block.reads):
        inner = region.region[-1].min
        used = _vars(region)
        if _among(inner, spatial) and any(_among(r, used) for r in reduce):
            weights.append((index, inner))
    if len(weights) != 1:
        return None
    ((w_index, column),) = weights
    vector = 1 - w_index
    if _among(column, _vars(block.reads[vector])):
        return None
    rows = [v for v in spatial if not v.same_as(column)]
    if prod(extents[v] for v in rows) > MAX_ROWS or extents[column] < 2 * THREADS:
        return None
    return main, column, rows, vector


def _schedule(sch: Schedule, main, column, rows, vector: int) -> None:
    block = sch.get(main)
    # TE binds iteration variable i to loop i (checked by _low_batch_shape's counts).
    pairs = list(zip(block.iter_vars, sch.get_loops(main)))
    j_loop = next(loop for iv, loop in pairs if iv.var.same_as(column))
    row_loops = [loop for iv, loop in pairs if _among(iv.var, rows)]
    k_loops = [loop for iv, loop in pairs if iv.iter_type == tirx.IterVar.CommReduce]
    k = sch.fuse(*k_loops) if len(k_loops) > 1 else k_loops[0]
    bj, tj = sch.split(j_loop, [None, THREADS])
    ko, ki = sch.split(k, [None, PANEL])
    sch.reorder(bj, tj, ko, ki, *row_loops)
    sch.bind(bj, "blockIdx.x")
    sch.bind(tj, "threadIdx.x")
    l2g = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(l2g, tj, preserve_unit_loops=True)
    staged = sch.cache_read(main, vector, "shared")
    sch.compute_at(staged, ko, preserve_unit_loops=True)
    fetch = sch.get_loops(staged)[3:]
    _, tx = sch.split(sch.fuse(*fetch) if len(fetch) > 1 else fetch[0], [None, THREADS])
    sch.bind(tx, "threadIdx.x")
    _matmul_rules.auto_inline_producers(sch, staged)
    _matmul_rules.auto_inline_consumer_chain(sch, l2g)
    sch.decompose_reduction(main, ko)
    bind_leftovers(sch)


def _among(v, pool) -> bool:
    return isinstance(v, tirx.Var) and any(v.same_as(p) for p in pool)


def _vars(region) -> list:
    found = []
    for r in region.region:
        structural_walk(r.min, (tirx.Var, found.append))
    return found

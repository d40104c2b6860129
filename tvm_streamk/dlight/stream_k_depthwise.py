"""``StreamKDepthwise``: short multiply-accumulate reductions, one output per thread.

A depthwise convolution reduces only over its window (``R * S``, 9 for 3x3) and reads a
different input channel for every output channel, so it is no GEMM: dlight's ``gpu.Matmul``
and the group split (:mod:`tvm_streamk.transform.group_axis`) find no J axis, and dlight's
``gpu.Fallback`` takes it.
With so short a reduction the right kernel gives each thread one output and its whole window:

* the outputs, flattened in their row-major order (innermost axis fastest: coalesced stores,
  and coalesced input reads along that axis), are cut into tiles of ``THREADS``; a block owns
  one tile, a thread one output;
* the reduction axes are fused into one serial loop of ``PANEL``-deep panels, the partial sum in
  a register; the padding producer is inlined into the read, the epilogue into the write-back.

Then it records a decision as :class:`~tvm_streamk.dlight.StreamKMatmul` does; with one to a few
panels the cost model keeps it data-parallel unless the tiles leave most SMs idle. The rule
takes any function with one multiply-accumulate reduction of at most ``MAX_REDUCTION``
iterations per output and constant extents, which the rules before it declined.
"""

from __future__ import annotations

from math import prod

from tvm import tirx

from .._compat import Schedule, dlight
from ..analysis.flops import multiply_accumulates
from .decisions import OwnScheduleRule, bind_leftovers, only_reduction

MAX_REDUCTION = 512
THREADS = 128
PANEL = 16

_matmul_rules = dlight.gpu.matmul


class StreamKDepthwise(OwnScheduleRule):
    """One output per thread, the short reduction in serial panels, then
    :func:`tvm_streamk.stream_k` on it (a depthwise convolution's kernel).

    Parameters
    ----------
    num_sms, blocks_per_sm, policy, fixup, decisions
        As for :class:`~tvm_streamk.dlight.StreamKMatmul`.
    """

    def schedule(self, sch: Schedule) -> bool:
        main = only_reduction(sch)
        if main is None:
            return False
        block = sch.get(main)
        loops = sch.get_loops(main)
        if (
            not multiply_accumulates(block)
            or len(block.writes) != 1
            or len(loops) != len(block.iter_vars)
            or not all(isinstance(iv.dom.extent, tirx.IntImm) for iv in block.iter_vars)
        ):
            return False
        kinds = [iv.iter_type for iv in block.iter_vars]
        # TE order: every spatial axis, then every reduction axis (only_reduction found one),
        # loop i binding variable i.
        if kinds != sorted(kinds):
            return False
        reduction = prod(
            int(iv.dom.extent) for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce
        )
        if reduction > MAX_REDUCTION:
            return False
        _schedule(sch, main, kinds.index(tirx.IterVar.CommReduce))
        return True


def _schedule(sch: Schedule, main, spatial: int) -> None:
    loops = sch.get_loops(main)
    outputs = sch.fuse(*loops[:spatial]) if spatial > 1 else loops[0]
    k = sch.fuse(*loops[spatial:]) if len(loops) - spatial > 1 else loops[spatial]
    bx, tx = sch.split(outputs, [None, THREADS])
    ko, _ = sch.split(k, [None, PANEL])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    l2g = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(l2g, tx, preserve_unit_loops=True)
    _matmul_rules.auto_inline_producers(sch, main)
    _matmul_rules.auto_inline_consumer_chain(sch, l2g)
    sch.decompose_reduction(main, ko)
    bind_leftovers(sch)

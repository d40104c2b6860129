"""``StreamKDepthwise``: depthwise reductions, one output per thread.

A depthwise convolution reduces only over its window (``R * S``, 9 for 3x3) and reads one input
channel for every output channel (:func:`tvm_streamk.analysis.is_depthwise`), so it is no GEMM:
its filter has no axis of its own to tile, dlight's ``gpu.Matmul`` and the group split
(:mod:`tvm_streamk.transform.group_axis`) find no J axis, and dlight's ``gpu.Fallback`` takes
it. With so short a reduction and nothing to reuse, the right kernel gives each thread one
output and its whole window:

* the outputs, flattened in their row-major order (innermost axis fastest: coalesced stores,
  and coalesced input reads along that axis), are cut into tiles of ``THREADS``; a block owns
  one tile, a thread one output;
* the reduction axes are fused into one serial loop of ``PANEL``-deep panels, the partial sum in
  a register; the padding producer is inlined into the read, the epilogue into the write-back.

Then it records a decision as :class:`~tvm_streamk.dlight.StreamKMatmul` does; with one to a few
panels the cost model keeps it data-parallel unless the tiles leave most SMs idle. The rule
takes a function whose one reduction is depthwise, of at most ``MAX_REDUCTION`` iterations per
output, with constant extents. A dense or grouped convolution is a GEMM, never this rule's:
:class:`~tvm_streamk.dlight.StreamKImplicitGEMM` takes those ``gpu.Matmul`` declines.
"""

from __future__ import annotations

from math import prod

from tvm import tirx

from .._compat import Schedule, dlight
from ..analysis import is_depthwise
from .decisions import OwnScheduleRule, bind_leftovers, only_reduction

MAX_REDUCTION = 512
THREADS = 128
PANEL = 16

_matmul_rules = dlight.gpu.matmul


class StreamKDepthwise(OwnScheduleRule):
    """One output per thread, the short depthwise reduction in serial panels, then
    :func:`tvm_streamk.stream_k` on it.

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
        # is_depthwise also vouches for the one output and the constant extents _schedule needs.
        if not is_depthwise(block) or len(loops) != len(block.iter_vars):
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

"""``StreamKImplicitGEMM``: convolutions dlight's ``gpu.Matmul`` declines, as implicit GEMMs.

dlight's ``gpu.Matmul`` reads a reduction's indices as written. TVM's own TE convolutions
(``meta_schedule.testing.te_workload``'s C1D, C2D, C3D, DIL) read input channel
``co // CO * CI + rc`` even when ungrouped, so the output channel ``co`` indexes all three
buffers, looks like a batch axis, leaves no J axis, and ``gpu.Matmul`` declines. Read over the
iteration domain (``co < CO``), the index is ``rc`` and the convolution the GEMM it is
(:func:`tvm_streamk.analysis.gemm_axes`). This rule schedules it with
:func:`tvm_streamk.workloads.implicit_gemm_schedule`: tiles of outputs over (batch x positions)
x output channels, the K = channels x window reduction in panels gathered (padding included)
into shared memory, the accumulator in registers and elementwise epilogues fused into the
write-back. A grouped convolution with fewer output channels per group than the group split
of :class:`~tvm_streamk.dlight.StreamKMatmul` takes is the batched GEMM over its groups here.

Then it records a decision as :class:`~tvm_streamk.dlight.StreamKMatmul` does. It declines a
depthwise reduction (:func:`tvm_streamk.analysis.is_depthwise`, for
:class:`~tvm_streamk.dlight.StreamKDepthwise`) and anything whose GEMM has no I or no J axis
wider than 1: with nothing to reuse along one side, a GEMM tile is padding there.
"""

from __future__ import annotations

from tvm import tirx

from .._compat import Schedule, ScheduleError
from ..analysis import blocks_under, gemm_axes, is_depthwise, is_reduction
from ..transform.group_axis import GroupAxisRefused, split_group_axis
from ..workloads import WorkloadError, implicit_gemm_schedule
from .decisions import OwnScheduleRule, bind_leftovers

# implicit_gemm_schedule's tile: 64 x 64 outputs, 4 x 4 per thread, 16-deep K panels.
BM, BN, BK, TM, TN = 64, 64, 16, 4, 4
THREADS_X = BN // TN


class StreamKImplicitGEMM(OwnScheduleRule):
    """A convolution (any matmul-like reduction) as an implicit GEMM, then
    :func:`tvm_streamk.stream_k` on its reduction.

    Parameters
    ----------
    num_sms, blocks_per_sm, policy, fixup, splits, variant, decisions
        As for :class:`~tvm_streamk.dlight.StreamKMatmul`.
    """

    def scheduled(self, func: tirx.PrimFunc) -> Schedule | None:
        reduction = _one_reduction(func)
        if reduction is None or is_depthwise(reduction):
            return None
        try:
            gemm = split_group_axis(func, min_columns=1) or func
        except GroupAxisRefused:
            return None
        axes = gemm_axes(_one_reduction(gemm))
        if axes is None or axes.extent(axes.i) < 2 or axes.extent(axes.j) < 2:
            return None
        try:
            sch = implicit_gemm_schedule(gemm, **tiles(axes.extent(axes.j)))
        except (WorkloadError, ScheduleError):
            return None
        bind_leftovers(sch)
        return sch


def tiles(columns: int) -> dict:
    """The tile for a GEMM ``columns`` wide (J): 64 wide, or the power of two that covers a
    narrower J (a group's few output channels), so the tile is not mostly padding; the thread
    grid keeps up to 16 threads along J."""
    bn = min(BN, 1 << (columns - 1).bit_length())
    tn = max(1, bn // THREADS_X)
    return {"bm": BM, "bn": bn, "bk": BK, "tm": TM, "tn": tn}


def _one_reduction(func: tirx.PrimFunc):
    found = [b for b in blocks_under(func.body) if is_reduction(b)]
    return found[0] if len(found) == 1 else None

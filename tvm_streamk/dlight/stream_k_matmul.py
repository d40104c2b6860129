"""``StreamKMatmul``: dlight's matmul schedule, then Stream-K where the cost model says it pays.

The rule schedules a matmul-like function exactly as ``dlight.gpu.Matmul`` does (tensor-core or
SIMT; a grouped convolution as the batched GEMM over its groups, see
:mod:`tvm_streamk.transform.group_axis`), then records a Stream-K decision on its reduction
with ``policy="heuristic"`` by default: the cost model keeps the data-parallel kernel when the
tiles fill whole waves and picks Stream-K, a hybrid or split-K when they do not (tensor-core
fragments take only aligned splits). Kernels Stream-K cannot rewrite keep dlight's schedule
unchanged. The rule keeps, per kernel, the plan
it recorded (``StreamKMatmul.decided``) or why it did not apply (``StreamKMatmul.skipped``),
keyed by :func:`kernel_key` (fused Relax functions have no symbol yet when dlight runs). The
``tvm_streamk`` TIR pipeline lowers the result.

With ``batch_invariant=True`` a static M is made a run-time extent first
(:func:`tvm_streamk.transform.run_time_rows.run_time_rows`): every M of one weight, one token
included, then runs the one kernel of a run-time M (docs/batch_invariance.md).
"""

from __future__ import annotations

from tvm import tirx

from .._compat import Schedule, dlight, dlight_cuda_target, without_int8_tensorization
from ..transform.group_axis import GroupAxisRefused, split_group_axis
from ..transform.run_time_rows import run_time_rows
from .decisions import RecordsDecisions, decide, kernel_key

__all__ = ["StreamKMatmul", "kernel_key"]


class StreamKMatmul(RecordsDecisions, dlight.gpu.Matmul):
    """dlight's ``gpu.Matmul`` followed by :func:`tvm_streamk.stream_k` on its reduction.

    Parameters
    ----------
    num_sms : int, optional
        SM count of the GPU; by default looked up from the target (a clear error when unknown).
    blocks_per_sm, policy, fixup, splits, variant
        As for :func:`tvm_streamk.stream_k` (by default the grid is sized for the built
        kernel's resident blocks per SM).
    decisions : Decisions, optional
        The record to keep decisions in; rules of one pipeline share one.

    Examples
    --------
    ::

        from tvm.s_tir import dlight as dl
        with tvm.target.Target("nvidia/nvidia-h100"):
            mod = dl.ApplyDefaultSchedule(StreamKMatmul(), dl.gpu.Fallback())(mod)
        lib = tvm.compile(mod, target="nvidia/nvidia-h100", tir_pipeline="tvm_streamk")
    """

    def apply(self, func: tirx.PrimFunc, target, tunable: bool):
        name = self.decisions.key(func)
        if self.config.batch_invariant:
            # Every M of one weight runs the kernel of a run-time M (transform/run_time_rows).
            func = run_time_rows(func) or func
        # sm_90a (the H100 tag) gets the tensor-core schedule sm_90 gets, and an int8 matmul
        # the SIMT schedule: TVM 0.27's int8 tensor-core schedule does not build (_compat).
        func = without_int8_tensorization(func)
        sch = super().apply(func, dlight_cuda_target(target), tunable)
        if sch is None:
            # A grouped convolution, as the batched GEMM over its groups that it is.
            try:
                grouped = split_group_axis(func)
            except GroupAxisRefused as err:
                self.skipped[name] = f"[grouped-conv] {err}"
                return None
            if grouped is not None:
                sch = super().apply(grouped, dlight_cuda_target(target), tunable)
        if isinstance(sch, Schedule):
            decide(self, name, sch, target)
        return sch

"""A Relax pipeline that compiles whole models with Stream-K where it pays off.

It is TVM's default CUDA Relax pipeline with one change: dlight's ``gpu.Matmul`` rule is replaced
by :class:`tvm_streamk.dlight.StreamKMatmul`, which lets the cost model add a Stream-K decision to
every matmul-like kernel (fused epilogues included). Build with the ``tvm_streamk`` TIR pipeline::

    lib = tvm.compile(mod, target, relax_pipeline=tvm_streamk.relax_pipeline(target),
                      tir_pipeline="tvm_streamk")
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._compat import dlight
from ._compat import target as as_target
from .dlight import StreamKMatmul

CUDA_BACKEND = "tvm.relax.backend.cuda.pipeline"


def relax_pipeline(target, *, num_sms=None, blocks_per_sm=None, policy="heuristic", fixup="auto"):
    """The Relax pipeline for ``target`` (a CUDA target or tag) with Stream-K matmuls.

    Parameters
    ----------
    target : Target or str
        A CUDA target; its tag gives the SM count unless ``num_sms`` is passed.
    num_sms, blocks_per_sm, policy, fixup
        As for :func:`tvm_streamk.stream_k`.

    Returns
    -------
    tvm.transform.Pass
        The module pass to give ``tvm.compile`` as ``relax_pipeline``.
    """
    import importlib

    target = as_target(target)
    if target.kind.name != "cuda":
        raise ValueError(
            f"relax_pipeline builds for CUDA targets; found target kind {target.kind.name!r}. "
            "Schedule other targets with dlight and tvm_streamk.stream_k directly."
        )
    cuda = importlib.import_module(CUDA_BACKEND)
    rule = StreamKMatmul(num_sms, blocks_per_sm, policy, fixup)

    def legalize() -> list:
        return [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            dlight.ApplyDefaultSchedule(
                rule,
                dlight.gpu.GEMV(),
                dlight.gpu.Reduction(),
                dlight.gpu.GeneralReduction(),
                dlight.gpu.Fallback(),
            ),
        ]

    @tvm.transform.module_pass(opt_level=0, name="tvm_streamk.relax_pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            passes = (
                cuda.library_dispatch_passes(target)
                + legalize()
                + cuda.dataflow_lower_passes(target)
                + cuda.finalize_passes(target)
            )
            return tvm.transform.Sequential(passes)(mod)

    _pipeline.rule = rule
    return _pipeline

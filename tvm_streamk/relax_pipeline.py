"""A Relax pipeline that compiles whole models with Stream-K where it pays off.

It is TVM's default CUDA Relax pipeline with the project's dlight rules in it:
:class:`tvm_streamk.dlight.StreamKMatmul` replaces ``gpu.Matmul`` and lets the cost model add a
Stream-K decision to every matmul-like kernel (fused epilogues and grouped convolutions
included); :class:`tvm_streamk.dlight.StreamKGEMV` takes the low-batch matmuls ``gpu.GEMV``
declines (a fully connected layer at batch 1 with a K-major weight), and
:class:`tvm_streamk.dlight.StreamKImplicitGEMM` the convolutions ``gpu.Matmul`` declines (TVM's
own TE convolutions, grouped ones with few channels per group) as implicit GEMMs, and
:class:`tvm_streamk.dlight.StreamKDepthwise` the short depthwise reductions.
All four record their decisions in one place, ``pipeline.rule.decided`` and
``pipeline.rule.skipped``; :func:`tvm_streamk.model_report` tabulates them. Build with the
``tvm_streamk`` TIR pipeline::

    lib = tvm.compile(mod, target, relax_pipeline=tvm_streamk.relax_pipeline(target),
                      tir_pipeline="tvm_streamk")
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._compat import dlight
from ._compat import target as as_target
from .dlight import StreamKDepthwise, StreamKGEMV, StreamKImplicitGEMM, StreamKMatmul

CUDA_BACKEND = "tvm.relax.backend.cuda.pipeline"


def relax_pipeline(
    target,
    *,
    num_sms=None,
    blocks_per_sm=None,
    policy="heuristic",
    fixup="auto",
    splits=None,
    variant=None,
    batch_invariant=False,
):
    """The Relax pipeline for ``target`` (a CUDA target or tag) with Stream-K matmuls.

    Parameters
    ----------
    target : Target or str
        A CUDA target; its tag gives the SM count unless ``num_sms`` is passed.
    num_sms, blocks_per_sm, policy, fixup, splits, variant
        As for :func:`tvm_streamk.stream_k`.
    batch_invariant : bool
        Every Stream-K decision of every rule batch-invariant (docs/batch_invariance.md says
        which kernels of one weight then give the same bits for a row, and which do not).

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
    rule = StreamKMatmul(
        num_sms,
        blocks_per_sm,
        policy,
        fixup,
        splits=splits,
        variant=variant,
        batch_invariant=batch_invariant,
    )

    @tvm.transform.module_pass(opt_level=0, name="tvm_streamk.relax_pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            passes = (
                fusion_passes(target)
                + [dlight.ApplyDefaultSchedule(*schedule_rules(rule))]
                + cuda.dataflow_lower_passes(target)
                + cuda.finalize_passes(target)
            )
            return tvm.transform.Sequential(passes)(mod)

    _pipeline.rule = rule
    return _pipeline


def fusion_passes(target) -> list:
    """The passes before scheduling: library dispatch, legalization and fusion; after them the
    module holds the fused TensorIR functions dlight schedules (run them under ``target``)."""
    import importlib

    cuda = importlib.import_module(CUDA_BACKEND)
    return cuda.library_dispatch_passes(as_target(target)) + [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]


def schedule_rules(rule: StreamKMatmul) -> list:
    """dlight's GPU rules in the order the pipeline tries them: ``rule`` in place of
    ``gpu.Matmul``; then, sharing ``rule``'s knobs and record,
    :class:`~tvm_streamk.dlight.StreamKGEMV` for the low-batch matmuls with a K-major weight
    that ``gpu.GEMV`` declines, :class:`~tvm_streamk.dlight.StreamKImplicitGEMM` for the
    convolutions ``gpu.Matmul`` declines and :class:`~tvm_streamk.dlight.StreamKDepthwise` for
    short depthwise reductions (the two take disjoint kernels:
    :func:`tvm_streamk.analysis.is_depthwise` decides)."""
    knobs = rule.config.rule_kwargs
    return [
        rule,
        dlight.gpu.GEMV(),
        StreamKGEMV(**knobs, decisions=rule.decisions),
        StreamKImplicitGEMM(**knobs, decisions=rule.decisions),
        StreamKDepthwise(**knobs, decisions=rule.decisions),
        dlight.gpu.Reduction(),
        dlight.gpu.GeneralReduction(),
        dlight.gpu.Fallback(),
    ]

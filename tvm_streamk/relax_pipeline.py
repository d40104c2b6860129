"""A Relax pipeline that compiles whole models with Stream-K where it pays off.

It is TVM's default Relax pipeline for a CUDA or a WebGPU target with the project's dlight
rules in it:
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
from .dlight.guarded import Guarded
from .errors import StreamKError
from .gpus import UnknownGPUError, num_sms_for_target
from .vector_rows import VectorRows

# The targets the pipeline builds for, each with the TVM module of its default Relax pipeline's
# passes (library dispatch, dataflow lowering, finalization), as ``tvm.relax.pipeline`` picks.
BACKENDS = {
    "cuda": "tvm.relax.backend.cuda.pipeline",
    "webgpu": "tvm.relax.backend.gpu_generic.pipeline",
}


def _backend(target):
    import importlib

    kind = as_target(target).kind.name
    if kind not in BACKENDS:
        raise ValueError(
            f"the Stream-K Relax pipeline builds for targets of kind {list(BACKENDS)}; found "
            f"target kind {kind!r}. Schedule other targets with dlight and "
            "tvm_streamk.stream_k directly."
        )
    return importlib.import_module(BACKENDS[kind])


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
    """The Relax pipeline for ``target`` (a CUDA target or tag, or a WebGPU target) with
    Stream-K matmuls.

    Parameters
    ----------
    target : Target or str
        A CUDA target, whose tag (or an arch only one GPU has) gives the SM count unless
        ``num_sms`` is passed, refused without either; or a WebGPU
        target (``Target("webgpu", host="llvm")``), which needs ``num_sms`` (WebGPU does not
        tell the compute units) and whose decisions take the separate fix-up.
    num_sms, blocks_per_sm, policy, fixup, splits, variant
        As for :func:`tvm_streamk.stream_k`.
    batch_invariant : bool
        Every Stream-K decision of every rule batch-invariant (docs/batch_invariance.md says
        which kernels of one weight then give the same bits for a row, and which do not); a
        vector times a matrix is given a row first
        (:func:`~tvm_streamk.vector_rows.VectorRows`).

    Returns
    -------
    tvm.transform.Pass
        The module pass to give ``tvm.compile`` as ``relax_pipeline``.
    """
    target = as_target(target)
    _backend(target)  # refuses other target kinds
    if target.kind.name == "webgpu" and num_sms is None:
        raise ValueError(
            "relax_pipeline for a WebGPU target needs num_sms: WebGPU does not tell how many "
            "compute units the adapter has (tvm_streamk.webgpu.compute_units() knows lavapipe's)"
        )
    require_sm_count(target, num_sms, "relax_pipeline")
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
                fusion_passes(target, batch_invariant)
                + [dlight.ApplyDefaultSchedule(*schedule_rules(rule))]
                + _backend(target).dataflow_lower_passes(target)
                + _backend(target).finalize_passes(target)
            )
            return tvm.transform.Sequential(passes)(mod)

    _pipeline.rule = rule
    return _pipeline


def require_sm_count(target, num_sms, caller: str) -> None:
    """Refuse a CUDA ``target`` that gives no SM count, with no ``num_sms``, when ``caller``
    (a whole-model entry point) is called: otherwise the first kernel the rules schedule
    stops, advising ``num_sms`` for a rule the user never made."""
    if num_sms is not None or target.kind.name != "cuda":
        return
    try:
        num_sms_for_target(None, target)
    except UnknownGPUError as err:
        raise StreamKError.stated(
            "num-sms", f"{err}; for this model: {caller}(target, num_sms=...)"
        ) from None


def fusion_passes(target, batch_invariant: bool = False) -> list:
    """The passes before scheduling: library dispatch, legalization and fusion; after them the
    module holds the fused TensorIR functions dlight schedules (run them under ``target``).
    With ``batch_invariant`` a vector times a matrix is first given a row
    (:func:`tvm_streamk.vector_rows.VectorRows`), so that it runs the matmul kernel."""
    rows = [VectorRows] if batch_invariant else []
    return [*rows, *_backend(target).library_dispatch_passes(as_target(target))] + [
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
    :func:`tvm_streamk.analysis.is_depthwise` decides). dlight's own ``GEMV``, ``Reduction``
    and ``GeneralReduction`` are tried under :class:`~tvm_streamk.dlight.guarded.Guarded`: a
    kernel one of them fails on goes to the next rule, with a warning."""
    knobs = rule.config.rule_kwargs
    return [
        rule,
        Guarded(dlight.gpu.GEMV()),
        StreamKGEMV(**knobs, decisions=rule.decisions),
        StreamKImplicitGEMM(**knobs, decisions=rule.decisions),
        StreamKDepthwise(**knobs, decisions=rule.decisions),
        Guarded(dlight.gpu.Reduction()),
        Guarded(dlight.gpu.GeneralReduction()),
        dlight.gpu.Fallback(),
    ]

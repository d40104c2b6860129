"""Tune a TIR kernel with Stream-K in the search space; compile the best record with Stream-K."""

from __future__ import annotations

import tvm

from .. import gpus
from .. import postproc as sk_postproc
from .._compat import Schedule, meta_schedule, unnamed_handlers_detached
from .._compat import target as as_target
from ..pipeline import NAME as PIPELINE
from .builder import stream_k_builder
from .features import StreamKFeatureExtractor
from .mutator import MutateStreamK
from .rule import StreamKKnobs, StreamKRule

ms = meta_schedule

# The stock GPU rule, postproc and mutator lists ("cuda"; "cuda-tensorcore" adds tensor-core
# tiling). They read thread and shared-memory limits from the target, so they serve OpenCL too.
KINDS = ("cuda", "cuda-tensorcore")
# Share of the evolutionary search's mutations spent on Stream-K knobs; the stock CUDA
# mutators' probabilities add up to 1 and MetaSchedule renormalises.
MUTATE_STREAM_K_PROB = 0.1


def opencl_target(**attrs) -> tvm.target.Target:
    """The OpenCL target candidates are tuned for on PoCL: :func:`tvm_streamk.pocl.opencl_target`.

    Examples
    --------
    >>> opencl_target().kind.name
    'opencl'
    """
    # Imported here: the PoCL backend loads on first use, not with the package.
    from ..pocl.target import opencl_target as pocl_opencl_target

    return pocl_opencl_target(**attrs)


def _is_opencl(target: tvm.target.Target) -> bool:
    return target.kind.name == "opencl"


def _num_sms(num_sms: int | None, target, resolved: tvm.target.Target) -> int | None:
    # TVM 0.27 drops the tag from a Target built from one (``Target(tag).tag == ""``), so a tag
    # string given here is the surest place to read it.
    tag = target if isinstance(target, str) else None
    try:
        return gpus.num_sms_for_target(num_sms, resolved, tag=tag, opencl_compute_units=True)
    except gpus.UnknownGPUError:
        if num_sms is not None:
            raise
        # StreamKRule asks again with the tune context's target, and says what is missing.
        return None


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; found {kind!r}")
    if kind == "cuda-tensorcore":
        # Registers the tensor intrinsics the tensor-core rules name.
        import tvm.s_tir.tensor_intrin  # noqa: F401


def schedule_rules(
    num_sms: int | None = None, knobs: StreamKKnobs | None = None, kind: str = "cuda"
) -> list:
    """TVM's GPU schedule rules with :class:`StreamKRule` right after the tiling rules.

    Examples
    --------
    >>> [type(r).__name__ for r in schedule_rules(num_sms=132)][:3]
    ['ApplyCustomRule', 'MultiLevelTiling', 'StreamKRule']
    """
    _check_kind(kind)
    rules = list(ms.ScheduleRule.create(kind))
    tiling = [i for i, r in enumerate(rules) if type(r).__name__.startswith("MultiLevelTiling")]
    if not tiling:
        raise RuntimeError("TVM's GPU schedule rules hold no MultiLevelTiling rule")
    rules.insert(tiling[-1] + 1, StreamKRule(num_sms=num_sms, knobs=knobs))
    return rules


def postprocs(kind: str = "cuda") -> list:
    """TVM's GPU postprocs, then :class:`~tvm_streamk.postproc.RewriteStreamKInit`,
    :class:`~tvm_streamk.postproc.RechunkStreamK` (a batch-invariant candidate's chunk grid)
    and :class:`~tvm_streamk.postproc.VerifyStreamK`, which must see the final kernel."""
    _check_kind(kind)
    return [
        *ms.Postproc.create(kind),
        sk_postproc.RewriteStreamKInit(),
        sk_postproc.RechunkStreamK(),
        sk_postproc.VerifyStreamK(),
    ]


def mutator_probs(kind: str = "cuda") -> dict:
    """TVM's GPU mutators and :class:`MutateStreamK`, with their probabilities."""
    _check_kind(kind)
    return {**ms.Mutator.create(kind), MutateStreamK(): MUTATE_STREAM_K_PROB}


def space(num_sms: int | None = None, knobs: StreamKKnobs | None = None, kind: str = "cuda"):
    """The design space generator: post-order application of :func:`schedule_rules`.

    Parameters
    ----------
    num_sms, knobs
        As for :class:`StreamKRule`.
    kind : str
        Which stock lists to extend: ``"cuda"`` or ``"cuda-tensorcore"`` (fp16 tensor-core
        tiling, whose fragment accumulators take only aligned split-K decisions).
    """
    return ms.space_generator.PostOrderApply(
        sch_rules=schedule_rules(num_sms, knobs, kind),
        postprocs=postprocs(kind),
        mutator_probs=mutator_probs(kind),
    )


def tune(
    mod,
    target,
    work_dir: str,
    max_trials: int,
    *,
    runner=None,
    num_sms: int | None = None,
    knobs: StreamKKnobs | None = None,
    kind: str = "cuda",
    builder=None,
    cost_model=None,
    strategy="evolutionary",
    num_trials_per_iter: int = 64,
    num_tuning_cores="physical",
    seed: int | None = None,
) -> ms.Database:
    """Tune ``mod`` with MetaSchedule, Stream-K decompositions included in the search space.

    Every tiled reduction candidate comes in two forms, data-parallel and Stream-K with sampled
    knobs (:class:`StreamKRule`); both are built with the ``tvm_streamk`` pipeline
    (:func:`stream_k_builder`), measured, and fed to an ``XGBModel`` whose features see the
    lowered Stream-K kernel (:class:`StreamKFeatureExtractor`). Records land in a JSON database
    in ``work_dir``; :func:`compile_tuned` builds the best one.

    Parameters
    ----------
    mod : PrimFunc or IRModule
        The kernel(s) to tune, unscheduled.
    target : Target, str or dict
        A CUDA tag (``"nvidia/nvidia-h100"``) or an OpenCL target (:func:`opencl_target`).
    work_dir : str
        Where the database and logs go.
    max_trials : int
        Candidates to measure in all.
    runner : ms.Runner, optional
        Defaults to :class:`PoclRunner` for OpenCL and to MetaSchedule's ``LocalRunner``
        (a real GPU) otherwise.
    num_sms : int, optional
        SMs of the GPU. Defaults to the compute units of the PoCL device for OpenCL, else to
        :data:`tvm_streamk.gpus.SM_COUNT_BY_TAG` when ``target`` is given as a tag string, else
        to what the target's arch determines (:func:`tvm_streamk.gpus.resolve_num_sms`).
    knobs : StreamKKnobs, optional
        What the Stream-K knobs are sampled from.
    kind : str
        ``"cuda"`` or ``"cuda-tensorcore"``: the stock rule lists to extend (see :func:`space`).
    builder : ms.Builder, optional
        Defaults to :func:`stream_k_builder`.
    cost_model : ms.CostModel, optional
        Defaults to ``XGBModel(extractor=StreamKFeatureExtractor())``.
    strategy : str or ms.SearchStrategy
        As for ``ms.tune_tir``; pass an ``EvolutionarySearch`` with a small population to keep
        short runs short.
    num_trials_per_iter, num_tuning_cores, seed
        As for ``ms.tune_tir``.

    Returns
    -------
    ms.Database

    Examples
    --------
    >>> target = opencl_target()
    >>> db = tune(workloads.gemm(128, 128, 512), target, "work", max_trials=32)
    >>> sch = best_schedule(db, workloads.gemm(128, 128, 512), target)
    >>> pocl.run(sch.mod, *args, pipeline="tvm_streamk")
    """
    resolved = as_target(target)
    num_sms = _num_sms(num_sms, target, resolved)
    target = resolved
    if runner is None:
        if _is_opencl(target):
            from .runner import PoclRunner

            runner = PoclRunner()
        else:
            runner = ms.runner.LocalRunner()
    if cost_model is None:
        cores = None if isinstance(num_tuning_cores, str) else num_tuning_cores
        cost_model = ms.cost_model.XGBModel(
            extractor=StreamKFeatureExtractor(), num_tuning_cores=cores
        )
    with unnamed_handlers_detached():
        return ms.tune_tir(
            mod,
            target,
            work_dir,
            max_trials,
            num_trials_per_iter=num_trials_per_iter,
            builder=builder or stream_k_builder(),
            runner=runner,
            cost_model=cost_model,
            space=space(num_sms, knobs, kind),
            strategy=strategy,
            num_tuning_cores=num_tuning_cores,
            seed=seed,
        )


def best_schedule(database: ms.Database, mod, target) -> Schedule | None:
    """The schedule of the best record of ``mod`` in ``database`` (None without one).

    Stream-K decisions are still annotations on it: build it with the ``tvm_streamk`` pipeline
    (:func:`compile_tuned`, or ``tvm_streamk.pocl.run(sch.mod, ..., pipeline="tvm_streamk")``).
    """
    return ms.tir_integration.compile_tir(database, mod, as_target(target))


def compile_tuned(database: ms.Database, mod, target) -> tvm.runtime.Executable:
    """Build the best record of ``mod`` in ``database`` with the ``tvm_streamk`` pipeline.

    Returns
    -------
    tvm.runtime.Executable
        What ``tvm.compile`` returns; for OpenCL, run the schedule on PoCL instead
        (:func:`best_schedule` and :func:`tvm_streamk.pocl.run`), which TVM's runtime cannot.

    Raises
    ------
    LookupError
        When the database holds no record of ``mod`` for ``target``.
    """
    target = as_target(target)
    sch = best_schedule(database, mod, target)
    if sch is None:
        raise LookupError(
            f"the database holds no tuning record of this module for target {target}; tune it "
            "first (tvm_streamk.meta_schedule.tune) with the same module and target"
        )
    return tvm.compile(sch.mod, target=target, tir_pipeline=PIPELINE)

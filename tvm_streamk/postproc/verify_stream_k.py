"""``VerifyStreamK``: reject a candidate whose Stream-K decision no longer applies."""

from __future__ import annotations

from tvm.ir.utils import derived_object

from .._compat import Schedule, meta_schedule
from ..analysis import analyze
from ..decision import check, record
from ..errors import StreamKError
from ..lowered_view import lowered_view
from ..pipeline import with_safe_reuse


@derived_object
class VerifyStreamK(meta_schedule.postproc.PyPostproc):
    """Accept a candidate only if its Stream-K decisions lower to valid GPU code for the target.

    Runs last, after the stock postprocs (cooperative fetch, unbound blocks, unrolling,
    ``RewriteReductionBlock``, ``VerifyGPUCode`` on the data-parallel form) and
    :class:`RewriteStreamKInit` have shaped the final kernel. For each annotated block it re-runs
    :func:`tvm_streamk.analysis.analyze`, requires the reduction to be decomposed (the rewrite
    restarts the panel loop mid-tile, where ``T.init`` would not fire), and checks the decision
    with :func:`tvm_streamk.decision.check`, as the primitive and the lowering do (a tile-size
    mutation can leave ``splits`` above the panel count). It then lowers the decisions with
    :class:`~tvm_streamk.transform.LowerStreamK` and runs MetaSchedule's own ``VerifyGPUCode``
    on the result: the rewritten kernel must meet the target's shared-memory, thread and vector
    limits too (buffer compaction can fail to tighten a buffer whose indices the persistent walk
    made data-dependent). A failure rejects the candidate: ``apply`` returns False and
    MetaSchedule draws another.

    Candidates without a decision are accepted untouched.

    Examples
    --------
    >>> postprocs = [*ms.Postproc.create("cuda"), RewriteStreamKInit(), RechunkStreamK(),
    ...              VerifyStreamK()]
    """

    def __init__(self) -> None:
        super().__init__()
        self.target = None
        self.verify_gpu_code = meta_schedule.postproc.VerifyGPUCode()

    def _initialize_with_tune_context(self, context) -> None:
        self.target = context.target
        self.verify_gpu_code._initialize_with_tune_context(context)

    def apply(self, sch: Schedule) -> bool:
        decided = record.decided_blocks(sch.mod)
        for _, func, block in decided:
            try:
                site = analyze(func, block.name_hint)
                if site.has_init:
                    return False
                check(site, record.decode(block.annotations, block.name_hint), self.target)
            except StreamKError:
                return False
        if not decided:
            return True
        try:
            view = Schedule(lowered_view(sch.mod, self.target))
        except Exception:  # noqa: BLE001 - any failure to lower means the candidate cannot build
            return False
        # Under the pass configuration the build uses (tvm_streamk.pipeline.with_safe_reuse):
        # without it, TVM 0.27's StorageRewrite breaks the lowering of WMMA kernels whose fix-up
        # adds a static shared buffer, and the check would refuse kernels that build.
        return bool(with_safe_reuse(view.mod, lambda _: self.verify_gpu_code.apply(view)))

    def clone(self) -> VerifyStreamK:
        verify = VerifyStreamK()
        verify.target = self.target
        verify.verify_gpu_code = self.verify_gpu_code.clone()
        return verify

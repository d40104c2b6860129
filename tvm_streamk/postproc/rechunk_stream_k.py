"""``RechunkStreamK``: give a batch-invariant candidate the chunk grid every tiling shares."""

from __future__ import annotations

from tvm import tirx
from tvm.ir.utils import derived_object

from .._compat import Schedule, meta_schedule
from ..analysis import analyze, blocks_under, is_reduction
from ..analysis.reduction_order import ascending_panel_depth
from ..decision import record
from ..decomposition import chunks
from ..errors import StreamKError


@derived_object
class RechunkStreamK(meta_schedule.postproc.PyPostproc):
    """Set each batch-invariant decision's chunk from the candidate's own tiling, or reject it.

    A batch-invariant decision (``tvm_streamk.chunk``) sums each chunk of K from zero in the
    schedule's order and the chunks in chunk order (docs/batch_invariance.md). MetaSchedule tunes
    each M on its own, and the tiling it keeps for one M has another panel depth than the one
    it keeps for the next; the rule records the chunk of the tiling it saw, and a replay with
    other tile sizes keeps that number of panels. So two M's kernels would cut K in different
    places and round differently. This postproc gives every candidate the chunk grid that
    depends on K alone, :func:`tvm_streamk.decomposition.chunks.chunk_elements` elements per
    chunk:

    - a candidate whose threads do not walk K ascending, panel by panel
      (:func:`tvm_streamk.analysis.reduction_order.ascending_panel_depth`), or whose panel depth
      does not divide the chunk length, is rejected: its order is its own;
    - any other gets ``chunk = chunk_elements(K) / depth`` panels, re-annotated when the
      recorded one differs (the ``annotate`` enters the trace, so a replayed record builds the
      same IR).

    - a candidate whose multiply-accumulate block the rule left without a decision in a
      batch-invariant space (``tvm_streamk.not_invariant``, when no invariant decision fitted
      its tiling) is rejected: the kernel as tiled sums K in one pass, its own order.

    Runs before :class:`VerifyStreamK`, which checks the decision this leaves. Other
    candidates without a batch-invariant decision are accepted untouched.

    Examples
    --------
    >>> postprocs = [*ms.Postproc.create("cuda"), RewriteStreamKInit(), RechunkStreamK(),
    ...              VerifyStreamK()]

    A candidate replayed to panels of 8 (K = 512) whose trace recorded ``chunk = 1`` leaves with
    ``T.sblock_attr({..., "tvm_streamk.chunk": 16, ...})``.
    """

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch: Schedule) -> bool:
        for func in sch.mod.functions.values():
            if isinstance(func, tirx.PrimFunc) and any(
                record.KEY_NOT_INVARIANT in b.annotations and is_reduction(b)
                for b in blocks_under(func.body)
            ):
                return False
        for name, func, block in record.decided_blocks(sch.mod):
            if record.KEY_CHUNK not in block.annotations:
                continue
            try:
                site = analyze(func, block.name_hint)
            except StreamKError:
                return False
            depth = ascending_panel_depth(site)
            if depth is None:
                return False
            chunk = chunks.chunk_for_depth(depth * site.kernel_panels, depth)
            if chunk is None:
                return False
            if int(block.annotations[record.KEY_CHUNK]) != chunk:
                block_rv = sch.get_sblock(block.name_hint, func_name=name)
                sch.unannotate(block_rv, record.KEY_CHUNK)
                sch.annotate(block_rv, record.KEY_CHUNK, tirx.IntImm("int32", chunk))
        return True

    def clone(self) -> RechunkStreamK:
        return RechunkStreamK()

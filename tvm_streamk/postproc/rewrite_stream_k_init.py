"""``RewriteStreamKInit``: keep a Stream-K decision on the update block only."""

from __future__ import annotations

from tvm.ir.utils import derived_object

from .._compat import Schedule, meta_schedule
from ..analysis import is_reduction
from ..decision import record


@derived_object
class RewriteStreamKInit(meta_schedule.postproc.PyPostproc):
    """Remove the Stream-K decision that ``decompose_reduction`` copied onto the init block.

    ``decompose_reduction`` gives the new ``*_init`` block every annotation of the reduction
    block, so a decision recorded before the stock ``RewriteReductionBlock`` postproc ran ends up
    on both blocks. The lowering rewrites every block that carries a decision and would refuse an
    init block (it has no reduction axis). This postproc, placed right after
    ``RewriteReductionBlock``, unannotates the decision keys from every annotated block that has
    no reduction axis; the ``unannotate`` instructions enter the trace, so a replayed record ends
    up with the same IR.

    Examples
    --------
    Before (after ``RewriteReductionBlock``), both blocks carry the decision::

        with T.sblock("C_init"):
            T.sblock_attr({"tvm_streamk.policy": 2, ...})
        ...
        with T.sblock("C_update"):
            T.sblock_attr({"tvm_streamk.policy": 2, ...})

    After, only ``C_update`` does; the trace gains
    ``sch.unannotate(block_or_loop=b9, ann_key="tvm_streamk.policy")`` and its siblings.
    """

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch: Schedule) -> bool:
        for name, _, block in record.decided_blocks(sch.mod):
            if not is_reduction(block):
                block_rv = sch.get_sblock(block.name_hint, func_name=name)
                for key in record.KEYS + record.OPTIONAL_KEYS:
                    if key in block.annotations:
                        sch.unannotate(block_rv, key)
        return True

    def clone(self) -> RewriteStreamKInit:
        return RewriteStreamKInit()

"""The lowered view of a Stream-K candidate: the kernel as it will run, as a schedulable module.

MetaSchedule's feature extractor and its GPU-code verifier (:mod:`tvm_streamk.meta_schedule`,
:class:`tvm_streamk.postproc.VerifyStreamK`) read ``candidate.sch.mod``, where a
Stream-K decision is still a set of block annotations. They must see the rewritten kernel instead,
and both take it wrapped in a ``Schedule``. A ``Schedule`` refuses blocks whose bodies use loop
variables defined outside them, which the fix-ups' rewritten blocks do, so the view makes every
block opaque with the passes that both consumers run first anyway, in their order.
"""

from __future__ import annotations

import tvm

from .analysis import blocks_under
from .decision import record
from .pipeline import lower

# The passes PerStoreFeature and VerifyGPUCode start with, up to the one that makes every block
# opaque; the allocation planning between them is left to those consumers: on a block whose
# region reads a ``Bind`` variable it hoists the region above the binding, which a Schedule
# refuses to hold.
_OPAQUE = tvm.transform.Sequential(
    [
        tvm.s_tir.transform.LowerCrossThreadReduction(),
        tvm.s_tir.transform.LowerInitBlock(),
        tvm.s_tir.transform.ConvertBlocksToOpaque(),
    ]
)


def has_stream_k(mod: tvm.IRModule) -> bool:
    """Whether any block of ``mod`` carries a Stream-K decision.

    Examples
    --------
    >>> has_stream_k(sch.mod)  # after annotate_stream_k(sch, ...)
    True
    """
    return any(
        record.has_decision(block.annotations)
        for func in mod.functions.values()
        if isinstance(func, tvm.tirx.PrimFunc)
        for block in blocks_under(func.body)
    )


def lowered_view(mod: tvm.IRModule, target, rewrite_func=None) -> tvm.IRModule:
    """``mod`` after :class:`~tvm_streamk.transform.LowerStreamK`, blocks opaque.

    Parameters
    ----------
    mod : IRModule
        A scheduled candidate with Stream-K decisions.
    target : Target
        The target the decisions are lowered for (fix-ups depend on it).
    rewrite_func : callable, optional
        Applied to every lowered PrimFunc before its blocks are made opaque.

    Returns
    -------
    IRModule
        A module ``tvm.s_tir.Schedule`` accepts; nothing is meant to be scheduled on it.

    Raises
    ------
    StreamKError
        When a decision cannot be lowered.
    """
    lowered = lower(mod, target)
    if rewrite_func is not None:
        lowered = tvm.IRModule(
            {
                gv: rewrite_func(f) if isinstance(f, tvm.tirx.PrimFunc) else f
                for gv, f in lowered.functions.items()
            },
            attrs=lowered.attrs,
        )
    return _OPAQUE(lowered)

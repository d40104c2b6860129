"""``StreamKFeatureExtractor``: per-store features of the kernel as it will really run."""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm.ir.utils import derived_object

from .. import cost_model, decomposition
from .._compat import Schedule, meta_schedule, structural_map
from ..analysis import analyze, blocks_under
from ..decision import decode, has_decision, resolve
from ..lowered_view import has_stream_k, lowered_view

# The column appended to every store's features: log2 of the speed-up over data-parallel that
# the analytical model (tvm_streamk.cost_model) predicts for the candidate's decision, in
# microseconds on a GPU of its GPU_SPECS and in units elsewhere; 0 without a decision.
MODEL_FEATURES = ("log2_predicted_speedup",)


def _without_select(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with every ``Select`` written as the equivalent ``if_then_else`` call.

    PerStoreFeature's first pass replaces each ``Select`` without a buffer load by the constant 1
    (a proxy for predicates). In the persistent walk ``Select`` computes the unit ranges and the
    segment counts, so that substitution turns trip counts into constants, some of them 0, and the
    extractor then aborts on a zero-iteration nest. ``if_then_else`` keeps them symbolic: unknown
    trip counts, as for any loop whose extent depends on the block index.
    """

    def as_call(select):
        return tvm.tirx.if_then_else(select.condition, select.true_value, select.false_value)

    return func.with_body(structural_map(func.body, (tvm.tirx.Select, as_call)))


def _without_empty_loops(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` without the loops whose extent is the constant 0.

    PerStoreFeature drops such loops before it simplifies, not after, and then divides by the
    product of the loop extents above each store; the persistent walk has loops that simplify to
    zero trips (the Stream-K part of a hybrid whose tiles fill whole waves).
    """

    def drop(loop):
        if isinstance(loop.extent, tvm.tirx.IntImm) and int(loop.extent) == 0:
            return tvm.tirx.Evaluate(0)
        return loop

    return func.with_body(structural_map(func.body, (tvm.tirx.For, drop)))


def _for_features(mod: tvm.IRModule, target) -> tvm.IRModule:
    """The lowered view of ``mod`` that PerStoreFeature can take apart."""
    view = tvm.tirx.transform.StmtSimplify()(lowered_view(mod, target, _without_select))
    return tvm.IRModule(
        {
            gv: _without_empty_loops(f) if isinstance(f, tvm.tirx.PrimFunc) else f
            for gv, f in view.functions.items()
        },
        attrs=view.attrs,
    )


@derived_object
class StreamKFeatureExtractor(meta_schedule.feature_extractor.PyFeatureExtractor):
    """``PerStoreFeature`` of each candidate after :class:`~tvm_streamk.transform.LowerStreamK`.

    A Stream-K decision is a set of block annotations until the ``tvm_streamk`` pipeline
    rewrites the kernel, so the stock extractor would see a Stream-K candidate and its
    data-parallel twin as the same program and the cost model could not learn which is faster.
    This extractor hands ``PerStoreFeature`` the lowered kernel instead
    (:func:`~tvm_streamk.lowered_view.lowered_view`): the persistent ``blockIdx.x`` grid,
    the unit and segment loops with their index arithmetic, the fix-up's stores, atomics and
    workspace, and the prologue kernels all show up in the loop-nest, arithmetic and buffer
    features. The lowering happens here rather than in a postproc because a postproc can change
    a candidate only through schedule primitives recorded in its trace, and the rewrite is not
    one. Candidates without a decision are passed through unchanged.

    Trip counts that depend on the block index (segments per block, panels per segment) are
    unknown to ``PerStoreFeature``, which counts such loops once, as it does for any loop with a
    non-constant extent. So every store's features end with :data:`MODEL_FEATURES`: the
    analytical model's predicted speed-up of the candidate's decision over data-parallel
    (log2; 0 for a data-parallel candidate, a run-time tile count or a kernel it cannot
    analyse), which knows the waves, the split tiles and the fix-up's traffic.

    Parameters
    ----------
    **kwargs
        Forwarded to ``ms.feature_extractor.PerStoreFeature``.

    Examples
    --------
    >>> cost_model = ms.cost_model.XGBModel(extractor=StreamKFeatureExtractor())
    """

    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.per_store = meta_schedule.feature_extractor.PerStoreFeature(**kwargs)

    def extract_from(self, context, candidates):
        as_run = [self._as_run(context, candidate) for candidate in candidates]
        stores = self.per_store.extract_from(context, as_run)
        out = []
        for candidate, features in zip(candidates, stores):
            array = features.numpy()
            column = np.full((array.shape[0], 1), _log2_speedup(candidate.sch.mod, context.target))
            out.append(
                tvm.runtime.tensor(np.concatenate([array, column], axis=1).astype(array.dtype))
            )
        return out

    @staticmethod
    def _as_run(context, candidate):
        if not has_stream_k(candidate.sch.mod):
            return candidate
        view = Schedule(_for_features(candidate.sch.mod, context.target))
        return meta_schedule.MeasureCandidate(view, candidate.args_info)


def _log2_speedup(mod: tvm.IRModule, target) -> float:
    """log2 of the model's predicted speed-up of ``mod``'s decision over data-parallel."""
    for func in mod.functions.values():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        for block in blocks_under(func.body):
            if not has_decision(block.annotations):
                continue
            try:
                site = analyze(func, block.name_hint)
                if site.runtime_tiles:
                    return 0.0
                decision = decode(block.annotations, block.name_hint)
                chosen = resolve(site, decision, target)
                dp = decomposition.plan(
                    chosen.tiles,
                    chosen.panels,
                    chosen.num_sms,
                    chosen.blocks_per_sm,
                    "data_parallel",
                )
                cost = cost_model.cost_for(site, target, decision.fixup)
                t = cost_model.predicted_time(chosen, cost=cost, fixup=decision.fixup)
                t_dp = cost_model.predicted_time(dp, cost=cost, fixup=decision.fixup)
            except (ValueError, tvm.TVMError):
                return 0.0
            return math.log2(t_dp / t) if t > 0 and t_dp > 0 else 0.0
    return 0.0

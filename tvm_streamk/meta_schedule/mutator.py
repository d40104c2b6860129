"""``MutateStreamK``: evolutionary-search moves over the sampled Stream-K knobs."""

from __future__ import annotations

import random

from tvm.ir.utils import derived_object
from tvm.s_tir.schedule import Trace

from .._compat import meta_schedule
from ..decision import record


def stream_k_decisions(trace: Trace) -> list:
    """The ``SampleCategorical`` instructions of ``trace`` that feed a Stream-K annotation.

    Found the way the stock ``MutateUnroll`` finds its knobs: an ``Annotate`` instruction whose
    key is one of :data:`tvm_streamk.decision.KEYS` and whose value is the output of a
    ``SampleCategorical`` instruction. Instructions with a single candidate are left out: they
    have nothing to mutate to.

    Examples
    --------
    For a design-space candidate of :class:`StreamKRule` with the default knobs (policy, blocks
    per SM, splits, fix-up; the group knob has one value):

    >>> [len(inst.attrs[0]) for inst in stream_k_decisions(sch.trace)]
    [4, 2, 4, 2]
    """
    samplers = {}
    found = []
    for inst in trace.insts:
        kind = inst.kind.name
        if kind == "SampleCategorical":
            samplers[inst.outputs[0]] = inst
        elif kind == "Annotate" and str(inst.attrs[0]) in record.KEYS:
            sampler = samplers.get(inst.inputs[1])
            if sampler is not None and len(sampler.attrs[0]) > 1 and sampler not in found:
                found.append(sampler)
    return found


@derived_object
class MutateStreamK(meta_schedule.mutator.PyMutator):
    """Change one sampled Stream-K knob (policy, blocks per SM, splits, fix-up, group).

    Picks one of :func:`stream_k_decisions` uniformly and moves its decision to another
    candidate, drawn with the sampler's probabilities renormalised over the other candidates
    (as ``MutateUnroll`` does). The postprocs are stripped from the returned trace; MetaSchedule
    replays it and runs them again, so :class:`~tvm_streamk.postproc.VerifyStreamK` rejects a
    mutation that leaves the decision invalid for the tiling. A trace without Stream-K knobs (a
    data-parallel candidate) is not mutated: ``apply`` returns None.

    Examples
    --------
    >>> mutators = {**ms.Mutator.create("cuda"), MutateStreamK(): 0.1}
    """

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace: Trace, rand_state: int) -> Trace | None:
        decisions = stream_k_decisions(trace)
        if not decisions:
            return None
        # MetaSchedule passes its linear-congruential state by value; seeding from it keeps a
        # tuning run reproducible for a fixed seed.
        rng = random.Random(int(rand_state))
        inst = rng.choice(decisions)
        current = int(trace.decisions[inst])
        probs = [float(p) for p in inst.attrs[1]]
        others = [i for i in range(len(probs)) if i != current]
        weights = [probs[i] for i in others]
        if sum(weights) <= 0:
            weights = None
        new = rng.choices(others, weights=weights)[0]
        return trace.with_decision(inst, new, remove_postproc=True)

    def clone(self) -> MutateStreamK:
        return MutateStreamK()

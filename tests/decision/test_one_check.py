"""One home for the decision: the primitive, the lowering and MetaSchedule refuse alike.

Each case is a decision the kernel cannot take. It is asked of the primitive
(``tvm_streamk.stream_k``), recorded by hand on the block and lowered (``LowerStreamK``, as a
decision written by MetaSchedule or a replayed trace reaches it), and asked of MetaSchedule's
annotation step (``annotate_stream_k``). All three go through ``tvm_streamk.decision.check``,
so the three refusals must be the same error, word for word.
"""

import pytest

import tvm_streamk
from tests.helpers import OPENCL
from tvm_streamk import decision, workloads
from tvm_streamk.errors import StreamKError
from tvm_streamk.meta_schedule import annotate_stream_k


def _schedule(epilogue=None, k=24):
    func = workloads.gemm(64, 48, k, epilogue=epilogue)
    return workloads.reference_schedule(func, bm=32, bn=16, bk=8, tm=4, tn=4)


CASES = {
    # 3 panels cannot be split in 5.
    "splits above the panel count": (
        {},
        decision.Decision("split_k", None, 4, 1, 5, "atomic", 0),
    ),
    # Only Stream-K takes its work split from a grid read at run time.
    "a run-time grid for split-K": (
        {},
        decision.Decision("split_k", None, decision.DEVICE_SMS, 1, 2, "workspace", 0),
    ),
    # Atomic adds would apply the bias and ReLU to every partial sum.
    "atomics under a fused epilogue": (
        {"epilogue": "bias_relu"},
        decision.Decision("stream_k", None, 4, 1, 1, "atomic", 0),
    ),
}
# The primitive takes group=None or a positive int and refuses other values as a knob, before
# it looks at the kernel; recorded decisions reach the shared check with any int.
RECORDED_ONLY = {
    "a negative tile-row group": ({}, decision.Decision("stream_k", None, 4, 1, 1, "atomic", -1)),
}


def _primitive(kernel: dict, d: decision.Decision) -> str:
    sch = _schedule(**kernel)
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(
            sch,
            "C_update",
            num_sms="device" if d.num_sms == decision.DEVICE_SMS else d.num_sms,
            blocks_per_sm=d.blocks_per_sm,
            policy=d.policy,
            variant=d.variant,
            splits=d.splits if d.policy == "split_k" else None,
            fixup=d.fixup,
            target=OPENCL,
        )
    return str(info.value)


def _lowering(kernel: dict, d: decision.Decision) -> str:
    sch = _schedule(**kernel)
    # A decision the kernel takes first (it decomposes the reduction), then the bad one
    # written over it, as a hand-written or replayed decision reaches the lowering.
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, policy="data_parallel", target=OPENCL)
    block = sch.get_sblock("C_update")
    for key in decision.KEYS:
        sch.unannotate(block, key)
    for key, value in d.as_annotations().items():
        sch.annotate(block, key, value)
    with pytest.raises(StreamKError) as info:
        tvm_streamk.lower(sch, OPENCL)
    return str(info.value)


def _meta_schedule(kernel: dict, d: decision.Decision) -> str:
    sch = _schedule(**kernel)
    with pytest.raises(StreamKError) as info:
        annotate_stream_k(
            sch,
            "C_update",
            num_sms="device" if d.num_sms == decision.DEVICE_SMS else d.num_sms,
            policy=d.policy,
            blocks_per_sm=d.blocks_per_sm,
            splits=d.splits,
            fixup=d.fixup,
            group=d.group,
            target=OPENCL,
        )
    return str(info.value)


@pytest.mark.parametrize("case", CASES)
def test_the_primitive_the_lowering_and_meta_schedule_refuse_alike(case):
    kernel, d = CASES[case]
    lowering, meta = _lowering(kernel, d), _meta_schedule(kernel, d)
    assert lowering == meta
    assert _primitive(kernel, d) == lowering


@pytest.mark.parametrize("case", RECORDED_ONLY)
def test_the_lowering_and_meta_schedule_refuse_recorded_decisions_alike(case):
    kernel, d = RECORDED_ONLY[case]
    assert _lowering(kernel, d) == _meta_schedule(kernel, d)
    with pytest.raises(StreamKError, match=r"\[group\]: found group=-1\. Pass a positive int"):
        tvm_streamk.stream_k(_schedule(**kernel), "C_update", num_sms=4, group=-1)


def test_a_chooser_with_a_fixup_the_kernel_cannot_use_keeps_tiles_whole():
    # 6 tiles of 256 panels on 4 SMs: the heuristic splits tiles, with a fix-up that can.
    assert tvm_streamk.stream_k(
        _schedule(k=2048), "C_update", num_sms=4, policy="heuristic", target=OPENCL
    ).sk_tiles
    # heuristic + atomic on a fused epilogue: the choice comes first and keeps every tile
    # whole, which needs no fix-up, instead of a refusal before the heuristic chose.
    sch = _schedule(epilogue="bias_relu", k=2048)
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=4, policy="heuristic", fixup="atomic", target=OPENCL
    )
    assert plan.policy == "data_parallel"
    assert "the fix-up cannot split a tile here" in plan.reason
    assert "fused epilogue" in plan.reason

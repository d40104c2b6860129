"""Trace round trips of ``stream_k``: printed, serialised to JSON and replayed on a fresh schedule.

``stream_k`` records its decision as stock ``annotate`` instructions (and a
``decompose_reduction`` when the block still has ``T.init``), so a replayed trace must lower to
exactly the kernel the original schedule lowers to, without re-running the cost model.
"""

import pytest
import tvm
from tvm.s_tir import Schedule, Trace

import tvm_streamk
from tests.helpers import OPENCL, block_idx_extents
from tvm_streamk import cost_model, workloads
from tvm_streamk.decision import record as annotations
from tvm_streamk.errors import StreamKError
from tvm_streamk.meta_schedule.annotate import without_stream_k

# 3 x 2 tiles of 32 x 32, 5 K-panels of 8: 30 iterations, uneven over 4 blocks.
FUNC = workloads.gemm(96, 64, 40)
# 5 x 1 tiles of 64 panels on 4 SMs: one tile past a full wave, where the heuristic leaves
# data-parallel (it picks a hybrid).
HEURISTIC_FUNC = workloads.gemm(160, 32, 512)


def _scheduled(func, **kwargs) -> tuple[Schedule, tvm_streamk.Plan]:
    sch = workloads.reference_schedule(func)
    kwargs.setdefault("target", OPENCL)
    return sch, tvm_streamk.stream_k(sch, "C_update", **kwargs)


def _via_json(sch: Schedule, func) -> Schedule:
    """Replay ``sch``'s trace on a fresh schedule of ``func`` through JSON text."""
    text = tvm.ir.save_json(sch.trace.as_json())
    replayed = Schedule(func)
    Trace.apply_json_to_schedule(tvm.ir.load_json(text), replayed)
    return replayed


def _via_apply(sch: Schedule, func) -> Schedule:
    replayed = Schedule(func)
    sch.trace.apply_to_schedule(replayed, remove_postproc=False)
    return replayed


def _lowered(sch: Schedule) -> tvm.IRModule:
    return tvm_streamk.lower(sch, OPENCL)


def _recorded_annotation(key: str, value) -> str:
    shown = f'"{value}"' if isinstance(value, str) else int(value)
    return f'ann_key="{key}", ann_val={shown}'


POLICIES = [
    dict(policy="stream_k", num_sms=4),
    dict(policy="hybrid", variant="one_tile", num_sms=4),
    dict(policy="hybrid", variant="two_tile", num_sms=4),
    dict(policy="split_k", splits=2, num_sms=4),
    dict(policy="stream_k", num_sms=3, blocks_per_sm=2, group=2),
    dict(policy="stream_k", num_sms=4, fixup="atomic"),
    dict(policy="stream_k", num_sms=4, fixup="workspace"),
]
REPLAYS = {"json": _via_json, "apply_to_schedule": _via_apply}


@pytest.mark.parametrize("replay", REPLAYS.values(), ids=REPLAYS.keys())
@pytest.mark.parametrize("kwargs", POLICIES, ids=lambda k: "-".join(map(str, k.values())))
def test_replayed_trace_lowers_to_the_same_kernel(kwargs, replay):
    sch, plan = _scheduled(FUNC, **kwargs)
    expected = _lowered(sch)
    # The decision really changed the kernel: a persistent grid replaced the 3 x 2 tile band.
    assert ("blockIdx.y", 3) not in block_idx_extents(expected)
    assert ("blockIdx.x", plan.grid) in block_idx_extents(expected)
    tvm.ir.assert_structural_equal(_lowered(replay(sch, FUNC)), expected)


def test_printed_trace_holds_every_decision_as_an_annotate():
    sch, plan = _scheduled(
        FUNC, policy="hybrid", variant="one_tile", num_sms=4, group=2, fixup="atomic"
    )
    text = str(sch.trace)
    decision = annotations.Decision(
        policy="hybrid",
        variant="one_tile",
        num_sms=4,
        blocks_per_sm=1,
        splits=1,
        fixup="atomic",
        group=2,
    )
    for key, value in decision.as_annotations().items():
        assert _recorded_annotation(key, value) in text
    assert text.count("sch.annotate(") == len(annotations.KEYS)
    # The policy and the fix-up read as names, not codes.
    assert 'ann_val="hybrid_one_tile"' in text and 'ann_val="atomic"' in text
    assert plan.policy == "hybrid" and plan.variant == "one_tile"


def test_json_text_round_trips_to_an_identical_trace():
    sch, _ = _scheduled(FUNC, num_sms=4)
    text = tvm.ir.save_json(sch.trace.as_json())
    assert "tvm_streamk.policy" in text
    replayed = _via_json(sch, FUNC)
    assert str(replayed.trace) == str(sch.trace)
    assert tvm.ir.save_json(replayed.trace.as_json()) == text


def test_heuristic_records_its_concrete_choice(monkeypatch):
    sch, plan = _scheduled(HEURISTIC_FUNC, policy="heuristic", num_sms=4)
    assert plan.policy != "data_parallel", plan.reason
    text = str(sch.trace)
    assert _recorded_annotation(annotations.KEY_POLICY, plan.scheme.key) in text
    assert "heuristic" not in text
    expected = _lowered(sch)

    def no_model(*args, **kwargs):
        raise AssertionError("replaying a trace must not re-run the cost model")

    monkeypatch.setattr(cost_model, "choose", no_model)
    for replay in REPLAYS.values():
        tvm.ir.assert_structural_equal(_lowered(replay(sch, HEURISTIC_FUNC)), expected)
    # The replayed kernel is the explicit policy's kernel.
    explicit, _ = _scheduled(HEURISTIC_FUNC, policy=plan.policy, variant=plan.variant, num_sms=4)
    tvm.ir.assert_structural_equal(_lowered(explicit), expected)


@pytest.fixture(scope="module")
def schedule_with_init() -> Schedule:
    """The reference schedule without its final ``decompose_reduction``: ``C`` keeps ``T.init``."""
    reference = workloads.reference_schedule(FUNC).trace
    insts = [inst for inst in reference.insts if inst.kind.name != "DecomposeReduction"]
    assert len(insts) == len(reference.insts) - 1
    sch = Schedule(FUNC)
    Trace(insts, {}).apply_to_schedule(sch, remove_postproc=False)
    assert sch.get(sch.get_sblock("C")).init is not None
    return sch


def test_block_with_init_records_the_decomposition(schedule_with_init):
    sch = schedule_with_init.copy()
    plan = tvm_streamk.stream_k(sch, "C", num_sms=4, target=OPENCL)
    kinds = [inst.kind.name for inst in sch.trace.insts]
    assert kinds.count("DecomposeReduction") == 1
    assert kinds.index("DecomposeReduction") < kinds.index("Annotate")
    assert "sch.decompose_reduction(" in str(sch.trace)
    expected = _lowered(sch)
    assert ("blockIdx.x", plan.grid) in block_idx_extents(expected)
    for replay in REPLAYS.values():
        tvm.ir.assert_structural_equal(_lowered(replay(sch, FUNC)), expected)
    # Decomposing inside stream_k gives the kernel of decomposing first, by hand.
    by_hand, _ = _scheduled(FUNC, num_sms=4)
    tvm.ir.assert_structural_equal(_lowered(by_hand), expected)


@pytest.mark.parametrize("replay", REPLAYS.values(), ids=REPLAYS.keys())
def test_a_second_stream_k_replaces_the_decision(replay):
    sch, first = _scheduled(FUNC, policy="stream_k", num_sms=4)
    second = tvm_streamk.stream_k(sch, "C_update", policy="split_k", splits=2, num_sms=4)
    assert (first.grid, second.grid) == (4, 12)
    block = sch.get(sch.get_sblock("C_update"))
    decision = annotations.decode(block.annotations, "C_update")
    assert (decision.policy, decision.splits) == ("split_k", 2)
    lowered = _lowered(sch)
    # Split-K of 6 tiles in 2 (5 panels: the unaligned, persistent form): 12 blocks.
    assert ("blockIdx.x", 12) in block_idx_extents(lowered)
    tvm.ir.assert_structural_equal(_lowered(replay(sch, FUNC)), lowered)


@pytest.mark.parametrize("pipeline", [None, "default", "s_tir"])
def test_a_pipeline_without_the_lowering_refuses_a_decision(pipeline):
    sch, _ = _scheduled(FUNC, policy="stream_k", num_sms=4)
    kwargs = {} if pipeline is None else {"tir_pipeline": pipeline}
    with pytest.raises(StreamKError, match=r"'C_update' of 'main'.*tvm_streamk") as info:
        tvm.compile(sch.mod, target=OPENCL, **kwargs)
    assert info.value.condition == "pipeline"
    # The same schedule builds with the Stream-K pipeline, and without its decision anywhere.
    tvm.compile(sch.mod, target=OPENCL, tir_pipeline="tvm_streamk")
    tvm.compile(without_stream_k(sch.mod), target=OPENCL)

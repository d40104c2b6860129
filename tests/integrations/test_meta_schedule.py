"""MetaSchedule integration: Stream-K twins in the design space, built, measured and modelled.

Offline checks use the ``nvidia/nvidia-h100`` tag (132 SMs): a 1024x1024x4096 fp32 GEMM has tile
counts MultiLevelTiling draws from 1 to 1024, none a multiple of 132 beyond the full waves, so
quantisation matters there. The end-to-end test tunes a 128x128x512 GEMM for OpenCL, measured for
real on PoCL; its best records are checked against float64 numpy with the output poisoned with NaN
(fp32 accumulation of 512 products of values in [-1, 1]: relative error <= 1e-5).
"""

import os
import shutil
import tarfile

import numpy as np
import pytest
import tvm
from tvm.s_tir import meta_schedule as ms

import tvm_streamk
from tests.helpers import FP32_TOL
from tvm_streamk import meta_schedule as skms
from tvm_streamk import pocl, ptxas, workloads
from tvm_streamk.decision import record as ann
from tvm_streamk.errors import StreamKError
from tvm_streamk.meta_schedule.annotate import policy_code, without_stream_k
from tvm_streamk.meta_schedule.builder import ir_path
from tvm_streamk.meta_schedule.runner import MismatchError, _check_against_twin
from tvm_streamk.postproc import RewriteStreamKInit, VerifyStreamK

H100 = "nvidia/nvidia-h100"
H100_SMS = 132


def _decision_block(mod):
    blocks = [
        b
        for b in tvm_streamk.analysis.blocks_under(mod["main"].body)
        if ann.has_decision(b.annotations)
    ]
    assert len(blocks) == 1, [b.name_hint for b in blocks]
    return blocks[0]


def _knob_samplers(trace):
    """``{annotation key: SampleCategorical instruction}`` for the sampled Stream-K knobs."""
    samplers = {
        inst.outputs[0]: inst for inst in trace.insts if inst.kind.name == "SampleCategorical"
    }
    found = {}
    for inst in trace.insts:
        if inst.kind.name == "Annotate" and str(inst.attrs[0]) in ann.KEYS:
            if inst.inputs[1] in samplers:
                found[str(inst.attrs[0])] = samplers[inst.inputs[1]]
    return found


@pytest.fixture(scope="module")
def h100_context():
    func = workloads.gemm(1024, 1024, 4096)
    return ms.TuneContext(
        mod=func,
        target=tvm.target.Target(H100),
        space_generator=skms.space(num_sms=H100_SMS),
        task_name="main",
        rand_state=7,
        num_threads=2,
    )


@pytest.fixture(scope="module")
def h100_spaces(h100_context):
    return h100_context.generate_design_space()


@pytest.fixture(scope="module")
def h100_round(h100_context):
    """The candidates of one tuning round: design-space traces replayed with fresh decisions,
    postprocs applied, as MetaSchedule sends them to the builder."""
    context = ms.TuneContext(
        mod=h100_context.mod,
        target=h100_context.target,
        space_generator=skms.space(num_sms=H100_SMS),
        search_strategy=ms.search_strategy.ReplayTrace(),
        task_name="main",
        rand_state=5,
        num_threads=2,
    )
    context.pre_tuning(max_trials=8, num_trials_per_iter=8, cost_model=ms.cost_model.RandomModel())
    return context.generate_measure_candidates()


# ---------------------------------------------------------------------------------------------
# The design space


def test_design_space_keeps_data_parallel_and_adds_stream_k_twins(h100_spaces):
    stream_k = [s for s in h100_spaces if skms.has_stream_k(s.mod)]
    data_parallel = [s for s in h100_spaces if not skms.has_stream_k(s.mod)]
    assert stream_k and data_parallel
    # One twin per MultiLevelTiling candidate: the rule keeps every tiling and adds one copy.
    assert len(stream_k) == len(data_parallel)
    for sch in stream_k:
        block = _decision_block(sch.mod)
        # MultiLevelTiling bound the fused tile loops to blockIdx.x itself; the decomposition
        # waits for RewriteReductionBlock, so the annotated block still has T.init here.
        assert block.name_hint == "C" and block.init is not None
        assert int(block.annotations[ann.KEY_NUM_SMS]) == H100_SMS
        samplers = _knob_samplers(sch.trace)
        assert set(samplers) == set(ann.KEYS) - {ann.KEY_NUM_SMS}
        for key, inst in samplers.items():
            chosen = inst.attrs[0][int(sch.trace.decisions[inst])]
            assert int(block.annotations[key]) == int(chosen), key
        policies = {int(c) for c in samplers[ann.KEY_POLICY].attrs[0]}
        assert policies == {policy_code(p) for p in skms.StreamKKnobs().policies}


def test_batch_invariant_space_holds_only_invariant_candidates():
    """With ``StreamKKnobs(batch_invariant=True)`` every candidate carries a batch-invariant
    decision (the plain tiling is not invariant, so it is replaced, not kept), data-parallel
    among the sampled policies, the workspace fix-up only."""
    context = ms.TuneContext(
        mod=workloads.gemm(1024, 1024, 4096),
        target=tvm.target.Target(H100),
        space_generator=skms.space(num_sms=H100_SMS, knobs=skms.StreamKKnobs(batch_invariant=True)),
        task_name="main",
        rand_state=7,
        num_threads=2,
    )
    spaces = context.generate_design_space()
    assert spaces and all(skms.has_stream_k(s.mod) for s in spaces)
    for sch in spaces:
        block = _decision_block(sch.mod)
        decision = ann.decode(block.annotations, block.name_hint)
        assert decision.chunk > 0 and decision.fixup == "workspace"
        samplers = _knob_samplers(sch.trace)
        policies = {int(c) for c in samplers[ann.KEY_POLICY].attrs[0]}
        assert policy_code("data_parallel") in policies
        # The chunk is a fact of the tiling, never sampled.
        assert ann.KEY_CHUNK not in samplers


def test_design_space_twins_share_their_tiling(h100_spaces):
    def tiling(sch):
        return [
            [int(x) for x in sch.trace.decisions[inst]]
            for inst in sch.trace.insts
            if inst.kind.name == "SamplePerfectTile"
        ]

    stream_k = [tiling(s) for s in h100_spaces if skms.has_stream_k(s.mod)]
    data_parallel = [tiling(s) for s in h100_spaces if not skms.has_stream_k(s.mod)]
    assert sorted(stream_k) == sorted(data_parallel)


def test_rule_leaves_blocks_it_cannot_decompose_alone():
    func = workloads.gemm(64, 64, 64)
    rule = skms.StreamKRule(num_sms=4)
    sch = tvm.s_tir.Schedule(func)
    # No blockIdx band: nothing to decompose.
    assert len(rule.apply(sch, sch.get_sblock("C"))) == 1
    sch = workloads.reference_schedule(func)
    out = rule.apply(sch, sch.get_sblock("C_update"))
    assert len(out) == 2 and not skms.has_stream_k(out[0].mod) and skms.has_stream_k(out[1].mod)


def test_knobs_refuse_what_cannot_be_sampled():
    with pytest.raises(ValueError, match="splits"):
        skms.StreamKKnobs(splits=(1, 2))
    with pytest.raises(ValueError, match="blocks_per_sm"):
        skms.StreamKKnobs(blocks_per_sm=())
    with pytest.raises(StreamKError, match="policy"):
        skms.StreamKKnobs(policies=("stream_k", "heuristic"))
    with pytest.raises(StreamKError, match="fixup"):
        skms.StreamKKnobs(fixups=("auto",))


# ---------------------------------------------------------------------------------------------
# annotate_stream_k


def test_annotate_records_plain_and_sampled_knobs():
    func = workloads.gemm(96, 96, 64)
    sch = workloads.reference_schedule(func)
    policy = sch.sample_categorical(
        candidates=[policy_code("stream_k"), policy_code("hybrid_one_tile")],
        probs=[0.5, 0.5],
        decision=1,
    )
    plan = skms.annotate_stream_k(
        sch, "C_update", num_sms=4, policy=policy, blocks_per_sm=2, target=skms.opencl_target()
    )
    assert (plan.policy, plan.variant, plan.grid) == ("hybrid", "one_tile", 8)
    block = _decision_block(sch.mod)
    assert int(block.annotations[ann.KEY_POLICY]) == policy_code("hybrid_one_tile")
    assert int(block.annotations[ann.KEY_BLOCKS_PER_SM]) == 2
    annotates = {str(i.attrs[0]): i.inputs[1] for i in sch.trace.insts if i.kind.name == "Annotate"}
    assert annotates[ann.KEY_POLICY].same_as(policy)
    assert isinstance(annotates[ann.KEY_BLOCKS_PER_SM], tvm.tirx.IntImm)
    # The stored decision is the one the lowering reads back.
    decision = ann.decode(block.annotations, block.name_hint)
    assert (decision.policy, decision.variant, decision.num_sms) == ("hybrid", "one_tile", 4)


def test_annotate_refuses_what_stream_k_refuses():
    func = workloads.gemm(64, 64, 64)
    with pytest.raises(StreamKError, match="tile-band"):
        skms.annotate_stream_k(tvm.s_tir.Schedule(func), "C", num_sms=4)
    sch = workloads.reference_schedule(func)
    with pytest.raises(StreamKError, match="decomposition"):
        # 8 panels of 8: a split count above the panel count has empty splits.
        skms.annotate_stream_k(sch, "C_update", num_sms=4, policy="split_k", splits=9)
    skms.annotate_stream_k(sch, "C_update", num_sms=4)
    with pytest.raises(StreamKError, match="already carries"):
        skms.annotate_stream_k(sch, "C_update", num_sms=4)


def _finished_tensor_core_sample():
    """A finished (postprocs applied) ``cuda-tensorcore`` sample and its WMMA reduction site."""
    import tvm.s_tir.tensor_intrin  # noqa: F401 - registers the WMMA intrinsics

    target = tvm.target.Target("nvidia/nvidia-a100")
    func = workloads.gemm(512, 384, 1024, in_dtype="float16", out_dtype="float32")
    context = ms.TuneContext(
        mod=func,
        target=target,
        space_generator=ms.space_generator.PostOrderApply(
            sch_rules="cuda-tensorcore",
            postprocs="cuda-tensorcore",
            mutator_probs="cuda-tensorcore",
        ),
        task_name="main",
        rand_state=3,
    )
    for space in context.generate_design_space():
        sch = space.copy()
        if not all(post.apply(sch) for post in context.space_generator.postprocs):
            continue
        for block in tvm_streamk.analysis.blocks_under(sch.mod["main"].body):
            try:
                site = skms.site_of(sch, block.name_hint)
            except StreamKError:
                continue
            if site.fragment_accumulator:
                return target, sch, site
    raise AssertionError("the cuda-tensorcore design space must hold a WMMA candidate")


def test_annotate_gives_a_fragment_accumulator_only_aligned_splits():
    target, sch, site = _finished_tensor_core_sample()
    block = site.block.name_hint
    with pytest.raises(StreamKError, match="fragment-aligned-split"):
        skms.annotate_stream_k(sch.copy(), block, num_sms=108, fixup="workspace", target=target)
    uneven = next(s for s in range(2, site.panels) if site.panels % s)
    with pytest.raises(StreamKError, match="fragment-aligned-split"):
        skms.annotate_stream_k(
            sch.copy(), block, num_sms=108, policy="split_k", splits=uneven, fixup="workspace"
        )
    # Fragments have no element addresses: the atomic fix-up is not among the choices.
    assert skms.applicable_fixups(site, target) == ("workspace",)
    aligned = next(s for s in (4, 2) if site.panels % s == 0)
    plan = skms.annotate_stream_k(
        sch, block, num_sms=108, policy="split_k", splits=aligned, fixup="workspace", target=target
    )
    assert plan.grid == site.tiles * aligned


# ---------------------------------------------------------------------------------------------
# The tensor-core design space: twins of the blockized MMA update, built for sm_80 and sm_90

TC_FUNC = workloads.gemm(512, 512, 2048, in_dtype="float16", out_dtype="float32")
TC_TARGETS = {"sm_80": "nvidia/nvidia-a100", "sm_90": "nvidia/nvidia-h100"}


def _tensor_core_context(target: str, **kwargs) -> ms.TuneContext:
    return ms.TuneContext(
        mod=tvm.IRModule({"main": TC_FUNC.with_attr("global_symbol", "main")}),
        target=tvm.target.Target(target),
        space_generator=skms.space(kind="cuda-tensorcore"),
        task_name="main",
        rand_state=1,
        num_threads=2,
        **kwargs,
    )


def _sampled(trace, key):
    return [int(c) for c in _knob_samplers(trace)[key].attrs[0]]


def test_tensor_core_space_adds_aligned_split_twins_of_the_mma_update():
    spaces = _tensor_core_context(H100).generate_design_space()
    twins = [s for s in spaces if skms.has_stream_k(s.mod)]
    assert twins and len(twins) == len(spaces) - len(twins)
    for sch in twins:
        block = _decision_block(sch.mod)
        # The rule sees the update blockized by MultiLevelTilingTensorCore and marked for
        # RewriteTensorize, not yet tensorized: the decision goes on the blockized block.
        assert block.name_hint == "C_o" and block.init is not None
        assert "mma" in str(block.annotations["meta_schedule.auto_tensorize"])
        site = skms.site_of(sch, "C_o")
        assert site.fragment_accumulator
        # Fragments take the aligned split only: split-K, the workspace fix-up, and split
        # counts dividing the panel count of this tiling.
        assert _sampled(sch.trace, ann.KEY_POLICY) == [policy_code("split_k")]
        assert _sampled(sch.trace, ann.KEY_FIXUP) == [1]
        splits = _sampled(sch.trace, ann.KEY_SPLITS)
        assert splits and all(site.panels % s == 0 for s in splits), (site.panels, splits)


def test_rule_passes_on_a_tensorized_inner_block_it_cannot_take():
    """The inner block of a blockized update whose parent is no Stream-K site is left alone."""
    spaces = _tensor_core_context(H100).generate_design_space()
    sch = next(s for s in spaces if not skms.has_stream_k(s.mod)).copy()
    sch.unannotate(sch.get_sblock("C_o"), "meta_schedule.auto_tensorize")
    rule = skms.StreamKRule(num_sms=H100_SMS)
    assert rule.apply(sch, sch.get_sblock("C")) == [sch]


@pytest.mark.parametrize("arch", list(TC_TARGETS))
def test_tensor_core_round_builds_stream_k_candidates(arch):
    target = TC_TARGETS[arch]
    context = _tensor_core_context(target, search_strategy=ms.search_strategy.ReplayTrace())
    context.pre_tuning(
        max_trials=16, num_trials_per_iter=16, cost_model=ms.cost_model.RandomModel()
    )
    candidates = [c for c in context.generate_measure_candidates() if skms.has_stream_k(c.sch.mod)]
    assert candidates, "the round must hold Stream-K candidates"
    builder = skms.stream_k_builder(max_workers=2)
    results = builder.build(
        [ms.builder.BuilderInput(c.sch.mod, context.target) for c in candidates]
    )
    try:
        for candidate, result in zip(candidates, results):
            assert result.error_msg is None, result.error_msg
            # Postprocs tensorized the update; the decision stayed on it.
            block = _decision_block(candidate.sch.mod)
            assert block.name_hint == "C_o_update"
            source = skms.build(candidate.sch.mod, context.target).module.mod.imports[0]
            source = source.inspect_source()
            assert "wmma::mma_sync" in source and "blockIdx.z" in source, "not an aligned split"
            if ptxas.available():
                assert ptxas.resources(source, arch), "ptxas compiled no kernel"
    finally:
        for result in results:
            if result.artifact_path is not None:
                shutil.rmtree(os.path.dirname(str(result.artifact_path)), ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Postprocs


def test_postprocs_leave_the_decision_on_the_update_block_only(h100_context, h100_spaces):
    for sch in (s for s in h100_spaces if skms.has_stream_k(s.mod)):
        sch = sch.copy()
        stock = len(ms.Postproc.create("cuda"))
        for postproc in h100_context.space_generator.postprocs[:stock]:
            postproc.apply(sch)
        # RewriteReductionBlock copied the decision onto the init block ...
        carriers = {
            b.name_hint
            for b in tvm_streamk.analysis.blocks_under(sch.mod["main"].body)
            if ann.has_decision(b.annotations)
        }
        assert carriers == {"C_init", "C_update"}
        assert RewriteStreamKInit().apply(sch)
        # ... and RewriteStreamKInit removed it there, in the trace.
        assert _decision_block(sch.mod).name_hint == "C_update"
        unannotated = [str(i.attrs[0]) for i in sch.trace.insts if i.kind.name == "Unannotate"]
        assert set(ann.KEYS) <= set(unannotated)


def _opencl_candidate(**knobs):
    """An annotated reference schedule (reduction already decomposed) and a ready VerifyStreamK."""
    func = workloads.gemm(96, 64, 64)
    target = skms.opencl_target()
    sch = workloads.reference_schedule(func)
    skms.annotate_stream_k(sch, "C_update", num_sms=3, target=target, **knobs)
    verify = VerifyStreamK()
    context = ms.TuneContext(mod=func, target=target, task_name="main")
    verify._initialize_with_tune_context(context)
    return sch, verify


def _reannotate(sch, key, value):
    # ``annotate`` keeps an existing key's value: drop it first.
    block = sch.get_sblock("C_update")
    sch.unannotate(block, key)
    sch.annotate(block, key, tvm.tirx.IntImm("int32", value))
    assert int(_decision_block(sch.mod).annotations[key]) == value


def test_verify_accepts_a_lowerable_decision():
    sch, verify = _opencl_candidate()
    assert verify.apply(sch)


def test_verify_rejects_a_decision_that_no_longer_fits_the_tiling():
    sch, verify = _opencl_candidate(policy="split_k", splits=4)
    assert verify.apply(sch.copy())
    # As after a tile-size mutation that left 8 panels per tile: 9 splits cannot be cut.
    _reannotate(sch, ann.KEY_SPLITS, 9)
    assert not verify.apply(sch)


def test_verify_rejects_an_unknown_code_and_an_undecomposed_reduction():
    sch, verify = _opencl_candidate()
    _reannotate(sch, ann.KEY_FIXUP, 99)
    assert not verify.apply(sch)

    func = workloads.gemm(64, 64, 64)
    sch = tvm.s_tir.Schedule(func)
    i, j, k = sch.get_loops("C")
    bi, ti = sch.split(i, [None, 8])
    bj, tj = sch.split(j, [None, 8])
    ko, _ = sch.split(k, [None, 8])
    sch.reorder(bi, bj, ti, tj, ko)
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    sch.reverse_compute_at(sch.cache_write("C", 0, "local"), tj)
    skms.annotate_stream_k(sch, "C", num_sms=4)
    # Still T.init: without RewriteReductionBlock the rewrite would skip the init mid-tile.
    assert not verify.apply(sch)


def test_verify_accepts_candidates_without_a_decision():
    sch, verify = _opencl_candidate()
    assert verify.apply(tvm.s_tir.Schedule(without_stream_k(sch.mod)))


# ---------------------------------------------------------------------------------------------
# Mutator


def test_mutator_moves_exactly_one_stream_k_knob(h100_spaces):
    mutator = skms.MutateStreamK()
    for sch in h100_spaces:
        if not skms.has_stream_k(sch.mod):
            assert mutator.apply(sch.trace) is None
            continue
        before = {k: int(sch.trace.decisions[i]) for k, i in _knob_samplers(sch.trace).items()}
        movable = {k for k, i in _knob_samplers(sch.trace).items() if len(i.attrs[0]) > 1}
        for _ in range(8):
            mutated = mutator.apply(sch.trace)
            after = {k: int(mutated.decisions[i]) for k, i in _knob_samplers(mutated).items()}
            changed = [k for k in before if before[k] != after[k]]
            assert len(changed) == 1 and changed[0] in movable
            # Only the knob moved: every other decision of the trace is kept.
            others = [
                (i.kind.name, str(mutated.decisions[i]))
                for i in mutated.insts
                if i.kind.name != "SampleCategorical" and i in mutated.decisions
            ]
            assert others == [
                (i.kind.name, str(sch.trace.decisions[i]))
                for i in sch.trace.insts
                if i.kind.name != "SampleCategorical" and i in sch.trace.decisions
            ]


# ---------------------------------------------------------------------------------------------
# Features


def test_features_of_a_stream_k_candidate_differ_from_its_data_parallel_twin(h100_context):
    func = workloads.gemm(256, 256, 512)
    target = tvm.target.Target(H100)
    sch = workloads.reference_schedule(func)
    skms.annotate_stream_k(sch, "C_update", num_sms=H100_SMS, target=target)
    twin = tvm.s_tir.Schedule(without_stream_k(sch.mod))
    args = ms.arg_info.ArgInfo.from_prim_func(func)
    context = ms.TuneContext(mod=func, target=target, task_name="main")

    def features(extractor, s):
        (f,) = extractor.extract_from(context, [ms.MeasureCandidate(s, args)])
        return f.numpy()

    stock = ms.feature_extractor.PerStoreFeature()
    # The stock extractor cannot tell them apart: the decision is only an annotation.
    np.testing.assert_array_equal(features(stock, sch), features(stock, twin))
    extractor = skms.StreamKFeatureExtractor()
    stream_k, data_parallel = features(extractor, sch), features(extractor, twin)
    assert stream_k.shape != data_parallel.shape or not np.array_equal(stream_k, data_parallel)
    # A data-parallel candidate is featurised as the stock extractor does, plus the model's
    # column: no predicted speed-up.
    np.testing.assert_array_equal(data_parallel[:, :-1], features(stock, twin))
    np.testing.assert_array_equal(data_parallel[:, -1], 0.0)
    # The Stream-K candidate's last column is the model's predicted speed-up (log2) on H100,
    # the same for every store (a slow-down here: at 256 x 256 x 512 launches and the fix-up's
    # hand-off outweigh the idle SMs).
    plan = tvm_streamk.explain(sch, gpu=H100, print_=False)
    assert plan.gpu == H100 and plan.speedup < 1
    np.testing.assert_allclose(stream_k[:, -1], np.log2(plan.speedup), rtol=1e-5)


def test_features_extract_for_every_knob_of_a_tuning_round():
    func = workloads.gemm(128, 128, 512)
    target = skms.opencl_target()
    context = ms.TuneContext(
        mod=func,
        target=target,
        space_generator=skms.space(num_sms=2),
        search_strategy=ms.search_strategy.ReplayTrace(),
        task_name="main",
        rand_state=11,
        num_threads=2,
    )
    context.pre_tuning(
        max_trials=48, num_trials_per_iter=48, cost_model=ms.cost_model.RandomModel()
    )
    candidates = context.generate_measure_candidates()
    stream_k = [c for c in candidates if skms.has_stream_k(c.sch.mod)]
    policies = {int(_decision_block(c.sch.mod).annotations[ann.KEY_POLICY]) for c in stream_k}
    assert len(policies) >= 3, policies
    features = skms.StreamKFeatureExtractor().extract_from(context, candidates)
    assert len(features) == len(candidates)
    assert all(np.all(np.isfinite(f.numpy())) for f in features)


# ---------------------------------------------------------------------------------------------
# Builder


def test_builder_compiles_a_tuning_round_for_h100(h100_context, h100_round):
    candidates, target = h100_round, h100_context.target
    assert any(skms.has_stream_k(c.sch.mod) for c in candidates)
    assert any(not skms.has_stream_k(c.sch.mod) for c in candidates)
    builder = skms.stream_k_builder(max_workers=2)
    results = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in candidates])
    try:
        for candidate, result in zip(candidates, results):
            assert result.error_msg is None, result.error_msg
            artifact = str(result.artifact_path)
            with open(ir_path(artifact)) as f:
                tvm.ir.assert_structural_equal(tvm.ir.load_json(f.read()), candidate.sch.mod)
            if not skms.has_stream_k(candidate.sch.mod):
                continue
            # The artifact holds the CUDA source of the Stream-K kernels, not the data-parallel
            # kernel of the same schedule without its decision.
            with tarfile.open(artifact) as tar:
                blobs = b"".join(tar.extractfile(m).read() for m in tar.getmembers())
            stream_k = skms.build(candidate.sch.mod, target).module.mod.imports[0]
            data_parallel = tvm.compile(without_stream_k(candidate.sch.mod), target=target)
            data_parallel = data_parallel.mod.imports[0]
            assert stream_k.inspect_source().encode() in blobs
            assert data_parallel.inspect_source().encode() not in blobs
    finally:
        for result in results:
            if result.artifact_path is not None:
                shutil.rmtree(os.path.dirname(str(result.artifact_path)), ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Database


def test_json_database_round_trip_replays_the_same_lowered_ir(tmp_path, h100_context, h100_round):
    target = h100_context.target
    sch = next(c.sch for c in h100_round if skms.has_stream_k(c.sch.mod))
    mod = tvm.IRModule({"main": workloads.gemm(1024, 1024, 4096)})
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    workload = database.commit_workload(mod)
    database.commit_tuning_record(
        ms.database.TuningRecord(sch.trace, workload, [1.0e-3], target, None)
    )

    reopened = ms.database.JSONDatabase(work_dir=str(tmp_path))
    (record,) = reopened.get_top_k(reopened.commit_workload(mod), 1)
    replayed = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(replayed, remove_postproc=False)
    assert skms.has_stream_k(replayed.mod)
    tvm.ir.assert_structural_equal(
        tvm_streamk.lower(replayed, target), tvm_streamk.lower(sch, target)
    )
    # The persistent kernel really is in it: one blockIdx.x loop over the Stream-K grid.
    assert "sk_block" in tvm_streamk.lower(replayed, target).script()


# ---------------------------------------------------------------------------------------------
# Runner


def test_pocl_runner_reports_a_broken_artifact_as_an_error(tmp_path):
    artifact = tmp_path / "tvm_tmp_mod.tar"
    artifact.write_bytes(b"")
    args = ms.arg_info.ArgInfo.from_prim_func(workloads.gemm(32, 32, 32))
    (future,) = skms.PoclRunner(timeout_sec=30).run(
        [ms.runner.RunnerInput(str(artifact), "opencl", args)]
    )
    result = future.result()
    assert result.run_secs is None
    assert "PoclRunner" in result.error_msg and "mod.json" in result.error_msg


def test_pocl_runner_check_refuses_a_wrong_stream_k_result(monkeypatch):
    class Kernel:
        """Stands in for a compiled kernel: returns its arguments shifted by ``offset``."""

        def __init__(self, offset):
            self.offset = offset

        def run(self, *arrays):
            return [a + self.offset for a in arrays]

    sch, _ = _opencl_candidate()
    arrays = [np.ones((4, 4), "float32")]
    # The data-parallel twin is built through pocl.compile; the candidate is given directly.
    monkeypatch.setattr(pocl, "compile", lambda mod, *args, **kwargs: Kernel(0.0))
    _check_against_twin(Kernel(1e-6), sch.mod, arrays)
    with pytest.raises(MismatchError, match="differs from the data-parallel"):
        _check_against_twin(Kernel(1e-2), sch.mod, arrays)
    with pytest.raises(MismatchError):
        _check_against_twin(Kernel(np.nan), sch.mod, arrays)


# ---------------------------------------------------------------------------------------------
# End to end: tune on PoCL, compile the best record


def _numerically_correct(func, sch) -> float:
    args = workloads.random_args(func)
    assert np.isnan(args[-1]).all()
    out = pocl.run(sch.mod, *args, pipeline=tvm_streamk.pipeline.NAME)[-1]
    return workloads.relative_error(out, workloads.reference(func, args))


@pytest.mark.usefixtures("default_opencl")
def test_tune_on_pocl_and_compile_the_best_record(tmp_path):
    func = workloads.gemm(128, 128, 512)
    target = skms.opencl_target()
    cost_model = ms.cost_model.XGBModel(
        extractor=skms.StreamKFeatureExtractor(), num_warmup_samples=8, num_tuning_cores=2
    )
    database = skms.tune(
        func,
        target,
        str(tmp_path),
        max_trials=32,
        num_trials_per_iter=16,
        strategy=ms.search_strategy.EvolutionarySearch(
            population_size=64, init_min_unmeasured=32, genetic_num_iters=2
        ),
        cost_model=cost_model,
        runner=skms.PoclRunner(repeat=2, number=3),
        seed=0,
    )
    # The cost model was trained on the measurements, through the Stream-K feature extractor.
    assert cost_model.data_size >= 32 and cost_model.booster is not None

    records = ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()
    assert len(records) >= 32
    measured = [r for r in records if r.run_secs and float(r.run_secs[0]) < 1e9]
    stream_k = []
    for record in measured:
        sch = tvm.s_tir.Schedule(func)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        if skms.has_stream_k(sch.mod):
            stream_k.append((float(np.mean([float(s) for s in record.run_secs])), sch))
    assert stream_k, "no Stream-K candidate was measured"
    assert all(0.0 < t < 10.0 for t, _ in stream_k)

    best = skms.best_schedule(database, func, target)
    assert _numerically_correct(func, best) <= FP32_TOL
    _, fastest_stream_k = min(stream_k, key=lambda ts: ts[0])
    assert _numerically_correct(func, fastest_stream_k) <= FP32_TOL
    module = skms.compile_tuned(database, func, target)
    assert module.mod.imports[0].inspect_source().count("__kernel") >= 1

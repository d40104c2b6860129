"""The project's dlight rules for what ``gpu.Matmul`` does not take (issue 14, item 4; issue
31, item 7).

``StreamKGEMV``: low-batch matmuls with a K-major weight (a fully connected layer at batch 1);
``StreamKImplicitGEMM``: convolutions ``gpu.Matmul`` declines (TVM's own TE convolutions, grouped
ones with few channels per group); ``StreamKDepthwise``: short depthwise reductions. Each is
scheduled by the rule alone under the A100 tag, given a decision on a grid of a few SMs, run on
PoCL with the output poisoned and compared with float64 numpy within 1e-5 of the largest
output (fp32 accumulation of at most 1000 products of values in [-1, 1]).
"""

import numpy as np
import pytest
import tvm
from tvm import te, topi
from tvm.s_tir import dlight as dl
from tvm.s_tir.meta_schedule.testing import te_workload

import tvm_streamk
from tests.conv_cases import CONV_CASES, TE_CONV_CASES
from tests.dlight_sites import A100, FIXUPS, FP32_TOL, pipeline_route, schedule_with
from tests.helpers import H100, block_idx_extents, conv_reference_for
from tests.kernels import te_conv
from tvm_streamk import pocl, workloads
from tvm_streamk.analysis import first_site
from tvm_streamk.dlight import (
    Decisions,
    StreamKDepthwise,
    StreamKGEMV,
    StreamKImplicitGEMM,
    StreamKMatmul,
)
from tvm_streamk.errors import StreamKError
from tvm_streamk.transform.group_axis import split_group_axis

on_every_pocl = pytest.mark.usefixtures("opencl")

# Every policy with its knobs, as the rules take them (split-K with its split count).
DECISIONS = {
    "stream_k": {"policy": "stream_k"},
    "hybrid": {"policy": "hybrid"},
    "split_k": {"policy": "split_k", "splits": 2},
    "data_parallel": {"policy": "data_parallel"},
}


def _scheduled(rule_type, func, policy: str, fixup: str = "auto"):
    rule = rule_type(num_sms=3, blocks_per_sm=1, fixup=fixup, **DECISIONS[policy])
    with A100:
        mod = dl.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))
    assert "tirx.is_scheduled" in mod["main"].attrs, f"{rule_type.__name__} declined"
    assert not rule.skipped, rule.skipped
    ((_, plan),) = rule.decided.items()
    return mod, plan


def _check(mod, plan, args, ref, policy):
    if policy == "data_parallel":
        assert not plan.split_tiles
    else:
        assert plan.split_tiles, f"{plan} splits no tile"
    assert np.isnan(args[-1]).all()
    out = pocl.run(mod, *args, pipeline="tvm_streamk")[-1]
    error = workloads.relative_error(out, ref)
    assert error <= FP32_TOL, (plan, error)


# (rows, N, K, epilogue): 5 column tiles of 128 (the last partial), 12 to 16 K panels of 64.
GEMV_CASES = {
    "batch1": (1, 600, 1000, None),
    "batch3-bias-relu": (3, 520, 770, "bias_relu"),
}


def _gemv_matrix():
    for case, (*_, epilogue) in GEMV_CASES.items():
        # An epilogue takes the workspace fix-up only (test_conv checks the atomic refusal).
        for fixup in ("workspace",) if epilogue else FIXUPS:
            for policy in DECISIONS:
                yield pytest.param(case, policy, fixup, id=f"{case}-{policy}-{fixup}")


@on_every_pocl
@pytest.mark.parametrize("case,policy,fixup", list(_gemv_matrix()))
def test_gemv_rule_matches_float64(case, policy, fixup):
    rows, n, k, epilogue = GEMV_CASES[case]
    func = workloads.gemm(rows, n, k, epilogue=epilogue)
    mod, plan = _scheduled(StreamKGEMV, func, policy, fixup)
    args = workloads.random_args(func)
    _check(mod, plan, args, workloads.reference(func, args), policy)


def test_gemv_rule_reads_the_weight_coalesced():
    mod, _ = _scheduled(StreamKGEMV, workloads.gemm(1, 600, 1000), "stream_k")
    text = mod["main"].script()
    # Thread j of a block reads B[k, 128 * block + j]: consecutive threads, consecutive words.
    assert "B[" in text and "threadIdx.x" in text
    assert "x_shared" in text or "A_shared" in text


@pytest.mark.parametrize(
    "func,why",
    [
        (workloads.gemm(1, 600, 1000, layout="NT"), "weight N x K: dlight's gpu.GEMV's layout"),
        (workloads.gemm(16, 600, 1000), "16 rows: a GEMM"),
        (workloads.gemm(1, 100, 1000), "fewer than two column tiles"),
        (workloads.gemv(600, 1000), "the reduction is the weight's innermost axis"),
    ],
)
def test_gemv_rule_declines(func, why):
    rule = StreamKGEMV(num_sms=3)
    with A100:
        assert rule.apply(func, A100, False) is None, why
    assert not rule.decided and not rule.skipped


def test_gemv_rule_binds_a_second_output():
    # A dropout at inference adds a mask output of ones beside the layer (AlexNet's FC layers).
    x = te.placeholder((1, 700), name="x")
    w = te.placeholder((700, 300), name="w")
    k = te.reduce_axis((0, 700), name="k")
    y = te.compute((1, 300), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="y")
    relu = topi.nn.relu(y)
    mask = te.compute((1, 300), lambda i, j: tvm.tirx.const(1.0, "float32"), name="mask")
    func = te.create_prim_func([x, w, relu, mask])
    mod, plan = _scheduled(StreamKGEMV, func, "stream_k", "workspace")
    args = workloads.random_args(func)
    args[-2][:] = np.nan
    out = pocl.run(mod, *args, pipeline="tvm_streamk")
    ref = np.maximum(args[0].astype("float64") @ args[1].astype("float64"), 0)
    assert workloads.relative_error(out[-2], ref) <= FP32_TOL
    assert (out[-1] == 1.0).all()


# Depthwise convolutions, in tiles of 128 outputs.
DEPTHWISE_CASES = {
    # 2*8*21*19 = 6384 outputs (50 tiles); K = 3*3 = 9: one panel of 16.
    "nchw-3x3-pad1": {
        "data_shape": (2, 8, 21, 19),
        "weight_shape": (8, 1, 3, 3),
        "layout": "NCHW",
        "groups": 8,
        "padding": 1,
    },
    # 2*11*10*16 = 3520 outputs (28 tiles, the last partial); K = 5*5 = 25: two panels;
    # channel multiplier 2 (16 output channels, 2 per group), stride 2.
    "nhwc-5x5-stride2-multiplier2": {
        "data_shape": (2, 21, 19, 8),
        "weight_shape": (5, 5, 1, 16),
        "layout": "NHWC",
        "groups": 8,
        "stride": 2,
        "padding": 2,
    },
}


def _depthwise_matrix():
    for case in DEPTHWISE_CASES:
        for policy in DECISIONS:
            for fixup in FIXUPS:
                one_panel = case == "nchw-3x3-pad1"
                if one_panel and policy != "data_parallel":
                    continue  # one K panel: no policy but data-parallel can split it
                yield pytest.param(case, policy, fixup, id=f"{case}-{policy}-{fixup}")


@on_every_pocl
@pytest.mark.parametrize("case,policy,fixup", list(_depthwise_matrix()))
def test_depthwise_rule_matches_float64(case, policy, fixup):
    kwargs = DEPTHWISE_CASES[case]
    func = workloads.conv(**kwargs)
    assert split_group_axis(func) is None
    mod, plan = _scheduled(StreamKDepthwise, func, policy, fixup)
    args = workloads.random_args(func)
    _check(mod, plan, args, conv_reference_for(kwargs)(args), policy)


def test_depthwise_rule_heuristic_keeps_one_panel_data_parallel():
    func = workloads.conv(**DEPTHWISE_CASES["nchw-3x3-pad1"])
    rule = StreamKDepthwise(num_sms=132)
    with A100:
        dl.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))
    ((_, plan),) = rule.decided.items()
    assert plan.panels == 1 and plan.policy == "data_parallel"


# A grouped convolution with 4 output channels per group: fewer than StreamKMatmul's group
# split takes (16), more input channels per group than a depthwise one reads (one).
# S = 4 groups, I = 2*10*10 = 200 (4 tiles), J = 4 (bn 4), K = 3*3*4 = 36 (3 panels).
FEW_COLUMNS_GROUPED = {
    "data_shape": (2, 10, 10, 16),
    "weight_shape": (3, 3, 4, 16),
    "layout": "NHWC",
    "groups": 4,
    "padding": 1,
}


@pytest.mark.parametrize(
    "func",
    [
        pytest.param(workloads.gemm(64, 64, 1024), id="long-reduction"),
        # A depthwise window of 23 x 23 = 529 iterations: dlight's Reduction's, not one thread's.
        pytest.param(
            workloads.conv((1, 4, 30, 30), (4, 1, 23, 23), layout="NCHW", groups=4),
            id="long-depthwise-window",
        ),
        # Dense convolutions are GEMMs, short or not: StreamKImplicitGEMM's (or gpu.Matmul's).
        pytest.param(te_conv(TE_CONV_CASES["C1D"])[0], id="te-conv1d"),
        pytest.param(te_conv(TE_CONV_CASES["C3D"])[0], id="te-conv3d"),
        pytest.param(workloads.conv(**CONV_CASES["conv2d-nhwc-stride2-pad1"]), id="conv2d"),
        pytest.param(workloads.conv(**FEW_COLUMNS_GROUPED), id="grouped-4-per-group"),
        pytest.param(
            te.create_prim_func(
                [
                    x := te.placeholder((4, 6, 6), name="x"),
                    topi.nn.pool2d(x, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), "max", layout="CHW"),
                ]
            ),
            id="max-pool",
        ),
    ],
)
def test_depthwise_rule_declines(func):
    # A long reduction is a GEMM's or dlight's Reduction's; a max is not a multiply-accumulate;
    # a dense or grouped convolution reads several input channels per output.
    rule = StreamKDepthwise(num_sms=3)
    with A100:
        assert rule.apply(func, A100, False) is None
    assert not rule.decided and not rule.skipped


def test_rules_share_one_record():
    shared = Decisions()
    matmul = StreamKMatmul(num_sms=3, decisions=shared)
    gemv = StreamKGEMV(num_sms=3, decisions=shared)
    depthwise = StreamKDepthwise(num_sms=3, decisions=shared)
    funcs = [
        workloads.gemm(256, 256, 256),
        workloads.gemm(1, 600, 1000),
        workloads.conv(**DEPTHWISE_CASES["nchw-3x3-pad1"]),
    ]
    for func in funcs:
        with A100:
            dl.ApplyDefaultSchedule(matmul, gemv, depthwise)(tvm.IRModule({"main": func}))
    assert len(shared.decided) == 3 and matmul.decided is gemv.decided is depthwise.decided


def test_depthwise_schedule_is_a_stream_k_site():
    func = workloads.conv(**DEPTHWISE_CASES["nhwc-5x5-stride2-multiplier2"])
    scheduled, taken = schedule_with(func, StreamKDepthwise)
    assert taken == "StreamKDepthwise" and first_site(scheduled) is not None


def test_rules_refuse_policy_knobs_that_no_kernel_could_take():
    # Checked once when the rule is made, not recorded per kernel in ``skipped``.
    from tvm_streamk.decomposition import DecompositionError

    with pytest.raises(DecompositionError, match="policy='split_k' needs splits=S"):
        StreamKGEMV(policy="split_k")
    with pytest.raises(DecompositionError, match="splits=2 only applies to policy='split_k'"):
        StreamKMatmul(policy="stream_k", splits=2)
    with pytest.raises(DecompositionError, match="splits must be a positive int, found 0"):
        StreamKDepthwise(policy="split_k", splits=0)
    # Every knob stream_k refuses whatever the kernel, the pipeline's too (found by the model
    # fuzz: batch invariance with the atomic fix-up was skipped kernel by kernel).
    with pytest.raises(StreamKError, match=r"\[batch-invariant\].*fixup='atomic'"):
        StreamKMatmul(fixup="atomic", batch_invariant=True)
    with pytest.raises(StreamKError, match=r"\[fixup\]: found fixup='nonesuch'"):
        StreamKImplicitGEMM(fixup="nonesuch")
    with pytest.raises(StreamKError, match=r"\[blocks_per_sm\]: found blocks_per_sm=0"):
        tvm_streamk.relax_pipeline(H100, blocks_per_sm=0)


def test_the_pipeline_rules_share_the_policy_knobs():
    from tvm_streamk.relax_pipeline import schedule_rules

    rule = StreamKMatmul(num_sms=3, policy="split_k", splits=2)
    ours = [r for r in schedule_rules(rule) if hasattr(r, "config")]
    assert [type(r).__name__ for r in ours] == [
        "StreamKMatmul",
        "StreamKGEMV",
        "StreamKImplicitGEMM",
        "StreamKDepthwise",
    ]
    assert {r.config for r in ours} == {rule.config}
    assert all(r.decisions is rule.decisions for r in ours)


# TVM's own TE convolutions (issue 31, item 7). Before StreamKImplicitGEMM the pipeline gave
# those dlight's gpu.Matmul declines to StreamKDepthwise (K <= 512: one output per thread, no
# operand reuse) or to dlight's Fallback (K > 512: no decision).


@pytest.mark.parametrize("case", list(TE_CONV_CASES))
def test_te_conv_goes_to_the_implicit_gemm_rule(case):
    func, _ = te_conv(TE_CONV_CASES[case])
    with A100:
        assert dl.gpu.Matmul().apply(func, A100, False) is None, "gpu.Matmul takes it now"
    taken, decisions = pipeline_route(func, num_sms=3, blocks_per_sm=1)
    assert taken == "StreamKImplicitGEMM", taken
    assert len(decisions.decided) == 1 and not decisions.skipped, decisions
    depthwise = StreamKDepthwise(num_sms=3)
    with A100:
        assert depthwise.apply(func, A100, False) is None


@on_every_pocl
@pytest.mark.parametrize(
    "case,fixup", [("C1D", "atomic"), ("C2D", "workspace"), ("C3D", "atomic"), ("DIL", "workspace")]
)
def test_te_conv_implicit_gemm_matches_float64(case, fixup):
    func, reference = te_conv(TE_CONV_CASES[case])
    mod, plan = _scheduled(StreamKImplicitGEMM, func, "stream_k", fixup)
    args = workloads.random_args(func)
    _check(mod, plan, args, reference(args), "stream_k")


@pytest.mark.parametrize(
    "func",
    [
        pytest.param(
            te.create_prim_func(te_workload.depthwise_conv2d_nhwc(1, 12, 12, 16, 3, 1, 1)),
            id="te-depthwise",
        ),
        pytest.param(
            workloads.conv(**DEPTHWISE_CASES["nhwc-5x5-stride2-multiplier2"]), id="multiplier2"
        ),
    ],
)
def test_depthwise_conv_goes_to_the_depthwise_rule(func):
    taken, decisions = pipeline_route(func, num_sms=3, blocks_per_sm=1)
    assert taken == "StreamKDepthwise" and len(decisions.decided) == 1, (taken, decisions)
    implicit_gemm = StreamKImplicitGEMM(num_sms=3)
    with A100:
        assert implicit_gemm.apply(func, A100, False) is None


def test_grouped_conv_with_few_channels_per_group_is_a_narrow_implicit_gemm():
    func = workloads.conv(**FEW_COLUMNS_GROUPED)
    taken, _ = pipeline_route(func, num_sms=3, blocks_per_sm=1)
    assert taken == "StreamKImplicitGEMM", taken
    mod, _ = _scheduled(StreamKImplicitGEMM, func, "data_parallel")
    # The groups on blockIdx.z, one 4-wide column tile per group (not a 64-wide one).
    extents = dict(block_idx_extents(mod))
    assert extents["blockIdx.z"] == 4 and extents["blockIdx.x"] == 1, extents
    assert 'T.thread_binding(4, thread="threadIdx.x")' in mod["main"].script()


@on_every_pocl
def test_grouped_conv_with_few_channels_per_group_matches_float64():
    func = workloads.conv(**FEW_COLUMNS_GROUPED)
    mod, plan = _scheduled(StreamKImplicitGEMM, func, "stream_k", "atomic")
    args = workloads.random_args(func)
    _check(mod, plan, args, conv_reference_for(FEW_COLUMNS_GROUPED)(args), "stream_k")


def test_no_full_size_te_workload_falls_back_without_a_decision():
    # Every configuration of TVM's te_workload.CONFIGS at full size, scheduled (not run) by the
    # pipeline's rules; one block per SM keeps the decisions from building kernels.
    routes, unbuildable = {}, []
    for name, (_, params) in te_workload.CONFIGS.items():
        for idx in range(len(params)):
            try:
                func = te_workload.create_te_workload(name, idx)
            except RuntimeError as err:
                # TVM 0.27's Winograd convolution raises in its TE definition itself.
                assert "LEGACY-FLOW" in str(err), err
                unbuildable.append(f"{name}[{idx}]")
                continue
            taken, decisions = pipeline_route(func, blocks_per_sm=1)
            routes[f"{name}[{idx}]"] = (taken, len(decisions.decided))
    assert len(routes) + len(unbuildable) == 53 and unbuildable == ["C2D_WIN_NHWC[0]"]
    fallen = {k: r for k, r in routes.items() if r[0] in (None, "Fallback") and not r[1]}
    assert not fallen, fallen
    for family, rule in [(f, "StreamKImplicitGEMM") for f in ("C1D", "C2D", "C3D", "DIL")] + [
        ("DEP", "StreamKDepthwise")
    ]:
        for idx in range(4):
            assert routes[f"{family}[{idx}]"] == (rule, 1), (
                family,
                idx,
                routes[f"{family}[{idx}]"],
            )

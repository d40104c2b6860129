"""The numeric suites on WebGPU (issue 33, items 3-5): TVM's WGSL run through ``wgpu`` on the
first adapter (Mesa's lavapipe here, a CPU Vulkan whose threads run workgroups concurrently).

Every Stream-K kernel takes the separate fix-up (the only one WGSL's memory model allows,
:mod:`tvm_streamk.memory_model.webgpu`). Inputs are fresh random arrays, outputs poisoned (NaN)
before every call, results compared with float64 numpy at the PoCL suites' tolerances: every
policy at uneven shapes on the reference and dlight schedules, GEMV, batched GEMM, data-parallel
kernels of a batch the schedule binds to ``blockIdx.z`` (walked on ``blockIdx.x``), a fused fp16
epilogue in WGSL's ``f16``, docs/webgpu.md's snippet, and the Stream-K kernels of a
transformer block that ``relax_pipeline(Target("webgpu"))`` compiled, against TVM's LLVM
build of each. Stream-K on a run-time tile count (dynamic M) is refused with the reason: its
closed forms are 64-bit, and WGSL has no 64-bit integers; its data-parallel kernel (the
heuristic's choice there) runs at every count.
"""

import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm.relax.frontend import nn
from tvm.s_tir import Schedule

import tvm_streamk
from tests.helpers import (
    FP32_TOL,
    POLICIES,
    POLICY_IDS,
    ROOT,
    conv_reference_for,
    python_snippets,
)
from tests.kernels import LinearBlock, dlight_matmul, gemv_schedule, matmul_reference, update_block
from tvm_streamk import webgpu, workloads
from tvm_streamk._compat import dlight
from tvm_streamk.analysis import first_site
from tvm_streamk.errors import StreamKError
from tvm_streamk.relax_pipeline import fusion_passes

pytestmark = [pytest.mark.webgpu, pytest.mark.usefixtures("webgpu_adapter")]

WEBGPU = webgpu.webgpu_target()
FP16_TOL = 2.0**-10 + FP32_TOL
# Every policy, and the heuristic that users of relax_pipeline get.
DECISIONS = [*POLICIES, {"policy": "heuristic"}]
DECISION_IDS = [*POLICY_IDS, "heuristic"]


def _error(sch_or_mod, func, reference=None, calls=2):
    """The relative error of the last of ``calls`` calls on one set of buffers, outputs
    poisoned before each (the workspace is reused from call to call)."""
    mod = sch_or_mod.mod if isinstance(sch_or_mod, Schedule) else sch_or_mod
    args = workloads.random_args(func)
    kernel = webgpu.compile(mod, "tvm_streamk")
    out = kernel.run_repeated(*args, launches=calls, poison_outputs=True)[-1][-1]
    ref = reference(args) if reference else workloads.reference(func, args)
    return workloads.relative_error(out, ref), kernel


@pytest.mark.parametrize("decision", DECISIONS, ids=DECISION_IDS)
def test_reference_schedule(decision):
    # 2 x 3 tiles of 32 x 32 (the last row and column predicated), 7 panels, on 4 workgroups.
    func = workloads.gemm(45, 70, 53)
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=WEBGPU, **decision)
    error, kernel = _error(sch, func)
    assert error <= FP32_TOL
    if decision["policy"] in ("split_k", "stream_k", "hybrid"):
        # The persistent kernel and the separate fix-up's merging kernel, in that order.
        assert len(kernel.launches) == 2, kernel
        assert "atomic" not in kernel.source and "i64" not in kernel.source


@pytest.mark.parametrize("decision", DECISIONS, ids=DECISION_IDS)
def test_dlight_schedule(decision):
    # dlight's matmul schedule for WebGPU: 57 x 100 x 44, uneven against its tiles.
    func = dlight_matmul(57, 44, 100, dlight.gpu.Matmul(), WEBGPU)
    sch = Schedule(func)
    tvm_streamk.stream_k(
        sch, update_block(sch), num_sms=3, blocks_per_sm=1, target=WEBGPU, **decision
    )
    error, _ = _error(sch, func, matmul_reference)
    assert error <= FP32_TOL


def test_gemv():
    func, sch = gemv_schedule(70, 512)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=5, target=WEBGPU)
    assert plan.split_tiles
    error, _ = _error(sch, func)
    assert error <= FP32_TOL


def test_batched_gemm():
    func = workloads.batched_gemm(3, 20, 40, 48)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=WEBGPU)
    assert plan.split_tiles
    error, _ = _error(sch, func)
    assert error <= FP32_TOL


# Data-parallel decisions of kernels that bind a batch (even one wide) to blockIdx.z, which
# TVM's WGSL generator refuses: the reference schedule's GEMMs, the implicit-GEMM schedule's
# convolutions. Found by a WebGPU campaign of the workload fuzz (accepted, then TVM's WebGPU
# build stopped on the kernel as written).
# A batch-invariant one of a single chunk (one panel) is the kernel as written too.
BATCH_ON_Z = [
    ({"policy": "data_parallel"}, False, 32),
    ({"policy": "heuristic"}, False, 32),
    ({"policy": "data_parallel"}, True, 4),
]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "decision, batch_invariant, k", BATCH_ON_Z, ids=["data_parallel", "heuristic", "invariant"]
)
def test_a_batch_on_blockidx_z_is_walked_one_block_per_tile(decision, batch_invariant, k, batch):
    # 3 x 3 tiles of 16 x 8 a batch, 8 panels: data-parallel is what the heuristic chooses.
    func = workloads.gemm(40, 24, k, batch=batch)
    sch = workloads.reference_schedule(func, bm=16, bn=8, bk=4, tm=2, tn=2)
    assert "blockIdx.z" in sch.mod.script()  # the batch, even one wide
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=4, target=WEBGPU, batch_invariant=batch_invariant, **decision
    )
    assert plan.policy == "data_parallel", plan
    assert "which webgpu reserves" in plan.reason or batch_invariant, plan.reason
    error, kernel = _error(sch, func)
    assert error <= FP32_TOL
    assert len(kernel.launches) == 1, kernel


CONVOLUTIONS = [
    dict(data_shape=(2, 9, 9, 6), weight_shape=(3, 3, 6, 5), layout="NHWC", padding=1,
         epilogue="bias_relu"),
    dict(data_shape=(1, 6, 12), weight_shape=(5, 6, 3), layout="NCW", stride=2),
]  # fmt: skip


@pytest.mark.parametrize("build", CONVOLUTIONS, ids=lambda b: b["layout"])
@pytest.mark.parametrize("policy", ["data_parallel", "heuristic"])
def test_an_implicit_gemm_convolution_of_a_batch_is_walked(policy, build):
    func = workloads.conv(**build)
    sch = workloads.implicit_gemm_schedule(func, bm=16, bn=8, bk=4, tm=2, tn=2)
    plan = tvm_streamk.stream_k(sch, first_site(sch.mod["main"]).block.name_hint, num_sms=4,
                                target=WEBGPU, policy=policy)  # fmt: skip
    assert plan.policy == "data_parallel", plan
    error, _ = _error(sch, func, conv_reference_for(build))
    assert error <= FP32_TOL


def test_fused_epilogue_with_fp16_output():
    func = workloads.gemm(40, 36, 48, epilogue="bias_relu", out_dtype="float16", in_dtype="float16")
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=WEBGPU)
    assert plan.split_tiles
    error, kernel = _error(sch, func)
    assert error <= FP16_TOL
    assert "f16" in kernel.source


def test_a_run_time_tile_count_is_refused_with_the_reason():
    func = workloads.gemm("m", 40, 56)
    sch = workloads.reference_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    with pytest.raises(StreamKError, match="64-bit integers, past the 32-bit integers of a webgpu"):
        tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=WEBGPU, policy="stream_k")


@pytest.mark.parametrize("policy", ["data_parallel", "heuristic"])
def test_a_run_time_m_runs_data_parallel_at_every_token_count(policy):
    # dlight's schedule of a Relax matmul of a run-time M: the kernel takes M as an int64
    # scalar, which TVM's WGSL declares as an i32 (and its runtime packs so). The heuristic
    # keeps data-parallel: Stream-K's closed forms of a run-time tile count are 64-bit.
    func = dlight_matmul(tvm.tirx.Var("m", "int64"), 40, 24, dlight.gpu.Matmul(), WEBGPU)
    sch = Schedule(func)
    plan = tvm_streamk.stream_k(sch, update_block(sch), num_sms=4, target=WEBGPU, policy=policy)
    assert plan.policy == "data_parallel"
    assert policy == "data_parallel" or "integers cannot walk it" in plan.reason, plan.reason
    kernel = webgpu.compile(sch.mod, "tvm_streamk")
    assert "m: i32" in kernel.source
    for tokens in (1, 37, 130):
        args = workloads.random_args(func, np.random.default_rng(tokens), m=tokens)
        out = kernel.run(*args)[-1]
        assert workloads.relative_error(out, matmul_reference(args)) <= FP32_TOL, tokens


def test_an_int64_scalar_past_the_i32_is_refused():
    from tvm_streamk.pocl.launch import ScalarArg
    from tvm_streamk.webgpu.runner import _pod

    assert _pod("k", ScalarArg("m", "int64", 2**31 - 1)) == np.int32(2**31 - 1).tobytes()
    with pytest.raises(webgpu.WebGPUError, match="m = 2147483648, which the int32"):
        _pod("k", ScalarArg("m", "int64", 2**31))


def test_a_missing_compute_unit_count_is_asked_for():
    with pytest.raises(ValueError, match="num_sms"):
        tvm_streamk.relax_pipeline(WEBGPU)


HIDDEN, FFN, TOKENS = 64, 96, 37


def test_relax_pipeline_kernels_of_a_transformer_block():
    mod, _ = LinearBlock(HIDDEN, FFN).export_tvm(
        spec={"forward": {"x": nn.spec.Tensor((TOKENS, HIDDEN), "float32")}}
    )
    pipeline = tvm_streamk.relax_pipeline(WEBGPU, num_sms=4, policy="stream_k")
    lib = tvm.compile(mod, target=WEBGPU, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
    assert lib is not None and pipeline.rule.skipped == {}
    report = tvm_streamk.model_report(mod, WEBGPU, num_sms=4, policy="stream_k")
    decided = [k for k in report.kernels if k.decided]
    assert len(decided) == 7 and all(k.plan.policy == "stream_k" for k in decided), report

    # Each decided kernel again, scheduled as the pipeline schedules it, run on WebGPU against
    # TVM's LLVM build of the same fused function.
    rule = tvm_streamk.dlight.StreamKMatmul(num_sms=4, policy="stream_k")
    with WEBGPU:
        fused = tvm.transform.Sequential(fusion_passes(WEBGPU))(mod)
    ran = 0
    for gv, func in fused.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        with WEBGPU:
            scheduled = dlight.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))
        if gv.name_hint not in {k.name for k in decided}:
            continue
        main = scheduled["main"].with_attr("global_symbol", "main")
        reference = tvm.compile(
            tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm"
        )
        args = workloads.random_args(func, np.random.default_rng(ran))
        out = webgpu.run(tvm.IRModule({"main": main}), *args)[-1]
        expected = [tvm.runtime.tensor(a) for a in args]
        reference["main"](*expected)
        assert workloads.relative_error(out, expected[-1].numpy()) <= FP32_TOL, gv.name_hint
        ran += 1
    assert ran == 7


def test_the_pages_snippets_run_alone():
    page = ROOT / "docs" / "webgpu.md"
    codes = python_snippets(page)
    assert codes
    for code in codes:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert float(done.stdout.split()[-1]) <= FP32_TOL, done.stdout

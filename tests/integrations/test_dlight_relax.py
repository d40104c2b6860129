"""Whole models: the StreamKMatmul dlight rule and the Stream-K Relax pipeline."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_streamk
from tests.helpers import A100, H100, cuda_modules
from tests.kernels import dlight_matmul, int8_dense
from tvm_streamk import pocl, workloads
from tvm_streamk._compat import dlight
from tvm_streamk.analysis import blocks_under
from tvm_streamk.decision import record as ann
from tvm_streamk.dlight import StreamKMatmul
from tvm_streamk.relax_pipeline import fusion_passes, relax_pipeline, schedule_rules


def _mlp(M: int, K: int, N: int, epilogue: bool, dtype: str = "float32") -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((M, K), dtype))
    w = relax.Var("w", relax.TensorType((K, N), dtype))
    b = relax.Var("b", relax.TensorType((N,), dtype))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, w))
            if epilogue:
                h = bb.emit(relax.op.nn.relu(relax.op.add(h, b)))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def _cuda_source(executable) -> str:
    (cuda,) = cuda_modules(executable)
    return cuda.inspect_source()


def _decisions(mod: tvm.IRModule) -> list[ann.Decision]:
    found = []
    for func in mod.functions.values():
        if isinstance(func, tvm.tirx.PrimFunc):
            for block in blocks_under(func.body):
                if ann.has_decision(block.annotations):
                    found.append(ann.decode(block.annotations, block.name_hint))
    return found


def test_model_with_fused_epilogue_compiles_with_stream_k():
    # 133 x 4 tiles of dlight's 32 x 64 over K = 4096 on 132 SMs of 8 resident blocks each:
    # few tiles with a long K; bias + ReLU fused.
    pipeline = relax_pipeline(H100)
    lib = tvm.compile(
        _mlp(133 * 32, 4096, 4 * 64, epilogue=True),
        target=H100,
        relax_pipeline=pipeline,
        tir_pipeline="tvm_streamk",
    )
    assert pipeline.rule.skipped == {}
    source = _cuda_source(lib)
    # The epilogue needs the workspace fix-up: slots, arrival counters, fences.
    assert "sk_workspace" in source and "sk_arrivals" in source and "__threadfence" in source


def test_rule_keeps_data_parallel_when_tiles_fill_whole_waves():
    # 1056 tiles of 32 x 64: whole waves of 132 SMs x 8 resident blocks (x 1 without nvcc).
    mod = relax.transform.LegalizeOps()(_mlp(1056 * 32, 512, 64, epilogue=False))
    with H100:
        mod = dlight.ApplyDefaultSchedule(StreamKMatmul(), dlight.gpu.Fallback())(mod)
    (decision,) = _decisions(mod)
    assert decision.policy == "data_parallel" and decision.num_sms == 132


@pytest.mark.usefixtures("opencl")
def test_rule_output_is_correct_on_pocl():
    # 3 x 2 tiles of 32 x 64 on 4 SMs with 64 K-panels: two waves, the last half empty.
    mod = relax.transform.LegalizeOps()(_mlp(96, 1024, 128, epilogue=False))
    rule = StreamKMatmul(num_sms=4)
    with A100:
        mod = dlight.ApplyDefaultSchedule(rule, dlight.gpu.Fallback())(mod)
    (decision,) = _decisions(mod)
    assert decision.policy != "data_parallel", rule.skipped
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    args = workloads.random_args(func)
    out = pocl.run(func, *args, pipeline="tvm_streamk")[-1]
    ref = args[0].astype(np.float64) @ args[1].astype(np.float64)
    assert workloads.relative_error(out, ref) <= 1e-5


def test_tvm_builds_no_int8_tensor_core_matmul():
    """A canary: TVM 0.27's int8 tensor-core schedule stops in InjectSoftwarePipeline, so the
    rule gives int8 matmuls dlight's SIMT schedule (_compat.without_int8_tensorization). When
    stock TVM builds this, drop that shim."""
    with pytest.raises(Exception, match="fragment_info_"):
        tvm.compile(int8_dense(), A100)


@pytest.mark.usefixtures("opencl")
def test_int8_model_builds_and_runs_with_the_simt_schedule():
    # Every extent past 64: dlight would give the tensor-core schedule TVM cannot build.
    pipeline = relax_pipeline(A100, policy="stream_k", num_sms=5, blocks_per_sm=1)
    tvm.compile(int8_dense(), A100, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
    (plan,) = pipeline.rule.decided.values()
    assert plan.split_tiles, plan
    mod = relax.transform.LegalizeOps()(int8_dense())
    with A100:
        mod = dlight.ApplyDefaultSchedule(StreamKMatmul(policy="stream_k", num_sms=5))(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert "wmma" not in func.script()
    args = workloads.random_args(func)
    assert (args[-1] == -12345).all()
    out = pocl.run(func, *args, pipeline="tvm_streamk")[-1]
    np.testing.assert_array_equal(out, args[0].astype(np.int64) @ args[1].astype(np.int64))


def test_unknown_gpu_asks_for_num_sms():
    mod = relax.transform.LegalizeOps()(_mlp(160, 512, 192, epilogue=False))
    unknown = tvm.target.Target({"kind": "cuda", "arch": "sm_89", "max_num_threads": 1024})
    # The rule runs behind TVM's FFI, which re-raises Python errors as RuntimeError.
    with pytest.raises((tvm_streamk.StreamKError, RuntimeError)) as info, unknown:
        dlight.ApplyDefaultSchedule(StreamKMatmul(), dlight.gpu.Fallback())(mod)
    assert "[num-sms]" in str(info.value) and "StreamKMatmul(num_sms=" in str(info.value)


def test_pipeline_for_an_unknown_gpu_asks_for_num_sms_when_made():
    # Before, tvm.compile stopped at the first kernel it scheduled, naming the rule.
    unknown = tvm.target.Target({"kind": "cuda", "arch": "sm_89", "max_num_threads": 1024})
    with pytest.raises(tvm_streamk.StreamKError, match=r"\[num-sms\].*sm_89") as info:
        relax_pipeline(unknown)
    assert "relax_pipeline(target, num_sms=...)" in str(info.value)
    assert relax_pipeline(unknown, num_sms=58).rule.config.num_sms == 58
    with pytest.raises(tvm_streamk.StreamKError, match=r"model_report\(target, num_sms=...\)"):
        tvm_streamk.model_report(_mlp(160, 512, 192, epilogue=False), unknown)


def test_pipeline_refuses_targets_it_does_not_build_for():
    with pytest.raises(ValueError, match=r"targets of kind \['cuda', 'webgpu'\]; found .*'opencl'"):
        relax_pipeline(tvm.target.Target({"kind": "opencl"}))


def test_fp16_matmul_for_the_h100_tag_uses_tensor_cores():
    """The H100 tag's arch is sm_90a, which TVM 0.27's dlight does not parse: stock dlight gives
    fp16 matmuls plain registers there; this pipeline gives them the WMMA schedule."""
    mod = _mlp(512, 512, 512, epilogue=False, dtype="float16")
    lib = tvm.compile(
        mod, target=H100, relax_pipeline=relax_pipeline(H100), tir_pipeline="tvm_streamk"
    )
    assert "wmma::mma_sync" in _cuda_source(lib)
    # Stock dlight, for contrast: the same matmul gets WMMA for sm_90 and not for the tag.
    for target, tensor_cores in (({"kind": "cuda", "arch": "sm_90"}, True), (H100, False)):
        func = dlight_matmul(
            512, 512, 512, dlight.gpu.Matmul(), tvm.target.Target(target), "float16"
        )
        assert ("wmma" in func.script()) == tensor_cores, target


def test_rule_reports_every_kernel_under_a_readable_key():
    # Fused Relax functions have no symbol when dlight runs: the report keys them by shapes.
    pipeline = relax_pipeline(H100)
    tvm.compile(
        _mlp(133 * 32, 4096, 4 * 64, epilogue=True),
        target=H100,
        relax_pipeline=pipeline,
        tir_pipeline="tvm_streamk",
    )
    rule = pipeline.rule
    assert "" not in rule.decided and "" not in rule.skipped
    ((key, plan),) = rule.decided.items()
    assert key.startswith("kernel(4256x4096 float32, 4096x256 float32"), key
    assert plan.policy != "data_parallel" and plan.reason


def test_dynamic_token_count_gets_a_run_time_choice():
    # A symbolic M (a Relax model's token count): one build, Stream-K or data-parallel per M.
    m = tvm.tirx.Var("m", "int64")
    pipeline = relax_pipeline(H100)
    tvm.compile(
        _mlp(m, 256, 192, epilogue=True), H100, relax_pipeline=pipeline, tir_pipeline="tvm_streamk"
    )
    ((key, chosen),) = pipeline.rule.decided.items()
    assert key.startswith("kernel(mx256 float32, 256x192 float32"), key
    assert (chosen.policy, chosen.variant) == ("stream_k", "or_data_parallel")
    assert "Stream-K for the counts" in chosen.reason


def test_rule_says_why_per_kernel():
    # Two run-time extents (M and N): refused with the analysis's reason, keyed by the kernel.
    m, n = tvm.tirx.Var("m", "int64"), tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, n), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    pipeline = relax_pipeline(H100)
    tvm.compile(bb.get(), H100, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
    ((key, why),) = pipeline.rule.skipped.items()
    assert key == "kernel(mx64 float32, 64xn float32, mxn float32)"
    assert "[runtime-tiles]" in why and "all have run-time extents" in why


@pytest.mark.usefixtures("default_opencl")
def test_a_kernel_dlights_own_rule_stops_on_goes_to_the_next_rule():
    """TVM 0.27's ``gpu.GEMV`` asserts on a batched matmul of one output column with a fused
    epilogue, and stock ``tvm.compile`` stops there (found by the model fuzz). The pipeline
    tries it under a guard: the next rule schedules the kernel, with a warning naming it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 11, 16), "float32"))
    w = relax.Var("w", relax.TensorType((2, 16, 1), "float32"))
    b = relax.Var("bias", relax.TensorType((1,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(relax.op.matmul(x, w), b))
            out = bb.emit_output(relax.op.astype(h, "float16"))
        bb.emit_func_output(out)
    mod = bb.get()
    with pytest.raises(AssertionError):
        tvm.compile(mod, target=A100)
    with pytest.warns(RuntimeWarning, match=r"dlight's GEMV rule stopped on kernel\(2x11x16"):
        tvm.compile(mod, A100, relax_pipeline=relax_pipeline(A100), tir_pipeline="tvm_streamk")

    rule = StreamKMatmul(num_sms=4)
    with A100, pytest.warns(RuntimeWarning):
        fused = tvm.transform.Sequential(fusion_passes(A100))(mod)
        (gv,) = [gv for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
        func = fused[gv]
        scheduled = dlight.ApplyDefaultSchedule(*schedule_rules(rule))(fused)[gv]
    assert len(rule.decided) == 1, rule.skipped
    args = workloads.random_args(func)
    assert np.isnan(args[-1]).all()
    out = pocl.run(scheduled.with_attr("global_symbol", "main"), *args, pipeline="tvm_streamk")
    ref = np.asarray(args[0], np.float64) @ np.asarray(args[1], np.float64) + args[2]
    assert workloads.relative_error(out[-1], ref) <= 2.0**-10 + 1e-5

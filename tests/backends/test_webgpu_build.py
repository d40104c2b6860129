"""WebGPU as a target (issue 33, item 2): plans and the ``tvm_streamk`` pipeline build WGSL.

WGSL orders no store of one workgroup before another's read within a dispatch and has no float
atomics (:mod:`tvm_streamk.memory_model.webgpu`), so the atomic and workspace fix-ups are
refused with the reason, ``fixup="auto"`` takes ``separate`` (its partials cross a dispatch
boundary), and closed forms needing 64-bit integers are refused. Built only, with TVM's own
``tvm.compile``; tests/backends/test_webgpu.py runs the kernels (``-m webgpu``).
"""

import pytest
import tvm

import tvm_streamk
from tvm_streamk import workloads
from tvm_streamk.errors import StreamKError
from tvm_streamk.webgpu.errors import ShaderBuildError
from tvm_streamk.webgpu.lowering import lower

WEBGPU = tvm.target.Target("webgpu", host="llvm")
POLICIES = [
    {"policy": "stream_k"},
    {"policy": "split_k", "splits": 3},
    {"policy": "hybrid", "variant": "two_tile"},
]


def _wgsl(sch) -> str:
    lib = tvm.compile(sch.mod, target=WEBGPU, tir_pipeline="tvm_streamk")
    return lib.mod.imports[0].inspect_source()


@pytest.mark.parametrize("decision", POLICIES, ids=lambda d: d["policy"])
def test_auto_takes_the_separate_fixup_and_builds_wgsl(decision):
    sch = workloads.reference_schedule(workloads.gemm(45, 70, 53))
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=WEBGPU, **decision)
    assert plan.split_tiles
    assert tvm_streamk.explain(sch, print_=False).fixup == "separate"
    source = _wgsl(sch)
    # The persistent kernel and the merging kernel; no atomics, no 64-bit integers.
    assert source.count("@compute") == 2, source[:2000]
    assert "atomic" not in source and "i64" not in source


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_fixups_that_need_a_hand_off_or_atomics_are_refused(fixup):
    sch = workloads.reference_schedule(workloads.gemm(45, 70, 53))
    with pytest.raises(StreamKError, match="WebGPU|webgpu") as err:
        tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=WEBGPU, fixup=fixup)
    assert "separate" in str(err.value) or "atomic" in str(err.value)


def test_a_plan_past_32_bits_is_refused():
    sch = workloads.reference_schedule(workloads.gemm(8192, 8192, 8192))
    with pytest.raises(StreamKError, match="past the 32-bit integers of a webgpu kernel"):
        tvm_streamk.stream_k(sch, "C_update", num_sms=132, target=WEBGPU)
    # The same work on data-parallel needs no closed form.
    tvm_streamk.stream_k(sch, "C_update", num_sms=132, target=WEBGPU, policy="data_parallel")


def test_a_batch_walked_one_block_per_tile_past_32_bits_is_refused():
    # The kernel as written binds the batch to blockIdx.z, which WebGPU reserves: its
    # data-parallel decision is walked by closed forms (tile x panel units), here 2^26 tiles
    # of 2048 panels, and refused with the reason. The same tiles without a batch (no
    # blockIdx.z) are the kernel as written; 4096^3 twice in 32 x 32 x 8 tiles is walked.
    tiles = {"bm": 8, "bn": 8, "bk": 4, "tm": 2, "tn": 2}
    sch = workloads.reference_schedule(workloads.gemm(8192, 8192, 8192, batch=64), **tiles)
    with pytest.raises(StreamKError, match=r"\[index-width\].*does not bind blockIdx.z"):
        tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=WEBGPU, policy="data_parallel")
    sch = workloads.reference_schedule(workloads.gemm(8192, 8192, 8192), **tiles)
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=WEBGPU, policy="data_parallel")
    sch = workloads.reference_schedule(workloads.gemm(4096, 4096, 4096, batch=2))
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=WEBGPU, policy="data_parallel")
    assert "which webgpu reserves" in plan.reason
    assert "i64" not in _wgsl(sch)


def test_the_compute_unit_count_is_asked_for():
    sch = workloads.reference_schedule(workloads.gemm(45, 70, 53))
    with pytest.raises(StreamKError, match="num_sms"):
        tvm_streamk.stream_k(sch, "C_update", target=WEBGPU, policy="heuristic")


def test_a_grid_read_from_the_device_is_refused():
    # WebGPU reports no compute-unit count for num_sms="device" to read: accepted, the host
    # code asked the runtime for it (found by a WebGPU campaign of the workload fuzz).
    sch = workloads.reference_schedule(workloads.gemm(45, 70, 53))
    with pytest.raises(StreamKError, match=r"\[num-sms\].*webgpu devices report no"):
        tvm_streamk.stream_k(sch, "C_update", num_sms="device", target=WEBGPU, policy="stream_k")
    # A decision made for another target is refused by the lowering for WebGPU.
    tvm_streamk.stream_k(sch, "C_update", num_sms="device", policy="stream_k")
    with pytest.raises(Exception, match=r"\[num-sms\].*webgpu devices report no"):
        tvm.compile(sch.mod, target=WEBGPU, tir_pipeline="tvm_streamk")


@pytest.mark.parametrize("policy", ["data_parallel", "heuristic", "stream_k"])
@pytest.mark.parametrize(
    "func",
    [workloads.grouped_gemm(3, 40, 56), workloads.grouped_weight_grad(3, 40, 56)],
    ids=["grouped_gemm", "weight_gradient"],
)
def test_grouped_sites_are_refused_for_their_64_bit_tile_count(func, policy):
    # Their kernels read the tile count on the device in 64 bits, data-parallel's too.
    # Before, data_parallel was refused for want of a fix-up with the advice to use
    # data_parallel (a WebGPU campaign of the workload fuzz), or accepted and not built.
    sch = workloads.reference_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    with pytest.raises(StreamKError, match=r"\[index-width\].*64-bit integers"):
        tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=WEBGPU, policy=policy)


@pytest.mark.parametrize(
    "in_dtype, out_dtype, found",
    [("int8", None, "A of int8"), ("bfloat16", None, "A of bfloat16"), (None, "bfloat16", "D of")],
)
def test_buffers_wgsl_cannot_store_are_refused_by_name(in_dtype, out_dtype, found):
    # TVM writes array<i8> (a bfloat16 buffer: array<u16>), which naga refuses with a parse
    # error naming neither the buffer nor what to do.
    func = workloads.gemm(37, 70, 100, in_dtype=in_dtype or "float32", out_dtype=out_dtype)
    sch = workloads.reference_schedule(func)
    with pytest.raises(ShaderBuildError, match=found) as err:
        lower("main", sch.mod["main"], "default")
    assert "CUDA or OpenCL" in str(err.value)

"""The workspace fix-up on PoCL: the case grid, determinism, repeated launches, fused epilogues.

Outputs are poisoned with NaN and never zeroed; the PoCL backend fills the function's own
workspace and counters with all-ones bytes (NaN / -1) before the first launch, as uninitialised
GPU memory would be, so a kernel relying on zeroed memory fails here.
"""

import math
import re

import numpy as np
import pytest
import tvm

import tvm_streamk
from tests.helpers import A100, FP32_TOL, H100, OPENCL, bracketed
from tests.kernels import GEMM_CASES
from tvm_streamk import pocl, workloads
from tvm_streamk._compat import split_host_device_mods

pytestmark = pytest.mark.usefixtures("opencl")

# fp16 output: the float64 reference rounded to fp16 differs by at most one fp16 ulp (2^-10
# relative), plus the fp32 accumulation error.
FP16_TOL = 2.0**-10 + FP32_TOL


def _schedule(func, **kwargs):
    sch = workloads.reference_schedule(func)
    kwargs.setdefault("num_sms", 4)
    plan = tvm_streamk.stream_k(sch, "C_update", fixup="workspace", target=OPENCL, **kwargs)
    return sch, plan


@pytest.mark.parametrize("M,N,K,num_sms,what", GEMM_CASES, ids=[c[-1] for c in GEMM_CASES])
def test_workspace_case_grid(M, N, K, num_sms, what):
    func = workloads.gemm(M, N, K)
    sch, _ = _schedule(func, num_sms=num_sms)
    args = workloads.random_args(func)
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    assert workloads.relative_error(out, workloads.reference(func, args)) <= FP32_TOL


def test_workspace_fp16_inputs():
    func = workloads.gemm(96, 64, 48, in_dtype="float16")
    sch, _ = _schedule(func, num_sms=5)
    args = workloads.random_args(func)
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    assert workloads.relative_error(out, workloads.reference(func, args)) <= FP32_TOL


@pytest.mark.parametrize(
    "kwargs",
    [
        {"policy": "stream_k"},
        {"policy": "split_k", "splits": 3},
        {"policy": "hybrid", "variant": "one_tile"},
        {"policy": "hybrid", "variant": "two_tile"},
    ],
    ids=lambda k: "-".join(map(str, k.values())),
)
def test_workspace_policies(kwargs):
    func = workloads.gemm(352, 32, 48)
    sch, plan = _schedule(func, **kwargs)
    assert plan.split_tiles, "the case must split tiles to exercise the fix-up"
    args = workloads.random_args(func)
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    assert workloads.relative_error(out, workloads.reference(func, args)) <= FP32_TOL


def test_bitwise_identical_over_20_runs():
    func = workloads.gemm(32, 32, 512)
    sch, plan = _schedule(func, num_sms=7)
    assert plan.peers(0) == 7
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    args = workloads.random_args(func)
    first = kernel.run(*args)[-1]
    assert workloads.relative_error(first, workloads.reference(func, args)) <= FP32_TOL
    for _ in range(19):
        again = kernel.run(*[a.copy() for a in args])[-1]
        assert np.array_equal(again.view(np.uint32), first.view(np.uint32))


def test_100_launches_reuse_one_workspace():
    func = workloads.gemm(96, 96, 40)
    sch, plan = _schedule(func)
    assert plan.split_tiles
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    args = workloads.random_args(func)
    outs = kernel.run_repeated(*args, launches=100, poison_outputs=True)
    ref = workloads.reference(func, args)
    assert len(outs) == 100
    for out in outs:
        assert workloads.relative_error(out[-1], ref) <= FP32_TOL


@pytest.mark.parametrize("batch", [None, 3])
def test_fused_bias_relu_cast_to_fp16(batch):
    # Batched: one bias for every batch, the batch on blockIdx.z beside the tile band.
    func = workloads.gemm(70, 64, 40, epilogue="bias_relu", out_dtype="float16", batch=batch)
    sch, plan = _schedule(func, num_sms=4)
    assert plan.split_tiles
    args = workloads.random_args(func)
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    assert out.dtype == np.float16
    ref = workloads.reference(func, args)
    assert (ref == 0).any() and (ref > 0).any(), "ReLU must be exercised on both sides"
    assert workloads.relative_error(out, ref) <= FP16_TOL


def test_auto_picks_workspace_for_an_epilogue_and_atomics_for_fp32():
    epi = workloads.reference_schedule(
        workloads.gemm(64, 64, 64, epilogue="bias_relu", out_dtype="float16")
    )
    tvm_streamk.stream_k(epi, "C_update", num_sms=3, target=OPENCL)
    plain = workloads.reference_schedule(workloads.gemm(64, 64, 64))
    tvm_streamk.stream_k(plain, "C_update", num_sms=3, target=OPENCL)
    fixups = []
    for sch in (epi, plain):
        block = sch.get(sch.get_sblock("C_update"))
        fixups.append(str(block.annotations["tvm_streamk.fixup"]))
    assert fixups == ["workspace", "atomic"]


def test_deterministic_forces_workspace():
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64))
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, deterministic=True, target=OPENCL)
    assert str(sch.get(sch.get_sblock("C_update")).annotations["tvm_streamk.fixup"]) == "workspace"


def test_workspace_is_sized_for_the_split_tiles():
    from tvm_streamk.analysis import analyze
    from tvm_streamk.fixup_registry import footprint
    from tvm_streamk.transform.fixup_workspace import WorkspaceFixup

    func = workloads.gemm(96, 96, 40)
    sch, plan = _schedule(func)
    site = analyze(sch.mod["main"], "C_update")
    fix = WorkspaceFixup(site, plan, OPENCL, None, site.band[-1].body)
    # 4 blocks x 2 slots x (32 x 32 fp32) + one int32 counter per tile.
    expected = 4 * 2 * 32 * 32 * 4 + 4 * plan.tiles
    need = footprint(plan, "workspace", tile_elems=32 * 32, acc_bytes=4, out_bytes=4)
    assert need.workspace_bytes == expected and need.zeroed_bytes == 4 * plan.tiles
    # The lowering allocates what the footprint (and tvm_streamk.explain) counts.
    global_bytes = sum(
        math.prod(int(d) for d in b.shape) * tvm.DataType(str(b.dtype)).bits // 8
        for b in fix.buffers
        if b.scope() == "global"
    )
    assert global_bytes == expected


def test_a_hybrid_keeps_counters_for_its_stream_k_tiles_only():
    # 5 x 53 = 265 tiles on 132 SMs: two full waves would leave one tile, so the two-tile hybrid
    # walks 133 tiles Stream-K style and 132 data-parallel; only the 133 need counters.
    func = workloads.gemm(160, 53 * 32, 64)
    sch, plan = _schedule(func, num_sms=132, policy="hybrid", variant="two_tile")
    assert (plan.tiles, plan.stream_k_tiles(), plan.counter_tiles) == (265, 133, 133)
    lowered = tvm_streamk.lower(sch, OPENCL)["main"].script()
    assert 'sk_arrivals = T.sblock_alloc_buffer((133,), "int32")' in lowered
    assert workloads.relative_error(*_run_checked(func, sch)) <= FP32_TOL


def _run_checked(func, sch):
    args = workloads.random_args(func)
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    return out, workloads.reference(func, args)


@pytest.mark.parametrize("in_dtype", ["float32", "int8"])
def test_opencl_reads_other_blocks_partials_atomically(in_dtype):
    # OpenCL 1.2 orders memory across work-groups only through atomics: 32-bit partials are int32
    # bit patterns read back with atomic_or(p, 0), never a plain (cacheable) load.
    func = workloads.gemm(64, 64, 96, in_dtype=in_dtype)
    sch, plan = _schedule(func, num_sms=3)
    assert plan.split_tiles
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    reads = [line for line in kernel.source.splitlines() if "sk_workspace_ptr" in line]
    assert "__global int* restrict sk_workspace_ptr" in kernel.source
    assert any("atomic_or(((__global int *)sk_workspace_ptr" in line for line in reads)
    assert not any(re.search(r"=[^=]*\bsk_workspace_ptr\[", line) for line in reads)
    args = workloads.random_args(func)
    out = kernel.run(*args)[-1]
    ref = workloads.reference(func, args)
    if in_dtype == "int8":
        assert np.array_equal(out, ref.astype(np.int64))
    else:
        assert workloads.relative_error(out, ref) <= FP32_TOL


ALLOC = re.compile(r"(\w+) = T\.decl_buffer\(.*TVMBackendAllocWorkspace")
LAUNCH = re.compile(r'T\.call_packed_lowered\("(main_kernel\w*)"')
FREE = re.compile(r"TVMBackendFreeWorkspace\(\w+, \w+, (\w+)\.data\)")


@pytest.mark.parametrize(
    "fixup, expected",
    [
        ("atomic", ["launch main_kernel", "launch main_kernel_1"]),
        (
            "workspace",
            [
                "alloc sk_arrivals",
                "alloc sk_workspace",
                "launch main_kernel",
                "launch main_kernel_1",
                "free sk_workspace",
                "free sk_arrivals",
            ],
        ),
    ],
)
def test_every_cuda_call_takes_zeroes_and_frees_its_own_state(fixup, expected):
    """What the README says of streams, read from the CUDA host function: the state comes from
    TVM's workspace pool within the call, the zeroing kernel (of C or of the counters) is launched
    before the persistent kernel on the same stream, and the state returns to the pool right
    after the launches, while the kernels may still run."""
    h100 = tvm.target.Target("nvidia/nvidia-h100")
    sch = workloads.reference_schedule(workloads.gemm(96, 96, 40))
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, fixup=fixup, target=h100)
    mod = tvm.tirx.transform.BindTarget(h100.with_host("llvm"))(sch.mod)
    pipeline, finalize_host, _ = tvm.tirx.get_tir_pipeline("tvm_streamk")
    host, _ = split_host_device_mods(pipeline(mod))
    steps = []
    for line in finalize_host()(host).script().splitlines():
        for kind, pattern in (("alloc", ALLOC), ("launch", LAUNCH), ("free", FREE)):
            if m := pattern.search(line):
                steps.append(f"{kind} {m.group(1)}")
    assert steps == expected


def test_workspace_slots_are_coalesced():
    """A warp's threads store and read consecutive words of a slot: ``threadIdx.x`` is the
    innermost term of every workspace index, ``threadIdx.y`` strides by the block's width (8),
    the write-back's own loops stride by the 64 threads."""
    h100 = tvm.target.Target("nvidia/nvidia-h100")
    sch = workloads.reference_schedule(workloads.gemm(448, 1216, 4096))
    tvm_streamk.stream_k(sch, "C_update", num_sms=132, fixup="workspace", target=h100)
    source = tvm.compile(sch.mod, target=h100, tir_pipeline="tvm_streamk").mod.imports[0]
    text = source.inspect_source()
    accesses = bracketed(text, "sk_workspace_ptr[")
    assert len(accesses) == 2, accesses  # the partial's store and the last arriver's read
    for index in accesses:
        assert index.endswith("+ ((int)threadIdx.x))"), index
        assert "(((int)threadIdx.y) * 8)" in index and "* 64)" in index, index


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_vector_lanes_are_summed_before_the_write_back(dtype):
    """dlight's SIMT schedule stores two lanes per thread (the float16x2 accumulators of H100's
    sm_90a, float32 on an A100). float16 partials are read as plain loads on OpenCL: the lanes
    go innermost in the slots and the last arriver sums them over the peers as one vector load
    each (``sk_lane_sum``) before the vectorised write-back. float32 partials are read through
    one 32-bit atomic per element: they keep the scalar, threads-innermost layout."""
    from tvm.s_tir import Schedule

    from tests.kernels import dlight_matmul
    from tvm_streamk._compat import dlight

    M, K, N = (256, 512, 256) if dtype == "float32" else (96, 256, 128)
    target = A100 if dtype == "float32" else H100
    func = dlight_matmul(M, K, N, dlight.gpu.Matmul(), target, dtype=dtype)
    sch = Schedule(func.with_attr("global_symbol", "main"))
    block = tvm_streamk.analysis.first_site(sch.mod["main"]).block.name_hint
    plan = tvm_streamk.stream_k(sch, block, num_sms=5, fixup="workspace", target=OPENCL)
    assert plan.split_tiles
    lowered = tvm_streamk.lower(sch.mod, OPENCL)["main"].script()
    lanes = 2 if dtype == "float16" else 1
    assert ('T.sblock("sk_lane_sum")' in lowered) == (lanes > 1)
    # float32 is the printer's default dtype.
    declared = rf'sk_sum = T.sblock_alloc_buffer\(\({lanes},\),( "{dtype}",)? scope="local"\)'
    assert re.search(declared, lowered), lowered
    args = workloads.random_args(func)
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    a, b = (x.astype(np.float64) for x in args[:2])
    if dtype == "float32":
        assert workloads.relative_error(out, a @ b) <= FP32_TOL
    else:
        # float16 accumulation, in K products and the peers' sums: at most K + 2 roundings of
        # 2^-11 each (gamma_K), plus the output's own rounding.
        bound = (K + 2) * 2.0**-11 * (np.abs(a) @ np.abs(b)) + 2.0**-11 * np.abs(a @ b)
        assert np.isfinite(out).all() and (np.abs(out.astype(np.float64) - a @ b) <= bound).all()

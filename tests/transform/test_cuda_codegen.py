"""Stream-K GEMMs built for CUDA through the ``tvm_streamk`` pipeline, compiled offline by nvcc.

Nothing runs: the machine has no GPU. The checks are what the CUDA source and nvcc's PTX show:
a zero-prologue kernel and a persistent kernel, the atomic fix-up as ``atomicAdd``, and which PTX
atomic each accumulator dtype becomes on sm_80 and sm_90. ``tvm.support.nvcc.compile_cuda`` reads
the compute version from the current target, so it is called inside ``with target``.
"""

import re
import shutil

import pytest
import tvm
from tvm.support import nvcc

import tvm_streamk
from tests.helpers import SM_COUNTS, SM_TARGETS, bracketed
from tests.kernels import budget_schedule
from tvm_streamk import workloads
from tvm_streamk.errors import StreamKError
from tvm_streamk.gpus import SM_COUNT_BY_TAG

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

TAGS = ("nvidia/nvidia-h100", "nvidia/nvidia-a100")
# 4 x 3 tiles of 64 x 64 and 32 K-panels of 16: 384 iterations over the tag's SM count, so every
# tile is split and the zero prologue has work.
M, N, K = 256, 192, 512
KERNEL = re.compile(
    r"__global__\s+void\s+(?:__launch_bounds__\((\d+)(?:,\s*\d+)?\)\s+)?(\w+)\(([^)]*)\)\s*\{"
)
PTX_ATOMIC = re.compile(r"\b(?:atom|red)\.[\w.]+")


def _stream_k_source(tag: str, in_dtype: str, acc_dtype: str | None = None, **tile) -> tuple:
    target = tvm.target.Target(tag)
    func = workloads.gemm(M, N, K, in_dtype=in_dtype, acc_dtype=acc_dtype)
    sch = workloads.reference_schedule(func, **(tile or dict(bm=64, bn=64, bk=16)))
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=SM_COUNT_BY_TAG[tag], fixup="atomic", target=target
    )
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    (device_module,) = lib.mod.imports
    return target, plan, device_module.inspect_source()


def _nvcc(source: str, target: tvm.target.Target, target_format: str) -> bytes:
    """nvcc's output for the target's own arch (``sm_90a`` for the H100 tag: nvcc 13 takes it)."""
    with target:
        return bytes(
            nvcc.compile_cuda(
                source,
                target_format=target_format,
                arch=str(target.attrs["arch"]),
                compiler="nvcc",
            )
        )


CASES = [(tag, in_dtype) for tag in TAGS for in_dtype in ("float32", "float16")]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0].split('-')[-1]}-{c[1]}")
def built(request):
    tag, in_dtype = request.param
    target, plan, source = _stream_k_source(tag, in_dtype)
    return tag, in_dtype, target, plan, source


def test_source_has_a_zero_prologue_and_a_persistent_kernel(built):
    _, in_dtype, _, plan, source = built
    assert plan.policy == "stream_k" and plan.split_tiles
    kernels = KERNEL.findall(source)
    assert len(kernels) == 2, kernels
    (zero_threads, _, zero_params), (main_threads, _, main_params) = kernels
    # The prologue only touches the output; the persistent kernel reads both operands.
    assert "C_ptr" in zero_params and "A_ptr" not in zero_params and "B_ptr" not in zero_params
    assert all(p in main_params for p in ("A_ptr", "B_ptr", "C_ptr"))
    ctype = {"float32": "float", "float16": "half"}[in_dtype]
    assert f"{ctype}* __restrict__ A_ptr" in main_params
    assert zero_threads == main_threads == "256"  # the 16 x 16 threads of a 64 x 64 tile


def test_partial_tiles_are_merged_with_atomic_add_into_fp32(built):
    _, _, _, _, source = built
    calls = [line for line in source.splitlines() if "atomicAdd(" in line]
    assert len(calls) == 1, calls
    assert "&(C_ptr[" in calls[0]


def test_nvcc_compiles_the_source_to_cubin(built):
    _, _, target, _, source = built
    cubin = _nvcc(source, target, "cubin")
    assert cubin[:4] == b"\x7fELF"


def test_ptx_has_both_kernels_and_a_global_fp32_atomic_add(built):
    _, _, target, _, source = built
    ptx = _nvcc(source, target, "ptx").decode()
    assert len(re.findall(r"\.entry\s+\w+", ptx)) == 2
    assert set(PTX_ATOMIC.findall(ptx)) & {"atom.global.add.f32", "red.global.add.f32"}


# A half-precision accumulator takes no atomics, even where the GPU has a native fp16 or bf16
# atomic add (sm_70+, sm_90): each partial would be rounded to half as it lands, unlike the
# serial sum. The workspace fix-up sums them in the accumulator once.
@pytest.mark.parametrize("tag", ["nvidia/nvidia-h100", "nvidia/nvidia-a100", "nvidia/nvidia-t4"])
@pytest.mark.parametrize("acc_dtype", ["float16", "bfloat16"])
def test_half_precision_accumulators_take_no_atomics(tag, acc_dtype):
    func = workloads.gemm(64, 64, 64, in_dtype="float16", acc_dtype=acc_dtype)
    sch = workloads.reference_schedule(func)
    before = sch.mod
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(
            sch, "C_update", num_sms=SM_COUNT_BY_TAG[tag], fixup="atomic", target=tag
        )
    assert info.value.condition == "atomic-dtype"
    assert f"a {acc_dtype} accumulator" in str(info.value) and "fixup='workspace'" in str(
        info.value
    )
    tvm.ir.assert_structural_equal(sch.mod, before)  # a refused call changes nothing
    # "auto" takes the workspace there, and the kernel builds for the GPU.
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=SM_COUNT_BY_TAG[tag], target=tag)
    assert plan.split_tiles
    tvm.compile(sch.mod, target=tag, tir_pipeline="tvm_streamk")


# The persistent kernel must keep the data-parallel kernel's on-chip footprint: one tile's panels
# in shared memory and one thread's register tile, whatever the policy. 5 tiles of 32 x 32 with
# 128 K-panels on 2 SMs: the hybrids mix a Stream-K unit with data-parallel waves (3 and 2 units).
ALLOCATION = re.compile(
    r"^\s*(__shared__\s+)?(?:alignas\(\d+\)\s+)?(\w+)\s+(\w+)\[(\d+)\];\s*$", re.M
)
FOOTPRINT_POLICIES = [
    dict(policy="stream_k"),
    dict(policy="hybrid", variant="one_tile"),
    dict(policy="hybrid", variant="two_tile"),
    dict(policy="split_k", splits=2),
]


def _allocations(source: str) -> dict[str, tuple[str, str, int]]:
    """Fixed-size arrays the kernels declare: name -> (scope, dtype, elements)."""
    return {
        name: ("shared" if shared else "local", dtype, int(count))
        for shared, dtype, name, count in ALLOCATION.findall(source)
    }


def _footprint(**kwargs) -> tuple[tvm_streamk.Plan, dict, tvm.target.Target]:
    target = tvm.target.Target("nvidia/nvidia-a100")
    sch = workloads.reference_schedule(workloads.gemm(160, 32, 1024))
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=2, fixup="atomic", target=target, **kwargs)
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    return plan, _allocations(lib.mod.imports[0].inspect_source()), target


@pytest.fixture(scope="module")
def data_parallel_footprint() -> dict:
    _, allocations, _ = _footprint(policy="data_parallel")
    assert allocations == {
        "C_local_ptr": ("local", "float", 16),
        "A_shared_ptr": ("shared", "float", 256),
        "B_shared_ptr": ("shared", "float", 256),
    }
    return allocations


@pytest.mark.parametrize("kwargs", FOOTPRINT_POLICIES, ids=lambda k: "-".join(map(str, k.values())))
def test_every_policy_keeps_the_data_parallel_footprint(kwargs, data_parallel_footprint):
    plan, allocations, target = _footprint(**kwargs)
    if plan.policy == "hybrid":
        assert plan.units() > 1

    def of_scope(allocs: dict, scope: str) -> dict:
        return {name: a for name, a in allocs.items() if a[0] == scope}

    assert of_scope(allocations, "shared") == of_scope(data_parallel_footprint, "shared")
    # The register tile keeps the data-parallel size; a hybrid adds one int register per bound
    # of its unit's range (sk_lo_local, sk_hi_local: how the range stays opaque to compaction).
    local = of_scope(allocations, "local")
    ranges = {name: a for name, a in local.items() if name.startswith("sk_")}
    assert set(ranges.values()) <= {("local", "int", 1)}
    assert set(ranges) <= {"sk_lo_local_ptr", "sk_hi_local_ptr"}
    tiles = {name: a for name, a in local.items() if name not in ranges}
    assert tiles == of_scope(data_parallel_footprint, "local")
    shared_bytes = sum(4 * n for _, _, n in of_scope(allocations, "shared").values())
    assert shared_bytes <= int(target.attrs["max_shared_memory_per_block"])


@pytest.mark.parametrize("policy", ["stream_k", "hybrid"])
def test_workspace_hand_off_fences_only_in_the_leader(policy):
    # CUTLASS's barrier.h protocol: block barrier, then the leader fences, arrives and fences;
    # every thread used to fence twice per partial segment.
    target = tvm.target.Target("nvidia/nvidia-h100")
    sch = workloads.reference_schedule(workloads.gemm(M, N, K), bm=64, bn=64, bk=16)
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=5, blocks_per_sm=1, policy=policy, fixup="workspace", target=target
    )
    assert plan.split_tiles
    source = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk").mod.imports[0]
    lines = source.inspect_source().splitlines()
    fences = [i for i, line in enumerate(lines) if "__threadfence()" in line]
    arrivals = [i for i, line in enumerate(lines) if "atomicAdd" in line and "sk_arrivals" in line]
    assert fences and len(fences) == 2 * len(arrivals)
    for arrival in arrivals:
        # The leader's branch: fence, arrival, fence, directly under its threadIdx == 0 guard.
        assert {arrival - 1, arrival + 1} <= set(fences)
        assert "((int)threadIdx.x) == 0)" in lines[arrival - 2]
    assert _nvcc(source.inspect_source(), target, "cubin")


@pytest.mark.parametrize(
    "source, vector, lanes", [("dlight", "float2", 2), ("dlight_wmma", "half4", 4)]
)
def test_a_threads_lanes_of_a_slot_are_one_access(source, vector, lanes):
    """dlight's write-backs store ``lanes`` consecutive elements per thread (a vectorised
    loop): each thread stores them to its slot as one ``vector`` and the last arriver reads
    them back as one 64-bit ``__ldcg`` word, the threads of a warp on consecutive vectors and
    words. Before the lanes went innermost, a thread's lanes lay a block's width of threads
    apart: one scalar store and one scalar ``__ldcg`` per element."""

    sch, block = budget_schedule(source, "sm_90")
    h100 = tvm.target.Target(SM_TARGETS["sm_90"])
    tvm_streamk.stream_k(
        sch,
        block,
        num_sms=SM_COUNTS["sm_90"],
        policy="split_k",
        splits=2,
        fixup="workspace",
        target=h100,
    )
    text = tvm.compile(sch.mod, target=h100, tir_pipeline="tvm_streamk").mod.imports[0]
    text = text.inspect_source()
    assert "sk_workspace_ptr[" not in text, "a scalar access to the workspace is left"
    stores = bracketed(text, f"*({vector}*)(sk_workspace_ptr + ")
    reads = bracketed(text, "__ldcg((&(((int64_t*)sk_workspace_ptr)[")
    assert stores and reads, (len(stores), len(reads))
    for index in stores:
        assert f"(((int)threadIdx.x) * {lanes})" in index, index
    for index in reads:
        assert "+ ((int)threadIdx.x))" in index, index


def test_lanes_wider_than_a_word_keep_the_scalar_layout():
    """A float4 write-back (the reference schedule with its inner write-back loop vectorised):
    no single ``__ldcg`` reads 16 bytes, and two 8-byte reads on a thread's 16-byte stride would
    move twice the sectors of the scalar layout, so the slots keep ``threadIdx.x`` innermost and
    every workspace access is a scalar one."""
    func = workloads.gemm(128, 128, 64)
    sch = workloads.reference_schedule(func)
    write_back = sch.get_sblock("C_local")
    sch.vectorize(sch.get_loops(write_back)[-1])
    h100 = tvm.target.Target("nvidia/nvidia-h100")
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=5, fixup="workspace", target=h100)
    assert plan.split_tiles
    text = tvm.compile(sch.mod, target=h100, tir_pipeline="tvm_streamk").mod.imports[0]
    text = text.inspect_source()
    assert "*(float4*)(C_ptr + " in text, "the case must have a float4 write-back"
    assert "sk_workspace_ptr + " not in text and "int64_t*)sk_workspace_ptr" not in text
    reads = bracketed(text, "__ldcg((&(sk_workspace_ptr[")
    assert reads
    for index in reads:
        assert index.endswith("+ ((int)threadIdx.x))"), index

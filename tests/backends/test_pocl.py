"""The PoCL backend: GPU-scheduled TIR rebuilt for OpenCL and run on the CPU.

Numeric tests compare against float64 numpy on fresh random inputs, with outputs poisoned with NaN
(or a sentinel for integers) before the run. Relative error is ``max|out - ref| / max|ref|``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import tirx as T

from tvm_streamk import pocl
from tvm_streamk._compat import dlight
from tvm_streamk.workloads import gemm, reference_schedule

pytestmark = pytest.mark.usefixtures("opencl")

# fp32 accumulation over K <= 128 of O(1) terms stays far below this; a wrong tile is O(1).
GEMM_RTOL = 1e-5
# Enough work-groups and adds per work-item that PoCL's concurrently running work-groups collide:
# a plain read-modify-write of C[0] in this shape loses updates in most runs.
GROUPS, THREADS, REPEAT = 64, 64, 16


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """``max|out - ref| / max|ref|`` in float64; any NaN left in ``out`` gives ``inf``."""
    out = np.asarray(out, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()


# fmt: off
def atomic_sum(dtype: str):
    """GROUPS x THREADS work-items each add one input element REPEAT times into ``C[0]``.

    Each thread adds the element its mirror thread staged in shared memory behind a work-group
    barrier, the shape of a Stream-K partial-tile fix-up.
    """
    @T.prim_func
    def main(A: T.Buffer((GROUPS * THREADS,), dtype), C: T.Buffer((1,), dtype)):
        bx = T.launch_thread("blockIdx.x", GROUPS)
        tx = T.launch_thread("threadIdx.x", THREADS)
        S = T.alloc_shared((THREADS,), dtype)
        S[tx] = A[bx * THREADS + tx]
        T.tvm_storage_sync("shared")
        for _ in range(REPEAT):
            T.evaluate(T.call_extern(dtype, "atomic_add", T.address_of(C[0]), S[THREADS - 1 - tx]))
        # CLK_GLOBAL_MEM_FENCE, as an integer: a string argument would print as a C literal.
        T.evaluate(T.call_extern("void", "mem_fence", T.uint32(2)))
    return main


@T.prim_func(s_tir=True)
def two_kernels(a: T.handle, c: T.handle, n: T.int32):
    m = T.int32()
    A = T.match_buffer(a, (m, 64), "float32")
    C = T.match_buffer(c, (m, 64), "float32")
    W = T.alloc_buffer((m, 64), "float32")
    for bx in T.thread_binding(m, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("scale"):
                W[bx, tx] = A[bx, tx] * T.float32(2) + T.Cast("float32", n)
    for bx in T.thread_binding(m, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("mirror"):
                C[bx, tx] = W[bx, 63 - tx]


@T.prim_func(s_tir=True)
def half_written_workspace(A: T.Buffer((4, 64), "float32"), C: T.Buffer((4, 64), "float32")):
    W = T.alloc_buffer((4, 64), "float32")
    for bx in T.thread_binding(4, thread="blockIdx.x"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("fill_half"):
                W[bx, tx] = A[bx, tx]
    for bx in T.thread_binding(4, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("copy_all"):
                C[bx, tx] = W[bx, tx]


@T.prim_func
def half_arith(A: T.Buffer((1024,), "float16"), B: T.Buffer((1024,), "float16"),
               C: T.Buffer((1024,), "float32")):
    bx = T.launch_thread("blockIdx.x", 16)
    tx = T.launch_thread("threadIdx.x", 16)
    for i in T.vectorized(4):
        B[bx * 64 + tx * 4 + i] = A[bx * 64 + tx * 4 + i] * T.float16(3) + T.float16(1)
    for i in T.vectorized(4):
        C[bx * 64 + tx * 4 + i] = T.Cast("float32", A[bx * 64 + tx * 4 + i])


@T.prim_func
def half_convert(H: T.Buffer((65536,), "float16"), F: T.Buffer((65536,), "float32"),
                 G: T.Buffer((65536,), "float32"), R: T.Buffer((65536,), "float16")):
    bx = T.launch_thread("blockIdx.x", 256)
    tx = T.launch_thread("threadIdx.x", 256)
    F[bx * 256 + tx] = T.Cast("float32", H[bx * 256 + tx])
    R[bx * 256 + tx] = T.Cast("float16", G[bx * 256 + tx])


@T.prim_func
def bf16_scale(A: T.Buffer((1024,), "bfloat16"), B: T.Buffer((1024,), "bfloat16")):
    bx = T.launch_thread("blockIdx.x", 16)
    tx = T.launch_thread("threadIdx.x", 64)
    B[bx * 64 + tx] = T.Cast("bfloat16", T.Cast("float32", A[bx * 64 + tx]) * T.float32(3))


@T.prim_func
def cuda_atomic(C: T.Buffer((1,), "float32")):
    _bx = T.launch_thread("blockIdx.x", 4)
    _tx = T.launch_thread("threadIdx.x", 32)
    T.evaluate(T.call_extern("float32", "atomicAdd", T.address_of(C[0]), T.float32(1)))


@T.prim_func
def string_fence_flag(C: T.Buffer((64,), "int32")):
    _bx = T.launch_thread("blockIdx.x", 1)
    tx = T.launch_thread("threadIdx.x", 64)
    C[tx] = tx
    T.evaluate(T.call_extern("void", "mem_fence", "CLK_GLOBAL_MEM_FENCE"))


@T.prim_func
def dynamic_shared(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
    bx = T.launch_thread("blockIdx.x", 4)
    tx = T.launch_thread("threadIdx.x", 64)
    S = T.alloc_buffer((64,), "float32", scope="shared.dyn")
    S[tx] = A[bx * 64 + tx]
    T.tvm_storage_sync("shared.dyn")
    B[bx * 64 + tx] = S[63 - tx]


def byte_gather(dtype: str) -> tvm.tirx.PrimFunc:
    """``C[i] = A[2 i] * A[i // 2] + A[i * i % 64]`` in lanes of two: the first and last
    operands gathered vectors (a strided ramp, an index vector of no closed form)."""

    @T.prim_func(s_tir=True)
    def gather(A: T.Buffer((64,), dtype), C: T.Buffer((32,), "int32")):
        for _bx in T.thread_binding(1, thread="blockIdx.x"):
            for tx in T.thread_binding(16, thread="threadIdx.x"):
                for v in T.vectorized(2):
                    with T.sblock("c"):
                        i = T.axis.spatial(32, tx * 2 + v)
                        C[i] = T.Cast("int32", A[i * 2]) * T.Cast("int32", A[i // 2]) + T.Cast(
                            "int32", A[i * i % 64]
                        )

    return gather
# fmt: on


def dlight_matmul(m: int, k: int, n: int, dtype: str, out_dtype: str | None = None):
    """A Relax matmul, legalized and scheduled by dlight's Matmul rule for an A100."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), dtype))
    w = relax.Var("w", relax.TensorType((k, n), dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            product = relax.op.matmul(x, w, out_dtype=out_dtype or dtype)
            out = bb.emit_output(bb.emit(product))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    with tvm.target.Target("nvidia/nvidia-a100"):
        return dlight.ApplyDefaultSchedule(dlight.gpu.Matmul(), dlight.gpu.Fallback())(mod)


@pytest.mark.parametrize("in_dtype", ["float32", "float16"])
@pytest.mark.parametrize("mnk", [(128, 128, 64), (100, 72, 37)], ids=["even", "uneven"])
def test_reference_gemm(in_dtype, mnk, rng):
    M, N, K = mnk
    sch = reference_schedule(gemm(M, N, K, in_dtype=in_dtype), bm=32, bn=32, bk=8, tm=4, tn=4)
    a = rng.uniform(-1.0, 1.0, (M, K)).astype(in_dtype)
    b = rng.uniform(-1.0, 1.0, (K, N)).astype(in_dtype)
    c = np.full((M, N), np.nan, dtype="float32")
    _, _, out = pocl.run(sch, a, b, c)
    # The reference takes the inputs as stored, so fp16 rounding of A and B is not an error.
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert relative_error(out, ref) <= GEMM_RTOL


def test_dlight_matmul_fp32(rng):
    mod = dlight_matmul(100, 96, 80, "float32")
    x = rng.standard_normal((100, 96)).astype("float32")
    w = rng.standard_normal((96, 80)).astype("float32")
    out = np.full((100, 80), np.nan, dtype="float32")
    *_, result = pocl.run(mod, x, w, out)
    assert relative_error(result, x.astype(np.float64) @ w.astype(np.float64)) <= GEMM_RTOL


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_gathered_byte_vectors(dtype, rng):
    # Lanes two elements apart, as dlight's int8 staging is read: TVM's C code generator packs
    # such a vector into an int, as CUDA keeps it, and PoCL refused the OpenCL (byte_gathers).
    a = rng.integers(-128 if dtype == "int8" else 0, 128, 64).astype(dtype)
    *_, out = pocl.run(byte_gather(dtype), a, np.full(32, -12345, "int32"))
    i = np.arange(32)
    expected = a[2 * i].astype(np.int32) * a[i // 2] + a[i * i % 64]
    np.testing.assert_array_equal(out, expected)


def test_dlight_matmul_int8(rng):
    # dlight's SIMT int8 schedule (tensor cores take aligned ones) gathers its staged operands
    # (test_gathered_byte_vectors).
    mod = dlight_matmul(37, 100, 70, "int8", out_dtype="int32")
    x = rng.integers(-128, 128, (37, 100)).astype("int8")
    w = rng.integers(-128, 128, (100, 70)).astype("int8")
    *_, result = pocl.run(mod, x, w, np.full((37, 70), -12345, "int32"))
    np.testing.assert_array_equal(result, x.astype(np.int64) @ w.astype(np.int64))


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_atomic_add_across_work_groups(dtype, rng):
    # Small integers keep every partial float32 sum exact, so the expected total is exact too.
    a = rng.integers(-8, 9, GROUPS * THREADS).astype(dtype)
    start = np.array([rng.integers(-100, 100)], dtype=dtype)
    _, total = pocl.run(atomic_sum(dtype), a, start)
    assert total[0] == start[0] + REPEAT * a.astype(np.int64).sum()


def test_wmma_kernel_is_refused():
    mod = dlight_matmul(128, 128, 128, "float16")
    with pytest.raises(pocl.UnsupportedKernelError) as err:
        pocl.run(mod, *(np.zeros((128, 128), "float16") for _ in range(3)))
    message = str(err.value)
    assert "'matmul'" in message
    assert "tensor-core intrinsic tirx.tvm_" in message
    assert "without tensor cores" in message


def test_cuda_atomic_is_refused():
    with pytest.raises(pocl.UnsupportedKernelError, match=r"'cuda_atomic' uses .* atomicAdd\(\)"):
        pocl.compile(cuda_atomic)


def test_string_fence_flag_is_refused():
    # It would compile, with the address of the string literal as the fence flags.
    with pytest.raises(pocl.UnsupportedKernelError, match=r"mem_fence\(\) with a string argument"):
        pocl.compile(string_fence_flag)


def test_dynamic_shared_memory_is_refused():
    # TVM's OpenCL codegen prints shared.dyn buffers as private arrays: wrong, not an error.
    with pytest.raises(pocl.UnsupportedKernelError, match="shared.dyn"):
        pocl.compile(dynamic_shared)


def test_launch_sequence_with_workspace_and_symbolic_shape(rng):
    kernel = pocl.compile(two_kernels)
    names = [launch.kernel for launch in kernel.launches]
    assert names == ["two_kernels_kernel", "two_kernels_kernel_1"]
    for launch in kernel.launches:
        assert any(isinstance(arg, pocl.WorkspaceArg) for arg in launch.args)
    assert [launch.block for launch in kernel.launches] == [(64, 1, 1), (64, 1, 1)]
    a = rng.standard_normal((5, 64)).astype("float32")
    _, c, n = kernel.run(a, np.full((5, 64), np.nan, dtype="float32"), 3)
    assert int(n) == 3
    np.testing.assert_array_equal(c, (a * np.float32(2) + np.float32(3))[:, ::-1])


def test_workspace_starts_poisoned_and_outputs_are_known(rng):
    kernel = pocl.compile(half_written_workspace)
    assert kernel.outputs == (1,)
    a = rng.standard_normal((4, 64)).astype("float32")
    calls = kernel.run_repeated(a, np.zeros((4, 64), "float32"), launches=2, poison_outputs=True)
    assert len(calls) == 2
    for _, out in calls:
        np.testing.assert_array_equal(out[:, :32], a[:, :32])
        # Never written: the workspace's all-ones bytes read as NaN, as GPU garbage would.
        assert np.isnan(out[:, 32:]).all()


def test_float16_is_emulated_exactly(rng):
    a = (rng.standard_normal(1024) * 8).astype("float16")
    _, b, c = pocl.run(half_arith, a, np.zeros(1024, "float16"), np.full(1024, np.nan, "float32"))
    # float32 arithmetic rounded once at the float16 store.
    np.testing.assert_array_equal(b, (a.astype(np.float32) * 3 + 1).astype(np.float16))
    np.testing.assert_array_equal(c, a.astype(np.float32))


def test_float16_conversions_round_like_ieee(rng):
    # Every float16 bit pattern widened, and float32 patterns from all binades (subnormals,
    # overflow, infinities, NaNs) narrowed, against numpy's round-to-nearest-even.
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    floats = rng.integers(0, 2**32, 65536, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # Overflow and subnormal boundaries, round-half-even ties, signed zero, specials.
    ties = [65504, 65519.996, 65520, 2.0**-24, 2.0**-25, 1.5 * 2.0**-24, 1 + 2.0**-11]
    specials = [1 + 3 * 2.0**-11, -0.0, np.inf, -np.inf, np.nan]
    edges = np.array(ties + specials, dtype=np.float32)
    floats[: len(edges)] = edges
    _, widened, _, narrowed = pocl.run(
        half_convert, halves, np.zeros(65536, "float32"), floats, np.zeros(65536, "float16")
    )
    nan = np.isnan(halves)
    np.testing.assert_array_equal(
        widened[~nan].view(np.uint32), halves[~nan].astype(np.float32).view(np.uint32)
    )
    assert np.isnan(widened[nan]).all()
    with np.errstate(over="ignore"):
        expected = floats.astype(np.float16)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(narrowed[~nan].view(np.uint16), expected[~nan].view(np.uint16))
    assert np.isnan(narrowed[nan]).all()


def test_float16_accumulator_rounds_every_step(rng):
    # An fp16 accumulator in registers, updated in K order: each step is a float32 multiply-add
    # (exact product of two halves) rounded to float16, so numpy can replay it bit for bit.
    M, N, K = 64, 64, 48
    sch = reference_schedule(gemm(M, N, K, in_dtype="float16", acc_dtype="float16"))
    a = rng.uniform(-1.0, 1.0, (M, K)).astype("float16")
    b = rng.uniform(-1.0, 1.0, (K, N)).astype("float16")
    *_, out = pocl.run(sch, a, b, np.full((M, N), np.nan, "float16"))
    acc = np.zeros((M, N), np.float16)
    for k in range(K):
        step = np.outer(a[:, k].astype(np.float32), b[k].astype(np.float32))
        acc = (acc.astype(np.float32) + step).astype(np.float16)
    np.testing.assert_array_equal(out.view(np.uint16), acc.view(np.uint16))


def test_bfloat16_as_ml_dtypes_or_bits(rng):
    a = rng.standard_normal(1024).astype(ml_dtypes.bfloat16)
    expected = (a.astype(np.float32) * 3).astype(ml_dtypes.bfloat16)
    _, out = pocl.run(bf16_scale, a, np.zeros(1024, ml_dtypes.bfloat16))
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))
    _, bits = pocl.run(bf16_scale, a.view(np.uint16), np.zeros(1024, np.uint16))
    np.testing.assert_array_equal(bits, expected.view(np.uint16))


def test_time_is_positive(rng):
    func = reference_schedule(gemm(64, 64, 32)).mod
    a = rng.standard_normal((64, 32)).astype("float32")
    b = rng.standard_normal((32, 64)).astype("float32")
    seconds = pocl.time(func, a, b, np.zeros((64, 64), "float32"), repeat=3)
    assert isinstance(seconds, float) and seconds > 0


@pytest.mark.parametrize(
    "args, found",
    [
        (((64, 32), (32, 64)), "takes 3 arguments; found 2"),
        (((64, 32), (32, 64), (64, 63)), r"expects shape C: float32\[64, 64\]; found \(64, 63\)"),
        (((64, 32), (32, 64), (64, 64, 1)), "expects 2 dimensions"),
    ],
)
def test_mismatched_arguments(args, found):
    kernel = pocl.compile(reference_schedule(gemm(64, 64, 32)).mod)
    with pytest.raises(pocl.ArgumentError, match=found):
        kernel.run(*(np.zeros(shape, "float32") for shape in args))


def test_mismatched_dtype_and_symbolic_extent():
    kernel = pocl.compile(reference_schedule(gemm(64, 64, 32)).mod)
    with pytest.raises(pocl.ArgumentError, match="expects dtype float32; found float64"):
        kernel.run(np.zeros((64, 32)), np.zeros((32, 64), "float32"), np.zeros((64, 64), "float32"))
    with pytest.raises(pocl.ArgumentError, match="symbolic extent m is 6 .* set it to 5"):
        pocl.run(two_kernels, np.zeros((5, 64), "float32"), np.zeros((6, 64), "float32"), 1)


def test_a_lost_oclgrind_log_is_an_error(tmp_path, monkeypatch):
    # A check must not pass on reports it never read: a log shorter than where the run began
    # (truncated by another Oclgrind context), a missing one, or none at all.
    from tvm_streamk.pocl import device

    log = tmp_path / "oclgrind.log"
    log.write_text("Invalid read of size 4\n")
    monkeypatch.setenv("OCLGRIND_LOG", str(log))
    assert device.oclgrind_reports(0) == "Invalid read of size 4\n"
    assert device.oclgrind_reports(log.stat().st_size) == ""
    with pytest.raises(pocl.PoclError, match="holds 23 bytes, fewer than the 100"):
        device.oclgrind_reports(100)
    monkeypatch.setenv("OCLGRIND_LOG", str(tmp_path / "missing.log"))
    with pytest.raises(pocl.PoclError, match="does not exist"):
        device.oclgrind_reports(0)
    monkeypatch.delenv("OCLGRIND_LOG")
    with pytest.raises(pocl.PoclError, match="OCLGRIND_LOG is not set"):
        device.oclgrind_reports(0)


def test_compute_units():
    assert pocl.compute_units() >= 1


def test_an_unknown_executor_name_lists_the_known_ones():
    # As a user meets it: the variable set in the environment of a fresh process.
    done = subprocess.run(
        [sys.executable, "-c", "from tvm_streamk import pocl; pocl.current()"],
        capture_output=True,
        text=True,
        env={**os.environ, pocl.device.ENV_EXECUTOR: "bogus"},
        timeout=120,
    )
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert "'bogus' names no OpenCL CPU executor" in message, done.stderr
    for executor in pocl.executors():
        assert executor.key in message
    assert "Install" not in message  # nothing to install: the name is wrong

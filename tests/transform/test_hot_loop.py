"""A Stream-K kernel's K loop is as lean as the data-parallel kernel's (issue 31, item 8).

The case is the issue's: dlight's fp32 schedule (``gpu.Matmul`` under A100: tiles of 32 x 64,
a per-thread tile of two-lane vectors, 16-deep K panels) of a GEMM of three tiles. A merge that
holds a call TVM does not vectorise (the atomic add, OpenCL's bit cast of a workspace partial)
once made TVM keep the whole register accumulator a scalar array (``float acc[16]`` updated
through ``vload2``/``vstore2`` in the K loop, where data-parallel has ``float2 acc[8]``), and
pip's PoCL ran every Stream-K and split-K kernel 1.7-2.2x slower per tile, even with nothing
split (:meth:`tvm_streamk.transform.fixup.Fixup.partial_merge`).

Three checks: the accumulator's declaration in the generated OpenCL source is
data-parallel's, and the kernels compute the product (default suite); the times on pip's PoCL
(``slow``); the K loop's instructions per FMA in the SASS nvcc compiles, within 15% of
data-parallel's on sm_80 and sm_90 (``ptxas``).
"""

import functools
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule

import tvm_streamk
from tests.helpers import A100, FP32_TOL, SIZINGS, SM_TARGETS
from tests.kernels import dlight_gemm, dynamic_m_matmul, matmul_reference
from tvm_streamk import pocl, ptxas, workloads
from tvm_streamk.analysis import blocks_under, first_site
from tvm_streamk.pocl.lowering import lower

# dlight's fp32 tile under A100 is 32 x 64: three tiles. K = 256 is 16 panels per tile, enough
# for every case below to split (or not) as named; the timings take the K.
M, N, K = 96, 64, 256
TIMED_K = 16384
CASES = {
    # One whole tile per block: nothing is split, no merge.
    "stream_k-unsplit": {"policy": "stream_k", "num_sms": 3},
    # Three tiles on two blocks: the middle tile is split.
    "stream_k-split": {"policy": "stream_k", "num_sms": 2},
    # The aligned form: every tile split in two.
    "split_k": {"policy": "split_k", "splits": 2, "num_sms": 3},
}
FIXUPS = ("atomic", "workspace")
PARAMS = [pytest.param(case, fixup, id=f"{case}-{fixup}") for case in CASES for fixup in FIXUPS]


def _schedule(m=M, k=K, target=A100) -> tuple[Schedule, str]:
    return dlight_gemm(m, N, k, target)


def _stream_k(case: str, fixup: str, m=M, k=K, target=A100) -> Schedule:
    sch, block = _schedule(m, k, target)
    plan = tvm_streamk.stream_k(
        sch, block, target=target, blocks_per_sm=1, fixup=fixup, **CASES[case]
    )
    assert bool(plan.split_tiles) == (case != "stream_k-unsplit"), plan
    return sch


def _opencl(sch: Schedule, pipeline: str) -> str:
    return lower("main", sch.mod["main"], pipeline).source


def _cuda(sch: Schedule, target, pipeline: str) -> str:
    lib = tvm.compile(sch.mod, target=target, tir_pipeline=pipeline)
    return lib.mod.imports[0].inspect_source()


def _accumulator(source: str, name: str) -> list[tuple[str, str]]:
    """``(element type, length)`` of every declaration of register array ``name``."""
    pattern = rf"^\s*(?:alignas\(\d+\) )?(\w+) {name}_ptr\[(\d+)\];"
    return re.findall(pattern, source, re.MULTILINE)


# -- structure ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case, fixup", PARAMS)
def test_accumulator_keeps_data_parallel_vectors(case, fixup):
    # OpenCL only: nvcc keeps a scalarised register array in registers, so CUDA merges read
    # the accumulator directly (memory_model staged_partial_reads); a staged copy there cost
    # up to 24 registers (ptxas suite). The SASS test below holds CUDA's K loop.
    sch, _ = _schedule()
    name = first_site(sch.mod["main"]).accumulator.name

    def source(sch, pipeline):
        return _opencl(sch, pipeline)

    expected = _accumulator(source(sch, "default"), name)
    assert expected and expected[0][0] in ("float2", "float4"), expected
    found = _accumulator(source(_stream_k(case, fixup), "tvm_streamk"), name)
    assert found == expected, f"{case} ({fixup}) declares {found}; data-parallel {expected}"


def test_nothing_split_keeps_the_plain_store():
    """A plan that splits no tile neither zeroes tiles nor merges: the write-back is the
    data-parallel kernel's plain store, not a branch the pipeline folds only after
    ``VectorizeLoop`` has scalarised it."""
    sch, _ = _schedule()
    writeback = first_site(sch.mod["main"]).writebacks[0].block
    lowered = tvm_streamk.lower(_stream_k("stream_k-unsplit", "atomic"), A100)["main"]
    (block,) = [b for b in blocks_under(lowered.body) if b.name_hint == writeback.name_hint]
    assert isinstance(block.body, tvm.tirx.BufferStore), block.body
    assert "atomic" not in lowered.script()


# -- numbers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case, fixup", PARAMS)
def test_product(opencl, case, fixup):
    func = workloads.gemm(M, N, K)
    args = workloads.random_args(func)
    assert np.isnan(args[-1]).all()
    out = pocl.run(_stream_k(case, fixup).mod, *args, pipeline="tvm_streamk")[-1]
    error = workloads.relative_error(out, matmul_reference(args))
    assert error <= FP32_TOL, (case, fixup, error)


# -- time on pip's PoCL ------------------------------------------------------------------------

PIP_POCL = "pocl-3.0-rc2"
ROUNDS = 25


@pytest.mark.slow
def test_time_on_pip_pocl():
    """With ``c`` compute units and ``c + 1`` tiles, data-parallel takes two tile times and
    Stream-K on ``c`` blocks ``(c + 1) / c`` (0.75 of it on two units): under 0.9x. Stream-K on
    one block per tile splits nothing and must cost what data-parallel does: within 10%.
    Medians of interleaved rounds, each kernel timed once per round.

    The split case sits at its bound and this test fails about one run in three: on a 2-core
    Xeon, 0.82, 0.88, 0.82, 0.91 and 0.83 in runs of 9 rounds; later, with every kernel ~40%
    slower (another tenant?), 0.96, 0.88, 0.94 and 0.88 in runs of 25 rounds. Not the fix-up,
    nor two units sharing a core (one tile alone 18.5 ms, two at once 19.1 ms): pip's PoCL runs
    a K loop whose trip count is the run-time ``k_end - k_begin`` 13-15% slower per panel than
    one of constant trip count. The split kernel's OpenCL edited by hand, medians of 7-9 rounds
    against the ideal 0.75: a constant 768 panels per segment 0.97-0.98, a run-time start under
    a constant bound 0.98, the run-time bound 1.13-1.15. A constant bound with an early
    ``break`` ran at 0.91, but pip's PoCL miscompiles that form in the run-time-M split-K
    kernel (relative error 1.0 at M = 1, where Oclgrind and Debian's PoCL 3.1 compute it
    right) and TVM's constant folding divided by zero on hybrid plans, so the lowering keeps
    the run-time bound."""
    if PIP_POCL not in [e.key for e in pocl.usable_executors()]:
        pytest.fail(f"pip's PoCL ({PIP_POCL}) is not usable here", pytrace=False)
    with pocl.use(PIP_POCL):
        units = pocl.compute_units()
        tiles = units + 1
        m = 32 * tiles
        dp_sch, _ = _schedule(m, TIMED_K)
        kernels = {"data_parallel": pocl.compile(dp_sch.mod)}
        for label, sms in (("one_tile_per_block", tiles), ("one_block_per_unit", units)):
            sch, block = _schedule(m, TIMED_K)
            plan = tvm_streamk.stream_k(
                sch, block, policy="stream_k", num_sms=sms, target=A100, blocks_per_sm=1
            )
            assert bool(plan.split_tiles) == (sms != tiles), plan
            kernels[label] = pocl.compile(sch.mod, pipeline="tvm_streamk")
        args = workloads.random_args(workloads.gemm(m, N, TIMED_K))
        for kernel in kernels.values():
            kernel.time(*args, repeat=1, warmup=1)
        samples = {label: [] for label in kernels}
        for _ in range(ROUNDS):
            for label, kernel in kernels.items():
                samples[label].append(kernel.time(*args, repeat=1, warmup=0))
    median = {label: statistics.median(s) for label, s in samples.items()}
    ratio = {label: median[label] / median["data_parallel"] for label in median}
    # Shown with -s: the figures the closing notes quote.
    print({label: f"{median[label] * 1e3:.1f} ms ({ratio[label]:.2f}x)" for label in median})
    assert ratio["one_tile_per_block"] <= 1.10, (units, median)
    assert ratio["one_block_per_unit"] < 0.90, (units, median)


# -- SASS ------------------------------------------------------------------------------------


def _disassembler() -> str | None:
    """cuobjdump: on PATH, or from pip's ``nvidia-cuda-cuobjdump``."""
    found = shutil.which("cuobjdump")
    spec = importlib.util.find_spec("nvidia")
    if found is None and spec is not None:
        candidates = [p for r in spec.submodule_search_locations for p in Path(r).glob("*/bin/*")]
        found = next((str(p) for p in sorted(candidates) if p.name == "cuobjdump"), None)
    return found


def _sass(source: str, arch: str) -> str:
    tool = _disassembler()
    # cuobjdump runs nvdisasm, which pip's nvidia-cuda-nvdisasm puts beside it.
    env = {**os.environ, "PATH": f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    with tempfile.TemporaryDirectory(prefix="tvm_streamk_sass_") as tmp:
        cu, cubin = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
        cu.write_text(source)
        subprocess.run(
            ["nvcc", "-cubin", f"-arch={arch}", str(cu), "-o", str(cubin)],
            capture_output=True,
            check=True,
        )
        done = subprocess.run(
            [tool, "-sass", str(cubin)], capture_output=True, text=True, check=True, env=env
        )
    return done.stdout


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*)")


def _k_loop(sass: str) -> tuple[int, int]:
    """``(instructions, FMAs)`` of the K loop: of the loops (a backward branch and what it
    jumps over) the one with the most FMAs, the innermost among equals. Each kernel of the
    module is searched on its own: every function's addresses start at 0, so a range of one
    kernel's addresses would also take in another's instructions (a fix-up's prologue kernel)."""
    loops = []
    for function in re.split(r"^\s*Function : ", sass, flags=re.MULTILINE)[1:]:
        instructions = []
        for line in function.splitlines():
            if m := _INSTRUCTION.search(line):
                instructions.append((int(m[1], 16), m[2], m[3]))
        for address, op, operands in instructions:
            target = re.search(r"0x([0-9a-f]+)", operands) if op.startswith("BRA") else None
            if target and int(target[1], 16) <= address:
                body = [o for a, o, _ in instructions if int(target[1], 16) <= a <= address]
                loops.append((sum(o.startswith("FFMA") for o in body), -len(body)))
    fmas, negative_size = max(loops)
    return -negative_size, fmas


@functools.cache
def _data_parallel_k_loop(arch: str) -> tuple[int, int]:
    target = tvm.target.Target(SM_TARGETS[arch])
    sch, _ = _schedule(k=TIMED_K, target=target)
    return _k_loop(_sass(_cuda(sch, target, "default"), str(target.attrs["arch"])))


@pytest.mark.ptxas
@pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH")
@pytest.mark.skipif(
    _disassembler() is None, reason="no cuobjdump (pip install nvidia-cuda-cuobjdump)"
)
@pytest.mark.parametrize("arch", sorted(SM_TARGETS))
@pytest.mark.parametrize("case, fixup", PARAMS)
def test_k_loop_sass(arch, case, fixup):
    """Instructions per FMA, not per iteration: nvcc may unroll a loop of run-time bounds
    differently, and a lost unrolling shows as more instructions per FMA."""
    target = tvm.target.Target(SM_TARGETS[arch])
    dp_size, dp_fmas = _data_parallel_k_loop(arch)
    sch = _stream_k(case, fixup, k=TIMED_K, target=target)
    size, fmas = _k_loop(_sass(_cuda(sch, target, "tvm_streamk"), str(target.attrs["arch"])))
    assert dp_fmas and fmas, (dp_fmas, fmas)
    assert size / fmas <= 1.15 * dp_size / dp_fmas, (arch, (size, fmas), (dp_size, dp_fmas))


def _dynamic_m(target, k: int, policy=None, fixup=None, blocks_per_sm=None) -> Schedule:
    """dlight's schedule of a matmul of a run-time M (as a Relax model of a symbolic sequence
    length gets it), with a decision when ``policy`` is given."""
    sch, block = dynamic_m_matmul(target, k)
    if policy is not None:
        tvm_streamk.stream_k(
            sch, block, target=target, policy=policy, fixup=fixup, blocks_per_sm=blocks_per_sm
        )
    return sch


def _dynamic_cases():
    # GPT-2's fc_proj (K = 3072, 192 panels), measured on the H200; 64 and 256 panels (K = 1024,
    # 4096: Llama's hidden size), where the tile index is a shift and nvcc kept the staging
    # offsets until CancelStagingOffsets cancelled them in TIR (sm_90, workspace: 1.45
    # instructions per FMA against 1.25, 84 LDS against 36; then 1.29, and 1.41 since the walk
    # reads its range back once a unit, in 56 registers: lower_stream_k's walk). The atomic
    # kernel's zeroing prologue kernel is searched apart from it (_k_loop).
    for fixup, k in (
        ("workspace", 3072),
        ("workspace", 1024),
        ("workspace", 4096),
        ("atomic", 3072),
    ):
        for arch in sorted(SM_TARGETS):
            # The grid of ptxas's count, and the default one estimated from the IR (6 blocks of
            # 128 threads on sm_80): the panels' addresses differ with the grid. On sm_80 with a
            # power-of-two panel count the ptxas-sized workspace kernel, 80 registers and an
            # 8 B stack left to itself, was built declaring 8 blocks, and its K loop recomputed
            # the A and B panels' global addresses (1.49 instructions per FMA against 1.25:
            # LEA, IMAD.WIDE, IADD3 the data-parallel loop hoists); with the walk's range read
            # back once a unit it takes 80 registers clean and is not declared.
            for name, sizing in SIZINGS.items():
                case_id = f"{arch}-{fixup}-{k}-{name}"
                yield pytest.param(arch, fixup, k, sizing, id=case_id)


@pytest.mark.ptxas
@pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH")
@pytest.mark.skipif(
    _disassembler() is None, reason="no cuobjdump (pip install nvidia-cuda-cuobjdump)"
)
@pytest.mark.parametrize("arch, fixup, k, sizing", list(_dynamic_cases()))
def test_dynamic_m_k_loop_sass(arch, fixup, k, sizing):
    """A run-time M: the block's range is divided by the run-time grid, which TVM's
    StmtSimplify inlined into every use, so the K loop recomputed 64-bit divisions (sm_90,
    K = 3072, workspace: 1.63 instructions per FMA against 1.25; on the H200 Nsight Compute
    counted 495 M instructions against 380 M). The range is read back through a register now
    (:func:`tvm_streamk.transform._ir.over_units`)."""
    target = tvm.target.Target(SM_TARGETS[arch])
    arch_name = str(target.attrs["arch"])
    dp = _dynamic_m(target, k)
    dp_size, dp_fmas = _k_loop(_sass(_cuda(dp, target, "default"), arch_name))
    sch = _dynamic_m(target, k, "stream_k", fixup, sizing)
    size, fmas = _k_loop(_sass(_cuda(sch, target, "tvm_streamk"), arch_name))
    assert dp_fmas and fmas, (dp_fmas, fmas)
    assert size / fmas <= 1.15 * dp_size / dp_fmas, (arch, (size, fmas), (dp_size, dp_fmas))

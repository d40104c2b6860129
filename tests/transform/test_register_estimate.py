"""The default grid, sized from an IR estimate of registers, fits the kernel ptxas builds.

``stream_k`` sizes the persistent grid without nvcc by default
(:mod:`tvm_streamk.register_estimate`): the estimate must never give more resident blocks
than the kernel built from the decision holds, or the last blocks would run in a second wave.
Each schedule source of the ptxas suite and each convolution and contraction site of the dlight
rules, on sm_80 and sm_90, is decided with the default, built, and read by ptxas. What the
estimate gives up is bounded too: at least half of the data-parallel kernel's resident blocks
by ptxas's count (measured: a quarter fewer on average; the reference schedule, 40 registers
by ptxas against a bound of 80, holds 3 blocks of 256 threads where ptxas allows 6).
"""

import functools
import math

import pytest
import tvm

import tvm_streamk
from tests.contraction_cases import CONTRACTION_CASES
from tests.conv_cases import CONV_CASES, CONV_EPILOGUE_CASES
from tests.dlight_sites import matmul_site
from tests.helpers import SM_COUNTS, SM_TARGETS
from tests.kernels import budget_schedule
from tvm_streamk import ptxas, register_estimate, resources, workloads
from tvm_streamk.analysis import first_site
from tvm_streamk.decision import record

pytestmark = [
    pytest.mark.ptxas,
    pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH"),
]

SOURCES = ["reference", "dlight", "meta_schedule", "implicit_gemm", "dlight_wmma"]
SITES = [*CONV_CASES, *CONV_EPILOGUE_CASES, *CONTRACTION_CASES]


@functools.cache
def _site_func(family: str):
    cases = {**CONV_CASES, **CONV_EPILOGUE_CASES}
    if family in cases:
        return workloads.conv(**cases[family])
    spec, sizes = CONTRACTION_CASES[family]
    return workloads.contraction(spec, **sizes)


def _schedule(kind: str, arch: str):
    if kind in SOURCES:
        return budget_schedule(kind, arch)
    return matmul_site(_site_func(kind))


def _decision(kind: str) -> dict:
    # Tensor-core fragments take the aligned split only; the others the default policy.
    return {"policy": "split_k", "splits": 2} if kind == "dlight_wmma" else {}


@pytest.mark.parametrize("arch", list(SM_TARGETS))
@pytest.mark.parametrize("kind", SOURCES + SITES)
def test_the_estimated_grid_fits_the_built_kernel(kind, arch):
    target = tvm.target.Target(SM_TARGETS[arch])
    sch, block = _schedule(kind, arch)
    dp = resources.kernel_uses(sch.mod, target, "tvm_streamk")
    tvm_streamk.stream_k(sch, block, target=target, num_sms=SM_COUNTS[arch], **_decision(kind))
    site = first_site(sch.mod["main"])
    planned = record.decode(site.block.annotations, site.block.name_hint).blocks_per_sm
    built = resources.kernel_uses(sch.mod, target, "tvm_streamk")
    arch_name = str(target.attrs["arch"])
    _, held = resources.fewest_blocks(built, arch_name)
    assert held.blocks >= planned, (planned, held, built)
    _, dp_held = resources.fewest_blocks(dp, arch_name)
    assert 2 * planned >= dp_held.blocks, (planned, dp_held, dp)


def test_the_estimate_reads_buffers_and_divisions():
    sch = workloads.reference_schedule(workloads.gemm(256, 256, 256), bm=64, bn=64, bk=16)
    (use,) = [
        register_estimate.ir_use(f)
        for f in register_estimate.lowered_prefix(sch.mod).functions.values()
    ]
    # 16 x 16 threads of a 4 x 4 accumulator; A and B panels of 64 x 16 floats in shared.
    assert (use.threads, use.local_words, use.fragment_words) == (256, 16, 0)
    assert use.shared == 2 * 64 * 16 * 4
    expected = register_estimate.BASE + 16 + use.divisions / 4
    assert use.registers == math.ceil(expected / 8) * 8

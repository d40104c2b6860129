"""The persistent grid is sized by the built kernel's resident blocks per SM (issue 12, item 1).

The occupancy maths is checked against the cases measured with ptxas when the issue was filed;
``blocks_per_sm="ptxas"`` against what ptxas reports for the kernel it builds; the default (an
estimate from the IR, no nvcc: issue 31, item 5) in
``tests/transform/test_register_estimate.py`` and by the last test here.
"""

import re

import pytest
import tvm

import tvm_streamk
from tests.helpers import A100, H100
from tests.kernels import dlight_matmul
from tvm_streamk import occupancy, ptxas, register_estimate, resources, workloads
from tvm_streamk.analysis import blocks_under, first_site
from tvm_streamk.decision import record as annotations
from tvm_streamk.dlight import StreamKMatmul

needs_nvcc = pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH")
BUILT = re.compile(r"resident block\(s\)/SM (declared by|of) the built kernel")


@pytest.mark.parametrize(
    "threads, registers, shared, blocks, limiter",
    [
        (256, 64, 16384, 4, "registers"),  # the reference 64x64 schedule, as the issue measured
        (128, 56, 0, 9, "registers"),  # dlight fp32
        (128, 64, 0, 8, "registers"),
        (512, 102, 73728, 1, "registers"),  # dlight WMMA
        (1024, 16, 0, 2, "threads"),
        (32, 16, 0, 32, "blocks"),
        (256, 32, 100 * 1024, 2, "shared"),
        (256, 32, 228 * 1024, 0, "shared"),
    ],
)
def test_resident_blocks_on_sm_90(threads, registers, shared, blocks, limiter):
    found = occupancy.resident_blocks("sm_90a", threads, registers, shared)
    assert (found.blocks, found.limiter) == (blocks, limiter), found.by_limit


def test_archs_differ_and_unknown_ones_are_named():
    assert occupancy.resident_blocks("sm_86", 256, 32).blocks == 6  # 48 warps per SM
    assert occupancy.resident_blocks("sm_80", 256, 32).blocks == 8
    with pytest.raises(KeyError, match="sm_61"):
        occupancy.arch_limits("sm_61")


def _recorded_blocks_per_sm(func) -> int:
    site = first_site(func)
    return annotations.decode(site.block.annotations, site.block.name_hint).blocks_per_sm


@needs_nvcc
@pytest.mark.parametrize("M, N, K", [(4096, 4096, 4096), (2048, 1000, 4096)])
def test_dlight_fp32_on_h100_fills_the_sms_it_can(M, N, K):
    rule = StreamKMatmul(policy="stream_k")
    func = dlight_matmul(M, K, N, rule, H100)
    assert rule.skipped == {}, rule.skipped
    _, built = resources.resident_blocks(tvm.IRModule({"main": func}), H100, "tvm_streamk")
    grid_blocks_per_sm = _recorded_blocks_per_sm(func)
    # The acceptance of issue 12: at least 0.75 x 132 x the built kernel's resident blocks.
    assert grid_blocks_per_sm >= 0.75 * built.blocks > 1, (grid_blocks_per_sm, built)


@needs_nvcc
def test_the_primitive_plans_for_the_built_kernel():
    sch = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=16)
    plan = sch.stream_k("C_update", target=A100, fixup="workspace", blocks_per_sm="ptxas")
    _, built = resources.resident_blocks(sch.mod, A100, "tvm_streamk")
    assert plan.blocks_per_sm == built.blocks and plan.grid == 108 * built.blocks
    assert BUILT.search(plan.reason), plan.reason


def test_an_explicit_blocks_per_sm_wins():
    sch = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=16)
    plan = sch.stream_k("C_update", target=A100, blocks_per_sm=3, fixup="workspace")
    assert plan.grid == 108 * 3 and "resident" not in plan.reason


def test_without_a_cuda_target_one_block_per_sm_and_why():
    sch = workloads.reference_schedule(workloads.gemm(256, 256, 256))
    plan = sch.stream_k("C_update", num_sms=4, target=tvm.target.Target({"kind": "opencl"}))
    assert plan.blocks_per_sm == 1 and "one block per compute unit on opencl" in plan.reason


def test_without_nvcc_ptxas_counts_one_block_per_sm_and_why(monkeypatch):
    monkeypatch.setattr(ptxas, "available", lambda: False)
    sch = workloads.reference_schedule(workloads.gemm(256, 256, 256))
    plan = tvm_streamk.stream_k(sch, "C_update", target=H100, blocks_per_sm="ptxas")
    assert plan.blocks_per_sm == 1 and "no nvcc" in plan.reason


def test_the_default_estimates_the_occupancy_without_nvcc(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("nvcc ran at schedule time")

    monkeypatch.setattr(ptxas.subprocess, "run", refuse)
    ptxas.clear_cache()
    sch = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=16)
    plan = tvm_streamk.stream_k(sch, "C_update", target=H100, fixup="workspace")
    # 256 threads, 16 accumulators, no gathers or vectorised loops: at most 48 registers, 5
    # blocks per SM (ptxas counts 40 and allows 6).
    assert plan.blocks_per_sm == 5 and plan.grid == 132 * 5
    assert "5 resident block(s)/SM estimated from the IR (<= 48 registers" in plan.reason


def test_an_ir_the_estimate_cannot_read_gets_one_block_per_sm_and_why(monkeypatch):
    def fail(*args, **kwargs):
        raise tvm.error.InternalError("Check failed: (!used) is false: an unusual kernel")

    monkeypatch.setattr(register_estimate, "lowered_prefix", fail)
    sch = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=16)
    plan = tvm_streamk.stream_k(sch, "C_update", target=H100, fixup="workspace")
    assert plan.blocks_per_sm == 1 and plan.grid == 132
    assert "1 block/SM (the kernel's IR could not be read: Check failed: (!used)" in plan.reason


@pytest.mark.parametrize("bad", [0, -1, 1.5, "nvcc", True])
def test_a_bad_blocks_per_sm_is_named(bad):
    sch = workloads.reference_schedule(workloads.gemm(256, 256, 256))
    with pytest.raises(tvm_streamk.StreamKError, match="blocks_per_sm") as err:
        tvm_streamk.stream_k(sch, "C_update", target=H100, blocks_per_sm=bad)
    assert "'ptxas'" in str(err.value)


@needs_nvcc
def test_explain_reports_the_built_kernels_occupancy():
    sch = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=16)
    plan = sch.stream_k("C_update", target=A100, fixup="workspace", blocks_per_sm="ptxas")
    report = tvm_streamk.explain(sch, target=A100, print_=False)
    kernel, dp = report.occupancy["kernel"], report.occupancy["data_parallel"]
    assert kernel.blocks == plan.blocks_per_sm and report.baseline.blocks_per_sm == dp.blocks
    assert f"occupancy built kernel {kernel.blocks} block(s)/SM resident" in str(report)


@needs_nvcc
def test_deciding_compiles_each_kernel_once(monkeypatch):
    calls = []
    run = ptxas.subprocess.run
    monkeypatch.setattr(ptxas.subprocess, "run", lambda *a, **k: calls.append(a) or run(*a, **k))
    ptxas.clear_cache()
    sch = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=16)
    plan = sch.stream_k("C_update", target=A100, fixup="workspace", blocks_per_sm="ptxas")
    assert BUILT.search(plan.reason), plan.reason
    # The data-parallel kernel, and the Stream-K kernel because 16 more registers would cost
    # it a block per SM (64 registers x 256 threads: 4 blocks, 80: 3).
    assert len(calls) == 2
    again = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=16)
    assert again.stream_k("C_update", target=A100, fixup="workspace", blocks_per_sm="ptxas") == plan
    assert len(calls) == 2, "the same sources are read from the cache"


def test_the_register_headroom_is_declared_where_it_costs_no_block(monkeypatch):
    from tvm_streamk import schedule

    seen = []

    def resident(mod, target, pipeline="default", registers=None):
        seen.append(registers)
        # Shared memory limits this kernel to 2 blocks whatever its registers.
        return "main_kernel", occupancy.resident_blocks("sm_80", 128, 64, 80 * 1024)

    monkeypatch.setattr(resources, "resident_blocks", resident)
    dp = occupancy.resident_blocks("sm_80", 128, 64, 80 * 1024)
    built, declared = schedule._stream_k_occupancy(lambda d: None, None, A100, dp, 64)
    assert built.blocks == 2 and not declared
    assert seen == [64 + schedule.REGISTER_HEADROOM, 64]


def _declaring(monkeypatch, written: int, spills: int = 0):
    """The primitive's decision where registers decide: the data-parallel kernel at 64
    registers (256 threads, 4 blocks/SM), the Stream-K kernel as written at ``written``, and
    declaring 4 blocks at 64 with ``spills`` bytes of spills; and the kernels nvcc built."""
    from tvm_streamk import schedule

    built = []

    def uses(mod, target, pipeline="default"):
        decisions = [
            annotations.decode(b.annotations, b.name_hint)
            for f in mod.functions.values()
            for b in blocks_under(f.body)
            if annotations.has_decision(b.annotations)
        ]
        if not decisions:
            built.append("data-parallel")
            return {"main_kernel": resources.KernelUse(256, 64, 0, 0)}
        if decisions[0].declares_occupancy:
            built.append("declared")
            return {"main_kernel": resources.KernelUse(256, 64, 0, spills)}
        built.append("as written")
        return {"main_kernel": resources.KernelUse(256, written, 0, 0)}

    def resident(mod, target, pipeline="default", registers=None):
        return "main_kernel", occupancy.resident_blocks("sm_80", 256, registers, 0)

    monkeypatch.setattr(ptxas, "available", lambda: True)
    monkeypatch.setattr(resources, "kernel_uses", uses)
    monkeypatch.setattr(resources, "resident_blocks", resident)
    sch = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=16)
    plan = schedule.stream_k(sch, "C_update", target=A100, fixup="workspace", blocks_per_sm="ptxas")
    site = first_site(sch.mod["main"])
    decision = annotations.decode(site.block.annotations, site.block.name_hint)
    return plan, decision, built


def test_a_kernel_within_the_budget_is_not_declared(monkeypatch):
    plan, decision, built = _declaring(monkeypatch, written=80)
    # 80 registers x 256 threads: 3 blocks, within data-parallel's 64 + 16.
    assert built == ["data-parallel", "as written"]
    assert not decision.declares_occupancy and plan.blocks_per_sm == 3
    assert "3 resident block(s)/SM of the built kernel" in plan.reason


def test_a_kernel_over_the_budget_declares_the_data_parallel_count(monkeypatch):
    plan, decision, built = _declaring(monkeypatch, written=96)
    assert built == ["data-parallel", "as written", "declared"]
    assert decision.declares_occupancy and plan.blocks_per_sm == 4 and plan.grid == 4 * 108
    assert "4 resident block(s)/SM declared by the built kernel" in plan.reason


def test_a_kernel_that_spills_to_meet_it_is_built_as_written(monkeypatch):
    plan, decision, built = _declaring(monkeypatch, written=96, spills=8)
    assert built == ["data-parallel", "as written", "declared"]
    assert not decision.declares_occupancy and plan.blocks_per_sm == 2


@needs_nvcc
def test_an_explicit_count_is_not_declared():
    sch = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=16)
    sch.stream_k("C_update", target=A100, fixup="workspace", blocks_per_sm=2)
    lib = tvm.compile(sch.mod, target=A100, tir_pipeline="tvm_streamk")
    assert "__launch_bounds__(256, " not in lib.mod.imports[0].inspect_source()


@pytest.mark.ptxas
@needs_nvcc
@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("bk", [16, 64])
def test_the_built_kernel_holds_the_planned_blocks_without_spills(fixup, bk):
    # Two occupancies (bk=16: 4 blocks per SM by registers; bk=64: four times the shared
    # memory per block), each held by the kernel as built.
    sch = workloads.reference_schedule(workloads.gemm(4256, 256, 4096), bm=64, bn=64, bk=bk)
    plan = sch.stream_k("C_update", target=A100, fixup=fixup)
    uses = resources.kernel_uses(sch.mod, A100, "tvm_streamk")
    persistent = min(uses.values(), key=lambda u: u.occupancy("sm_80").blocks)
    assert persistent.occupancy("sm_80").blocks >= plan.blocks_per_sm > 1
    assert persistent.spills == 0

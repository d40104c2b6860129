"""dlight's GPU schedules of workloads, and the Stream-K checks the conv and contraction tests use.

A workload is scheduled the way a TVM user's model is on GPU: ``dl.ApplyDefaultSchedule`` under the
``nvidia/nvidia-a100`` tag. dlight's ``gpu.Matmul`` normalises it to
``C[S, I, J] += A[S, I, K] * B[S, J, K]`` and tiles that GEMM 32 (I) x 64 (J) per block in
16-deep K panels (fp32). Stream-K's site is found from the IR (``first_site``), not from names.

Tolerance: fp32 accumulation of at most ~110 products of values in [-1, 1] stays within 1e-5 of
float64, relative to the largest output (``max|out - ref| / max|ref|``).
"""

from math import prod

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir import dlight as dl

import tvm_streamk
from tvm_streamk import pocl, workloads
from tvm_streamk.analysis import first_site
from tvm_streamk.dlight import Decisions, StreamKMatmul
from tvm_streamk.relax_pipeline import schedule_rules

from .helpers import block_idx_extents

A100 = tvm.target.Target("nvidia/nvidia-a100")
FP32_TOL = 1e-5
FIXUPS = ("atomic", "workspace")
# Grids of a few SMs, one block each, so every policy but data-parallel really splits K panels
# between blocks on the case shapes (each test asserts it did).
DECISIONS = {
    "stream_k": {"policy": "stream_k", "num_sms": 3},
    "split_k": {"policy": "split_k", "splits": 3, "num_sms": 3},
    "hybrid": {"policy": "hybrid", "num_sms": 3},
    "data_parallel": {"policy": "data_parallel", "num_sms": 5},
}
# The rules, in order, that a Relax model's kernels get on GPU (as mlc-llm lists them).
DEFAULT_RULES = (
    dl.gpu.Matmul,
    dl.gpu.GEMV,
    dl.gpu.LowBatchGEMV,
    dl.gpu.Reduction,
    dl.gpu.GeneralReduction,
    dl.gpu.Fallback,
)


def schedule_with(func: tvm.tirx.PrimFunc, *rules) -> tuple[tvm.tirx.PrimFunc, str | None]:
    """``func`` after ``ApplyDefaultSchedule(*rules)`` under A100, and the name of the first rule
    that scheduled it alone (None when none did)."""
    taken = None
    for rule in rules:
        with A100:
            alone = dl.ApplyDefaultSchedule(rule())(tvm.IRModule({"main": func}))["main"]
        if alone.attrs is not None and "tirx.is_scheduled" in alone.attrs:
            taken = rule.__name__
            break
    with A100:
        scheduled = dl.ApplyDefaultSchedule(*(r() for r in rules))(tvm.IRModule({"main": func}))
    return scheduled["main"], taken


def pipeline_route(func: tvm.tirx.PrimFunc, **knobs) -> tuple[str | None, Decisions]:
    """The first of ``relax_pipeline``'s rules (in its order, ``knobs`` for the project's) that
    schedules ``func`` under A100, and the record of decisions the project's rules share."""
    rule = StreamKMatmul(**knobs)
    with A100:
        for candidate in schedule_rules(rule):
            if candidate.apply(func, A100, False) is not None:
                return type(candidate).__name__, rule.decisions
    return None, rule.decisions


def matmul_site(func: tvm.tirx.PrimFunc, rules=(dl.gpu.Matmul,)) -> tuple[Schedule, str]:
    """The schedule dlight writes for ``func`` and its Stream-K block.

    Raises AssertionError when ``gpu.Matmul`` does not take ``func`` or Stream-K finds no site.
    """
    scheduled, taken = schedule_with(func, *rules)
    assert taken == "Matmul", f"dlight's gpu.Matmul does not take it; {taken} does"
    site = first_site(scheduled)
    assert site is not None, "first_site finds no Stream-K site in dlight's Matmul schedule"
    return Schedule(scheduled), site.block.name_hint


def check_numeric(func, reference, policy: str, fixup: str, schedule=matmul_site) -> None:
    """Stream-K ``policy`` with ``fixup`` on ``schedule(func)`` (a schedule and its reduction
    block; dlight's by default), run on the current PoCL with the output poisoned, matches the
    float64 ``reference(args)``."""
    sch, block = schedule(func)
    plan = tvm_streamk.stream_k(
        sch, block, target=A100, blocks_per_sm=1, fixup=fixup, **DECISIONS[policy]
    )
    if policy == "data_parallel":
        assert plan.grid == plan.tiles and not plan.split_tiles
    else:
        assert plan.split_tiles, f"{plan} splits no tile: the case does not exercise {policy}"
    args = workloads.random_args(func)
    assert np.isnan(args[-1]).all()
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    error = workloads.relative_error(out, reference(args))
    assert error <= FP32_TOL, (policy, fixup, plan, error)


def check_persistent(func) -> None:
    """dlight's tile grid is replaced by persistent ``blockIdx.x`` loops of the plan's grid."""
    sch, block = matmul_site(func)
    tile_grid = block_idx_extents(sch.mod)
    plan = tvm_streamk.stream_k(
        sch, block, target=A100, blocks_per_sm=1, fixup="atomic", **DECISIONS["stream_k"]
    )
    assert prod(extent for _, extent in tile_grid) == plan.tiles
    assert plan.split_tiles and plan.grid < plan.tiles
    lowered = tvm_streamk.lower(sch, A100)
    # The zero prologue of the split tiles, then the Stream-K kernel.
    assert block_idx_extents(lowered) == [("blockIdx.x", plan.grid)] * 2


def decision_matrix(families, fast):
    """``pytest.param(family, policy, fixup)`` for every family, policy and fix-up; the
    combinations ``fast(family, policy, fixup)`` rejects are marked slow."""
    for family in families:
        for policy in DECISIONS:
            for fixup in FIXUPS:
                marks = () if fast(family, policy, fixup) else (pytest.mark.slow,)
                yield pytest.param(
                    family, policy, fixup, marks=marks, id=f"{family}-{policy}-{fixup}"
                )

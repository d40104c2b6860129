"""A tile of one K-panel keeps the data-parallel kernel's shared memory (issue 31, item 6).

dlight's ``gpu.Matmul`` (its padded SIMT schedule; fp32, and fp16 under the H100 tag) folds a
panel loop of extent 1 (K <= 16) out of its shared-memory staging indices but keeps it in the
reduction's. The persistent nest shifts that loop by the segment's first panel, ``max(lo -
tile * P, 0)``: always 0 when P = 1, but through the narrowing casts of a Relax matmul's int64
ranges TVM could not prove it, and sized the staging buffers over every panel it might start
at, a bound that grows with the tiles a block walks. Before the fix, lowered for the H100 tag:
fp32 on three blocks 31,488 bytes for 71 x 69 x 9, 209,664 for 300 x 300 x 9 and 2,102,016 for
1000 x 1000 x 9, against 6,912 data-parallel; fp16 on 132 SMs (the issue's case) 18,816 for
71 x 69 x 9 against 3,456. Two or more panels (K = 17, 33) kept the data-parallel sizes: the
staging indices then move with the panel loop. Oclgrind (32 KB of local memory) refused such a
kernel, PoCL (512 KB) the largest one.

The sizes are read from the device functions the ``tvm_streamk`` pipeline lowers (no nvcc);
PoCL and Oclgrind run kernels with the output poisoned and compare them with float64 numpy
(fp32 accumulation of 9 products, within 1e-5 of the largest output); ptxas compares shared
memory and registers with the data-parallel kernel on sm_80 and sm_90.

The reference schedule's hybrids of one K-panel (the knob fuzz's find: every one stopped in
TVM's FlattenBuffer) are run against float64 and held to the data-parallel budget too.
"""

import functools
import math

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.s_tir import Schedule

import tvm_streamk
from tests.helpers import EXTRA_REGISTERS, EXTRA_SHARED, FP32_TOL, H100, SM_TARGETS
from tests.kernels import dlight_matmul, matmul_reference
from tvm_streamk import pocl, ptxas, resources, workloads
from tvm_streamk._compat import dlight, get_tir_pipeline, split_host_device_mods
from tvm_streamk.analysis import first_site
from tvm_streamk.pocl import oclgrind

SHAPES = [(71, 69, 9), (300, 300, 9), (1000, 1000, 9)]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]
# Grids of a few SMs, one block each, so that every block walks several tiles; and the issue's
# fp16 case, Stream-K on the H100's 132 SMs.
DECISIONS = [
    {"policy": "stream_k", "fixup": "atomic", "num_sms": 3},
    {"policy": "stream_k", "fixup": "workspace", "num_sms": 3},
    {"policy": "hybrid", "variant": "two_tile", "fixup": "atomic", "num_sms": 5},
    {"policy": "stream_k", "fixup": "workspace", "num_sms": 132, "dtype": "float16"},
]
DECISION_IDS = ["-".join(map(str, d.values())) for d in DECISIONS]


def _scheduled(m: int, n: int, k: int, target=H100, dtype="float32", **decision) -> Schedule:
    """dlight's schedule under ``target`` of the Relax matmul ``a[m, k] @ b[k, n]``, with
    ``decision`` recorded on it."""
    func = dlight_matmul(m, k, n, dlight.gpu.Matmul(), target, dtype)
    sch = Schedule(func.with_attr("global_symbol", "main"))
    block = first_site(sch.mod["main"]).block.name_hint
    plan = tvm_streamk.stream_k(sch, block, target=target, blocks_per_sm=1, **decision)
    assert plan.panels == math.ceil(k / 16), plan
    return sch


def _shared_bytes(mod: tvm.IRModule) -> int:
    """Bytes of shared memory the device functions of ``mod`` allocate, lowered for the H100
    tag through the ``tvm_streamk`` pipeline (the most any one kernel takes)."""
    pipeline, _, _ = get_tir_pipeline("tvm_streamk")
    lowered = pipeline(tvm.tirx.transform.BindTarget(H100.with_host("llvm"))(mod))
    _, device_mods = split_host_device_mods(lowered)
    per_kernel = [0]

    def on_alloc(node) -> None:
        buf = node.buffer
        if buf.scope().startswith("shared"):
            elems = math.prod(int(d) for d in buf.shape)
            per_kernel[-1] += elems * tvm.DataType(buf.dtype).bits // 8

    for device_mod in device_mods.values():
        for func in device_mod.functions.values():
            per_kernel.append(0)
            tvm_ffi.structural_walk(func.body, (tvm.tirx.AllocBuffer, on_alloc))
    return max(per_kernel)


@functools.cache
def _data_parallel_shared(shape: tuple, dtype: str) -> int:
    return _shared_bytes(_scheduled(*shape, dtype=dtype, policy="data_parallel", num_sms=3).mod)


@pytest.mark.parametrize("decision", DECISIONS, ids=DECISION_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_shared_memory_stays_at_data_parallel(shape, decision):
    dtype = decision.get("dtype", "float32")
    expected = _data_parallel_shared(shape, dtype)
    # The staging of one 32 x 16 panel of a and one 64 x 16 of b, rows padded to 18.
    assert expected == 96 * 18 * tvm.DataType(dtype).bits // 8, expected
    assert _shared_bytes(_scheduled(*shape, **decision).mod) <= expected


@pytest.mark.usefixtures("opencl")
@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("shape", SHAPES[:2], ids=SHAPE_IDS[:2])
def test_one_panel_tiles_match_float64(shape, fixup):
    sch = _scheduled(*shape, policy="stream_k", fixup=fixup, num_sms=3)
    args = workloads.random_args(sch.mod["main"])
    assert np.isnan(args[-1]).all()
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    assert workloads.relative_error(out, matmul_reference(args)) <= FP32_TOL


@pytest.mark.oclgrind
@pytest.mark.usefixtures("oclgrind")
@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_one_panel_kernel_under_oclgrind(fixup):
    # 4 x 2 tiles on three blocks: 37,632 bytes of local memory before the fix, past Oclgrind's
    # 32 KB.
    sch = _scheduled(100, 69, 9, policy="stream_k", fixup=fixup, num_sms=3)
    args = workloads.random_args(sch.mod["main"])
    assert np.isnan(args[-1]).all()
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    assert workloads.relative_error(result.outputs[-1], matmul_reference(args)) <= FP32_TOL


@pytest.mark.ptxas
@pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH")
@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("arch", sorted(SM_TARGETS))
def test_ptxas_sees_the_data_parallel_resources(arch, fixup):
    target = tvm.target.Target(SM_TARGETS[arch])
    shape = SHAPES[1]

    def heaviest(**decision) -> resources.KernelUse:
        mod = _scheduled(*shape, target=target, **decision).mod
        uses = resources.kernel_uses(mod, target, "tvm_streamk").values()
        assert all(use.spills == 0 for use in uses), uses
        return max(uses, key=lambda use: (use.shared, use.registers))

    data_parallel = heaviest(policy="data_parallel", num_sms=3)
    stream_k = heaviest(policy="stream_k", fixup=fixup, num_sms=3)
    assert stream_k.shared <= data_parallel.shared, (stream_k, data_parallel)
    assert stream_k.registers <= data_parallel.registers + EXTRA_REGISTERS, (
        stream_k,
        data_parallel,
    )


# The reference schedule's tiles of one K-panel (K <= bk), under a hybrid: each unit's range is
# read back inside the unit loop, and the knob fuzz found every such kernel stopped in TVM's
# FlattenBuffer ("Divide by zero", the staging offsets' difference of two column remainders of
# the tile). Its coordinates are read back as symbols now (transform/lower_stream_k.py).
ONE_PANEL_HYBRIDS = [
    ((103, 133, 1), {"policy": "hybrid", "variant": "two_tile", "num_sms": 5}),
    ((40, 40, 4), {"policy": "hybrid", "variant": "one_tile", "num_sms": 3}),
    ((103, 133, 3), {"policy": "hybrid", "variant": "one_tile", "num_sms": 1}),
    ((40, 40, 4), {"policy": "hybrid", "batch_invariant": True, "num_sms": 3}),
]


def _reference_one_panel(shape, decision, target) -> Schedule:
    sch = workloads.reference_schedule(workloads.gemm(*shape), bm=8, bn=8, bk=4, tm=2, tn=2)
    plan = tvm_streamk.stream_k(sch, "C_update", target=target, blocks_per_sm=1, **decision)
    assert plan.panels == 1 and plan.policy == "hybrid", plan
    return sch


@pytest.mark.usefixtures("opencl")
@pytest.mark.parametrize("shape, decision", ONE_PANEL_HYBRIDS)
def test_hybrids_of_one_panel_match_float64(shape, decision):
    sch = _reference_one_panel(shape, decision, "opencl")
    args = workloads.random_args(sch.mod["main"])
    assert np.isnan(args[-1]).all()
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    assert workloads.relative_error(out, matmul_reference(args)) <= FP32_TOL


@pytest.mark.ptxas
@pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", sorted(SM_TARGETS))
def test_hybrids_of_one_panel_within_the_data_parallel_budget(arch):
    target = tvm.target.Target(SM_TARGETS[arch])

    def heaviest(sch) -> resources.KernelUse:
        uses = resources.kernel_uses(sch.mod, target, "tvm_streamk").values()
        assert all(use.spills == 0 for use in uses), uses
        return max(uses, key=lambda use: use.registers)

    for shape, decision in ONE_PANEL_HYBRIDS:
        dp = workloads.reference_schedule(workloads.gemm(*shape), bm=8, bn=8, bk=4, tm=2, tn=2)
        found, base = heaviest(_reference_one_panel(shape, decision, target)), heaviest(dp)
        assert found.registers <= base.registers + EXTRA_REGISTERS, (shape, decision, found, base)
        # A padded panel (K < bk): the persistent kernels stage the schedule's whole panel
        # (Stream-K too: 128 bytes against 96 at K = 1), within test_ptxas.py's margin.
        assert found.shared <= base.shared + EXTRA_SHARED, (shape, decision, found, base)

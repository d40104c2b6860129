"""A reduction over several axes is split as one K-panel loop, never over its outermost loop.

The kernel is the shape of an implicit-GEMM convolution whose reduction loops stay unfused:
``C[i, j] = sum_{r, k} A[i, r, k] * B[r, k, j]`` with the ``r`` loop (a filter tap, 3) around
the K-panel loop of ``k`` (5 panels of 8). Stream-K must walk 3 x 5 = 15 panels per tile.
"""

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule, Trace
from tvm.script import tirx as T

import tvm_streamk
from tests.helpers import OPENCL
from tvm_streamk import pocl, workloads
from tvm_streamk.errors import StreamKError

M, N, R, K = 96, 64, 3, 40


# fmt: off
@T.prim_func(s_tir=True)
def two_axis_gemm(A: T.Buffer((M, R, K), "float32"), B: T.Buffer((R, K, N), "float32"),
                  C: T.Buffer((M, N), "float32")):
    for i, j, r, k in T.grid(M, N, R, K):
        with T.sblock("C"):
            vi, vj, vr, vk = T.axis.remap("SSRR", [i, j, r, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vr, vk] * B[vr, vk, vj]
# fmt: on


def _schedule(bm=32, bn=32, bk=8, tm=4, tn=4) -> Schedule:
    """The reference schedule's nest with the ``r`` loop kept around the K-panel loop."""
    sch = Schedule(two_axis_gemm)
    blk = sch.get_sblock("C")
    i, j, r, k = sch.get_loops(blk)
    bi, ti, ii = sch.split(i, [None, bm // tm, tm])
    bj, tj, jj = sch.split(j, [None, bn // tn, tn])
    ko, ki = sch.split(k, [None, bk])
    sch.reorder(bi, bj, ti, tj, r, ko, ki, ii, jj)
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    acc = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(acc, tj)
    for idx in (0, 1):
        cr = sch.cache_read(blk, idx, "shared")
        sch.compute_at(cr, ko)
        fused = sch.fuse(*sch.get_loops(cr)[6:])
        _, ty, tx = sch.split(fused, [None, bm // tm, bn // tn])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
    return sch


def _reference(args):
    a, b = (np.asarray(x, dtype=np.float64) for x in args[:2])
    return np.einsum("irk,rkj->ij", a, b)


def test_the_primitive_fuses_the_reduction_loops_into_one_panel_loop():
    sch = _schedule()
    plan = tvm_streamk.stream_k(sch, "C", num_sms=4, target=OPENCL)
    assert (plan.tiles, plan.panels) == (6, R * K // 8)
    # The trace fuses the r and k_0 loops, then decomposes the reduction at the fused loop.
    steps = [line for line in str(sch.trace).split("sch.annotate")[0].splitlines() if line.strip()]
    assert "sch.fuse(" in steps[-2] and "sch.decompose_reduction(" in steps[-1]
    # The trace replays to the same kernel.
    replayed = Schedule(two_axis_gemm)
    Trace.apply_json_to_schedule(tvm.ir.load_json(tvm.ir.save_json(sch.trace.as_json())), replayed)
    tvm.ir.assert_structural_equal(replayed.mod, sch.mod)


@pytest.mark.usefixtures("opencl")
@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("policy", [{"policy": "stream_k"}, {"policy": "split_k", "splits": 4}])
def test_split_across_the_axes_is_correct_on_pocl(fixup, policy):
    sch = _schedule()
    plan = tvm_streamk.stream_k(sch, "C", num_sms=4, fixup=fixup, target=OPENCL, **policy)
    # Every split cuts the 15 panels somewhere inside a filter tap.
    assert plan.split_tiles
    args = workloads.random_args(sch.mod["main"])
    assert np.isnan(args[-1]).all()
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    assert workloads.relative_error(out, _reference(args)) <= 1e-5


def test_a_decision_on_the_unfused_loops_is_refused_at_lowering():
    sch = _schedule()
    sch.decompose_reduction(sch.get_sblock("C"), sch.get_loops(sch.get_sblock("C"))[4])
    block = sch.get_sblock("C_update")
    # A decision written by hand, without the primitive's fuse.
    for key, value in (
        tvm_streamk.decision.Decision(
            policy="stream_k",
            variant=None,
            num_sms=4,
            blocks_per_sm=1,
            splits=1,
            fixup="atomic",
            group=0,
        )
        .as_annotations()
        .items()
    ):
        sch.annotate(block, key, value)
    with pytest.raises(StreamKError) as info:
        tvm_streamk.lower(sch, OPENCL)
    assert info.value.condition == "panel-loop"
    assert "['r', 'k_0']" in str(info.value) and "sch.fuse" in str(info.value)

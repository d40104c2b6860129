"""One failing fixture per applicability condition of ``stream_k``."""

import pytest
import tvm
from tvm.script import tirx as T

import tvm_streamk
from tests.helpers import OPENCL
from tvm_streamk import analysis, workloads
from tvm_streamk.errors import StreamKError


def _expect(condition: str, sch, block="C_update", **kwargs):
    kwargs.setdefault("num_sms", 4)
    kwargs.setdefault("target", OPENCL)
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(sch, block, **kwargs)
    err = info.value
    assert err.condition == condition
    assert f"[{condition}]" in str(err)
    assert isinstance(err, tvm.s_tir.ScheduleError)
    return err


def test_refuses_a_block_without_a_tile_band():
    sch = tvm.s_tir.Schedule(workloads.gemm(64, 64, 64))
    err = _expect(analysis.COND_BAND, sch, block="C")
    assert "blockIdx" in str(err)


def test_refuses_a_tile_band_below_a_serial_loop():
    sch = tvm.s_tir.Schedule(workloads.gemm(64, 64, 64))
    i, _, _ = sch.get_loops(sch.get_sblock("C"))
    _, inner = sch.split(i, [2, None])
    sch.bind(inner, "blockIdx.x")
    err = _expect(analysis.COND_BAND, sch, block="C")
    assert "outside the blockIdx loops" in str(err)


# fmt: off
@T.prim_func(s_tir=True)
def max_reduction(A: T.Buffer((64, 64), "float32"), B: T.Buffer((64, 64), "float32"),
                  C: T.Buffer((64, 64), "float32")):
    for i, j, k in T.grid(64, 64, 64):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(-3.0e38)
            C[vi, vj] = T.max(C[vi, vj], A[vi, vk] * B[vk, vj])


@T.prim_func(s_tir=True)
def symbolic_k(a: T.handle, b: T.handle, c: T.handle):
    K = T.int32()
    A = T.match_buffer(a, (64, K), "float32")
    B = T.match_buffer(b, (K, 64), "float32")
    C = T.match_buffer(c, (64, 64), "float32")
    for i, j, k in T.grid(64, 64, K):
        with T.sblock("C"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]
# fmt: on


def test_refuses_a_non_add_reduction():
    sch = workloads.reference_schedule(max_reduction)
    err = _expect(analysis.COND_REDUCTION, sch)
    assert "associative Add" in str(err)


def test_refuses_a_symbolic_panel_count():
    sch = workloads.reference_schedule(symbolic_k)
    err = _expect(analysis.COND_PANEL, sch)
    assert "compile-time panel count" in str(err)


def _thread_tiled(sch):
    """8x8-thread tiles of GEMM block "C" on a blockIdx band, K split in panels of 8; no staging.

    Returns the block, the inner thread loop and the panel loop.
    """
    blk = sch.get_sblock("C")
    i, j, k = sch.get_loops(blk)
    bi, ti = sch.split(i, [None, 8])
    bj, tj = sch.split(j, [None, 8])
    ko, ki = sch.split(k, [None, 8])
    sch.reorder(bi, bj, ti, tj, ko, ki)
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    return blk, tj, ko


def test_refuses_an_accumulator_in_global_memory():
    sch = tvm.s_tir.Schedule(workloads.gemm(64, 64, 64))
    blk, tj, ko = _thread_tiled(sch)
    sch.decompose_reduction(blk, ko)
    err = _expect(analysis.COND_ACCUMULATOR, sch)
    assert "'global'" in str(err)


def test_refuses_an_accumulator_dtype_without_atomics():
    sch = workloads.reference_schedule(
        workloads.gemm(64, 64, 64, in_dtype="float16", acc_dtype="float16")
    )
    err = _expect(analysis.COND_ATOMIC, sch, fixup="atomic")
    assert "float16" in str(err) and "workspace" in str(err)


def test_refuses_a_fused_epilogue_with_atomics():
    sch = workloads.reference_schedule(
        workloads.gemm(64, 64, 64, epilogue="bias_relu", out_dtype="float16")
    )
    err = _expect(analysis.COND_EPILOGUE, sch, fixup="atomic")
    assert "epilogue" in str(err)


def test_asks_for_num_sms_when_the_gpu_is_unknown():
    # A concrete policy defers the count to the compile target (tests/decision/test_target_sms.py);
    # the heuristic needs it to choose.
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64))
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(sch, "C_update", policy="heuristic", target=OPENCL)
    assert "num_sms" in str(info.value)
    # On the OpenCL (PoCL) target the remedy names the device's compute units.
    assert "tvm_streamk.pocl.compute_units()" in str(info.value)


def test_a_malformed_decision_is_a_stream_k_error_at_lowering():
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64))
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=OPENCL)
    sch.unannotate(sch.get_sblock("C_update"), "tvm_streamk.group")
    with pytest.raises(StreamKError) as info:
        tvm_streamk.lower(sch, OPENCL)
    assert info.value.condition == "decision"  # a StreamKError through TVM's FFI
    assert "partial Stream-K decision" in str(info.value)


def test_a_refused_call_leaves_the_schedule_unchanged():
    # A tiled kernel whose reduction still has T.init: an accepted call decomposes it first.
    sch = tvm.s_tir.Schedule(workloads.gemm(64, 64, 64, epilogue="bias_relu", out_dtype="float16"))
    blk, tj, _ = _thread_tiled(sch)
    sch.set_scope(blk, 0, "local")
    sch.reverse_compute_at(sch.get_sblock("D"), tj)
    assert sch.get(blk).init is not None
    before, steps = sch.mod, len(sch.trace.insts)
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(sch, blk, num_sms=4, fixup="atomic", target=OPENCL)
    assert info.value.condition == analysis.COND_EPILOGUE
    tvm.ir.assert_structural_equal(sch.mod, before)
    assert len(sch.trace.insts) == steps
    # The same kernel is accepted with the workspace fix-up, and then decomposed.
    tvm_streamk.stream_k(sch, blk, num_sms=4, target=OPENCL)
    assert sch.get(blk).init is None


def test_a_wrong_block_name_is_one_line_naming_the_reduction_blocks():
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64))
    err = _expect(analysis.COND_BLOCK, sch, block="C_updat")
    assert str(err).count("\n") == 0
    assert "'C_updat'" in str(err) and "['C_update']" in str(err)


def test_the_block_is_analysed_in_its_own_function():
    # Two functions, each with a "C_update" block: the SBlockRV of the second one is analysed
    # there (it used to be the first function holding a block of that name).
    small = workloads.reference_schedule(workloads.gemm(64, 64, 64)).mod["main"]
    large = workloads.reference_schedule(workloads.gemm(128, 96, 64)).mod["main"]
    sch = tvm.s_tir.Schedule(tvm.IRModule({"small": small, "large": large}))
    block = sch.get_sblock("C_update", func_name="large")
    plan = tvm_streamk.stream_k(sch, block, num_sms=4, target=OPENCL)
    assert plan.tiles == (128 // 32) * (96 // 32)
    annotated = [
        gv.name_hint
        for gv, func in sch.mod.functions.items()
        if tvm_streamk.transform.lower_stream_k.annotated_blocks(func)
    ]
    assert annotated == ["large"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"policy": "split_k", "splits": 9, "num_sms": 4},  # 8 panels cannot be split in 9
        {"policy": "split_k", "num_sms": 4},  # split-K without its splits
        {"policy": "stream_k", "target": "nvidia/nvidia-h100", "num_sms": 0},
        {"policy": "hybrid", "num_sms": "device"},
    ],
    ids=["splits-domain", "no-splits", "zero-sms", "device-hybrid"],
)
def test_a_refusal_says_each_thing_once(kwargs):
    """What was expected, what was found and what to do, each once: no message wraps another
    one's "found" in its own, nor ends in a filler remedy."""
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64))
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(sch, "C_update", **kwargs)
    message = str(info.value)
    assert message.count("found") == 1, message
    assert "Fix the" not in message and not message.rstrip().endswith("found 0."), message
    assert any(word in message for word in ("Pass", "pass", "Use", "use", "Drop")), message

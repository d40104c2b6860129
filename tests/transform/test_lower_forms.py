"""Expected IR of every lowering form, as TVM's own transform tests pin theirs.

One small GEMM (64x48x24, 32x16 tiles of 8-wide K panels: 2 x 3 tiles, 3 panels) lowered by
``LowerStreamK`` for OpenCL in each form; the TVMScript the installed TVM prints is compared
with the reviewed text under ``tests/expected_ir/`` (text, because TVM 0.27 prints one-element
register buffers as ``name.source[0]``, which its parser does not read back). Each check also
replays the schedule's trace through JSON and requires the same IR. The forms:

- ``stream_k_atomic``: tests/transform/test_lower_structural.py (parsed, structural equality);
- ``stream_k_workspace``: 4 blocks over 18 iterations; two slots per block, threads innermost;
  the last arriver sums 1..3 peers from the first block of the tile's first iteration;
- ``hybrid_one_tile``: 2 Stream-K tiles (6 iterations over 4 blocks) then one data-parallel
  unit per block (tile 2 + block), both kinds of unit in one loop over one copy of the tile
  body, each unit's range read back through a register;
- ``split_k_aligned``: 3 splits of 3 panels, the split in ``blockIdx.z``, one slot per block;
- ``split_k_unaligned``: 2 splits of 3 panels through the persistent nest, atomics;
- ``run_time_grid``: the grid read from the device (at most 18 blocks), read back in each
  kernel through a one-element register buffer;
- ``fragment_split``: dlight's WMMA schedule of a 128x128x128 fp16 GEMM for CUDA (one tile, two
  64-wide K panels, a ``wmma.accumulator`` fragment staged through shared memory), 2 splits: the
  split in ``blockIdx.z``, one slot per block, one arrival counter, the write-back's four
  vectorised lanes innermost in the slot; the last arriver sums both slots in peer order, each
  thread's four lanes as one 64-bit ``__ldcg`` word, before the vectorised write-back;
- ``implicit_gemm_conv``: the project's implicit-GEMM schedule of a 6x6x4 -> 8 3x3 convolution
  (NHWC, padding 1) with bias + ReLU: I = 36 in 3 tiles of 16, K = 36 in 5 panels of 8, 2
  blocks, the workspace fix-up; each panel of the input gathered into shared memory with the
  padding computed there, the epilogue in both the direct and the last arriver's write-back.

When the lowering changes on purpose, print the new IR, review the difference, and replace the
file; never regenerate without reading it.
"""

import difflib

import pytest
import tvm
from tvm.s_tir import Schedule, Trace

import tvm_streamk
from tests.helpers import EXPECTED_IR, OPENCL
from tests.kernels import FRAGMENT_TARGETS, dlight_fp16_matmul, fragment_update_block
from tvm_streamk import workloads

EXPECTED = EXPECTED_IR
FUNC = workloads.gemm(64, 48, 24)

FORMS = {
    "stream_k_workspace": dict(policy="stream_k", fixup="workspace", num_sms=4),
    "hybrid_one_tile": dict(policy="hybrid", variant="one_tile", fixup="atomic", num_sms=4),
    "split_k_aligned": dict(policy="split_k", splits=3, fixup="workspace", num_sms=4),
    "split_k_unaligned": dict(policy="split_k", splits=2, fixup="atomic", num_sms=4),
    "run_time_grid": dict(policy="stream_k", fixup="atomic", num_sms="device"),
    "run_time_grid_workspace": dict(policy="stream_k", fixup="workspace", num_sms="device"),
}


def _schedule() -> Schedule:
    return workloads.reference_schedule(FUNC, bm=32, bn=16, bk=8, tm=4, tn=4)


def _printed(sch: Schedule, target: tvm.target.Target) -> str:
    return tvm_streamk.lower(sch, target)["main"].without_attr("target").script()


def check_stream_k(
    expected_name: str,
    *,
    schedule=_schedule,
    func=FUNC,
    block: str = "C_update",
    target: tvm.target.Target = OPENCL,
    **decision,
) -> None:
    """The lowered IR of ``decision`` on ``schedule()`` equals
    ``expected_ir/<expected_name>.tvmscript``, and so does the IR of the schedule rebuilt from
    its trace's JSON on ``func``."""
    sch = schedule()
    tvm_streamk.stream_k(sch, block, target=target, **decision)
    found = _printed(sch, target)
    expected = (EXPECTED / f"{expected_name}.tvmscript").read_text()
    if found != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), found.splitlines(), "expected", "lowered", lineterm="", n=1
        )
        pytest.fail(f"{expected_name} differs from its expected IR:\n" + "\n".join(list(diff)[:60]))
    replayed = Schedule(func)
    Trace.apply_json_to_schedule(tvm.ir.load_json(tvm.ir.save_json(sch.trace.as_json())), replayed)
    assert _printed(replayed, target) == found, "the replayed trace lowers differently"


@pytest.mark.parametrize("form", FORMS)
def test_lowered_ir_matches_expected(form):
    check_stream_k(form, **FORMS[form])


def test_fragment_split_matches_expected():
    # dlight refuses tensor cores for an extent <= 64 and tiles 128x128 by 64-wide K panels, so
    # 128x128x128 is the smallest GEMM that keeps the fragment accumulator without padding.
    target, sms = FRAGMENT_TARGETS["sm_80"]
    func = dlight_fp16_matmul(128, 128, 128, target).mod["main"]
    # dlight's schedule is baked into ``func`` (its trace is empty), so the trace replayed onto
    # ``func`` holds only the Stream-K decision.
    check_stream_k(
        "fragment_split",
        schedule=lambda: Schedule(func),
        func=func,
        block=fragment_update_block(Schedule(func)),
        target=target,
        policy="split_k",
        splits=2,
        fixup="workspace",
        num_sms=sms,
    )


def test_implicit_gemm_conv_matches_expected():
    kwargs = dict(data_shape=(1, 6, 6, 4), weight_shape=(3, 3, 4, 8), layout="NHWC", padding=1)
    func = workloads.conv(**kwargs, epilogue="bias_relu")
    check_stream_k(
        "implicit_gemm_conv",
        schedule=lambda: workloads.implicit_gemm_schedule(func, bm=16, bn=8, bk=8, tm=2, tn=2),
        func=func,
        block="conv2d_nhwc_update",
        policy="stream_k",
        fixup="workspace",
        num_sms=2,
    )

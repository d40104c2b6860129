"""Stream-K kernels under the Oclgrind simulator: every access checked, not only the results.

Oclgrind reports out-of-bounds accesses, barrier divergence, uninitialised values reaching memory
or control flow, and data races; :func:`tvm_streamk.pocl.oclgrind.check` fails on any report
except the two documented inter-work-group hand-offs (its module docstring). The subset covers
every policy x fix-up on the reference and dlight schedules at uneven shapes (data-parallel,
split-K and the one-tile hybrid with -m slow), a MetaSchedule sample (a smaller point of
test_schedule_sources' space), GEMV, batched GEMM, a fused fp16 epilogue, and the kernels of the
project's dlight rules (StreamKGEMV, StreamKDepthwise, a grouped convolution through the group
split with a fused bias) and the project's implicit-GEMM convolution. Results are also checked
against float64 numpy (fp32 accumulation within 1e-5 relative to the largest output). Shapes
are small: the simulator runs every work-item.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule
from tvm.script import tirx as T

import tvm_streamk
from tests.helpers import (
    A100,
    FP32_TOL,
    H100,
    OPENCL,
    POLICIES,
    POLICY_IDS,
    conv_reference_for,
)
from tests.kernels import (
    MS_SMS,
    dlight_matmul,
    gemv_schedule,
    matmul_reference,
    meta_schedule_samples,
    update_block,
)
from tvm_streamk import workloads
from tvm_streamk._compat import dlight
from tvm_streamk.pocl import device, oclgrind
from tvm_streamk.pocl import lowering as pocl_lowering

pytestmark = [pytest.mark.oclgrind, pytest.mark.usefixtures("oclgrind")]

FP16_TOL = 2.0**-10 + FP32_TOL

# The default suite simulates the two policies that split tiles mid-K (every fix-up path);
# data-parallel, split-K and the one-tile hybrid run with -m slow (each case takes ~15 s).
_DEFAULT_POLICIES = {"stream_k", "hybrid-two_tile"}
POLICY_CASES = [
    pytest.param(p, id=i, marks=() if i in _DEFAULT_POLICIES else pytest.mark.slow)
    for p, i in zip(POLICIES, POLICY_IDS, strict=True)
]


def _checked(mod, func, reference=None):
    args = workloads.random_args(func)
    result = oclgrind.check(mod, *args, pipeline="tvm_streamk")
    ref = reference(args) if reference else workloads.reference(func, args)
    return workloads.relative_error(result.outputs[-1], ref), result


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("decision", POLICY_CASES)
def test_reference_schedule(decision, fixup):
    # 2 x 3 tiles of 32 x 32 (the last row and column predicated), 7 panels, on 4 blocks.
    func = workloads.gemm(45, 70, 53)
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, fixup=fixup, target=OPENCL, **decision)
    error, _ = _checked(sch.mod, func)
    assert error <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("decision", POLICY_CASES)
def test_dlight_schedule(decision, fixup):
    # dlight's 32 x 64 tiles with 16-wide panels: 2 tiles (one predicated) of 7 panels.
    func = dlight_matmul(57, 100, 44, dlight.gpu.Matmul(), A100)
    sch = Schedule(func)
    # One block per SM keeps the simulated grid small (the default sizes it by occupancy).
    tvm_streamk.stream_k(
        sch, update_block(sch), num_sms=3, blocks_per_sm=1, fixup=fixup, target=A100, **decision
    )
    error, _ = _checked(sch.mod, func, matmul_reference)
    assert error <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_run_time_grid(fixup, monkeypatch):
    # The grid read from the device (3 compute units): its register copy, the even split and the
    # peers of the workspace fix-up all evaluated on it.
    monkeypatch.setattr(pocl_lowering, "compute_units", lambda: 3)
    func = workloads.gemm(33, 64, 40)  # 2 x 2 tiles (a predicated row) of 5 panels
    sch = workloads.reference_schedule(func)
    tvm_streamk.stream_k(sch, "C_update", num_sms="device", fixup=fixup, target=OPENCL)
    error, _ = _checked(sch.mod, func)
    assert error <= FP32_TOL


# The MetaSchedule point of test_schedule_sources with the inner tiles cut to one: the same 128
# threads and 3 x 2 tiles (of 8 x 16), 4 K-panels of 8, small enough to simulate.
MS_SMALL_FUNC = workloads.gemm(24, 32, 32)
MS_SMALL_DECISIONS = ([3, 1, 8, 1, 1], [2, 1, 16, 1, 1], [4, 2, 4])


@pytest.fixture(scope="module")
def small_ms_sample():
    samples = meta_schedule_samples(MS_SMALL_FUNC, MS_SMALL_DECISIONS)
    assert 0 in samples, f"no valid sample without pipelining: {list(samples)}"
    return samples[0]


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_meta_schedule_sample(small_ms_sample, fixup):
    sch = small_ms_sample.copy()
    plan = tvm_streamk.stream_k(
        sch, update_block(sch), num_sms=MS_SMS, blocks_per_sm=1, fixup=fixup, target=H100
    )
    assert (plan.tiles, plan.panels) == (6, 4) and plan.split_tiles
    error, _ = _checked(sch.mod, MS_SMALL_FUNC)
    assert error <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_gemv(fixup):
    func, sch = gemv_schedule(70, 512)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=5, fixup=fixup, target=OPENCL)
    assert plan.split_tiles
    error, _ = _checked(sch.mod, func)
    assert error <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_batched_gemm(fixup):
    func = workloads.batched_gemm(3, 20, 40, 48)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=4, fixup=fixup, target=OPENCL)
    assert plan.split_tiles
    error, _ = _checked(sch.mod, func)
    assert error <= FP32_TOL


def test_fused_epilogue_with_fp16_output():
    func = workloads.gemm(40, 36, 48, epilogue="bias_relu", out_dtype="float16", in_dtype="float16")
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=3, fixup="workspace", target=OPENCL)
    assert plan.split_tiles
    error, result = _checked(sch.mod, func)
    assert error <= FP16_TOL
    # The hand-off reads were seen and accepted, not missed: the race detector is on.
    assert result.accepted and all("race" in r.kind for r in result.accepted)


# fmt: off
@T.prim_func(s_tir=True)
def _reads_past_its_input(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    for b in T.thread_binding(2, thread="blockIdx.x"):
        for t in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("copy"):
                v = T.axis.spatial(64, b * 32 + t)
                B[v] = A[T.min(v + 1, 64)]
# fmt: on


def test_an_out_of_bounds_read_fails():
    args = [np.ones(64, np.float32), np.full(64, np.nan, np.float32)]
    with pytest.raises(oclgrind.OclgrindReportError, match="Invalid read") as failed:
        oclgrind.check(_reads_past_its_input, *args)
    # The whole diagnostics travel with the error: the log is emptied by the next check.
    # (The out-of-bounds value then written is reported as uninitialised too.)
    texts = [r.text for r in failed.value.reports]
    assert any(t.startswith("Invalid read of size 4") and "Kernel: " in t for t in texts), texts


def test_a_report_without_a_source_line_shows_its_text():
    # A CI run failed on "1 problem(s) ... (no source line)" with nothing else to go on.
    report = oclgrind.Report("", (), (), "Oclgrind - torn\n  fragment of a report\n")
    excerpt = oclgrind._excerpt(report, "__kernel void k() {}")
    assert "a report of no kind" in excerpt
    assert "Oclgrind - torn | fragment of a report" in excerpt


_CHILD = """
import os
from tvm_streamk.pocl import device
device.with_fresh_context("oclgrind")  # Oclgrind opens its log for the new context
print(os.environ["OCLGRIND_LOG"])
"""


def _child_log(env):
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_each_process_logs_to_a_file_of_its_own(tmp_path):
    # Oclgrind truncates OCLGRIND_LOG whenever it creates a context and then writes at its own
    # offset, and the suite's xdist workers inherit the controller's environment: on one shared
    # file a check read another worker's reports or a torn fragment of one (a CI run failed on
    # "1 problem ... (no source line)"). A process started from this one, as a worker is from
    # the controller, must log elsewhere and leave this process's reports alone.
    with pytest.raises(oclgrind.OclgrindReportError, match="Invalid read"):
        oclgrind.check(_reads_past_its_input, np.ones(64, np.float32), np.zeros(64, np.float32))
    ours = Path(os.environ["OCLGRIND_LOG"])
    before = ours.read_bytes()
    assert b"Invalid read" in before
    assert _child_log(dict(os.environ)) != str(ours)
    assert ours.read_bytes() == before
    # A log the user names is theirs, inherited or not.
    user = tmp_path / "user.log"
    env = {k: v for k, v in os.environ.items() if k != device._CHOSEN_LOG}
    assert _child_log({**env, "OCLGRIND_LOG": str(user)}) == str(user)
    assert user.exists()


def test_documented_handoffs_are_the_only_accepted_reports():
    source = "\n".join(
        [
            "__inline float atomic_add_float_emu(volatile __global float* sum, float x) {",
            "  prev = *sum;",
            "} while (atomic_cmpxchg(...));",
            "}",
            "acc = sk_workspace_ptr[i];",
            "C_ptr[i] = acc;",
            "sk_workspace_ptr[j] = acc;",
        ]
    )

    def race(kind, lines, groups=("0,0,0", "1,0,0")):
        return oclgrind.Report(kind, lines, groups, "")

    assert oclgrind.is_documented_handoff(race("Read-write data race", (5, 7)), source)
    assert oclgrind.is_documented_handoff(race("Read-write data race", (2, 3)), source)
    # Write-write, a race inside one work-group, or one on the output is a defect.
    assert not oclgrind.is_documented_handoff(race("Write-write data race", (7, 7)), source)
    assert not oclgrind.is_documented_handoff(
        race("Read-write data race", (5, 7), ("1,0,0", "1,0,0")), source
    )
    assert not oclgrind.is_documented_handoff(race("Read-write data race", (5, 6)), source)
    assert not oclgrind.is_documented_handoff(race("Invalid read of size 4", (5,)), source)


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("m", [1, 37])
def test_run_time_tile_count(fixup, m):
    # One build of a dynamic-M kernel at two M: the grid computed on the host from the run-time
    # count, the counters sized for it, and the per-block buffers BoundRunTimeAllocations sized
    # (every access inside them and inside the matrices is checked).
    func = workloads.gemm("m", 40, 56)
    sch = workloads.reference_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=3, blocks_per_sm=1, fixup=fixup, policy="stream_k", target=OPENCL
    )
    args = workloads.random_args(sch.mod["main"], m=m)
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    ref = workloads.reference(sch.mod["main"], args)
    assert workloads.relative_error(result.outputs[-1], ref) <= FP32_TOL


@pytest.mark.parametrize(("fixup", "splits"), [("atomic", 3), ("workspace", 3), ("workspace", 7)])
@pytest.mark.parametrize("m", [1, 37])
def test_split_k_on_a_run_time_tile_count(fixup, splits, m):
    # Split-K's grid is the run-time count's tiles x S (7 panels: S = 7 takes the aligned nest,
    # S = 3 the walk); the workspace's slots are sized for that grid.
    func = workloads.gemm("m", 40, 56)
    sch = workloads.reference_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=3, fixup=fixup, policy="split_k", splits=splits, target=OPENCL
    )
    args = workloads.random_args(sch.mod["main"], m=m)
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    ref = workloads.reference(sch.mod["main"], args)
    assert workloads.relative_error(result.outputs[-1], ref) <= FP32_TOL


@pytest.mark.parametrize(
    ("policy", "fixup", "invariant"),
    [
        ("data_parallel", "atomic", False),
        ("stream_k", "atomic", False),
        ("stream_k", "workspace", False),
        ("data_parallel", "workspace", True),
        ("stream_k", "workspace", True),
    ],
)
def test_grouped_gemm(policy, fixup, invariant):
    # Uneven and empty groups: the group tile offsets written by the prologue kernel, searched
    # by every tile, the row guards of the views, the counters sized by the tile bound.
    counts = [9, 0, 20, 0, 3]
    func = workloads.grouped_gemm(len(counts), 24, 24)
    sch = workloads.reference_schedule(func, bm=8, bn=8, bk=8, tm=2, tn=2)
    # Batch-invariant: 3 panels, 3 chunks, every chunk of every tile a slot at the tile bound.
    tvm_streamk.stream_k(
        sch,
        "C_update",
        num_sms=3,
        blocks_per_sm=1,
        fixup=fixup,
        policy=policy,
        target=OPENCL,
        batch_invariant=invariant,
    )
    args = workloads.grouped_args(counts, 24, 24, rng=np.random.default_rng(3))
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    ref = workloads.grouped_reference(*args[:3])
    assert workloads.relative_error(result.outputs[-1], ref) <= FP32_TOL


_WRITE_THEN_READ = """
__kernel void write_then_read(__global float* scratch, __global float* out) {
  int i = get_global_id(0);
  scratch[i] = (float)i;
  out[i] = scratch[i];
}
"""


def _uninitialised_reports(executor, n):
    """Reports of a kernel that writes a never-host-written buffer before reading it."""
    import pyopencl as cl

    program = cl.Program(executor.context, _WRITE_THEN_READ).build(
        options=list(executor.build_options)
    )
    scratch, out = (cl.Buffer(executor.context, cl.mem_flags.READ_WRITE, 4 * n) for _ in "ab")
    start = device.oclgrind_log_offset()
    program.write_then_read(executor.queue, (n,), None, scratch, out)
    executor.queue.finish()
    reports = oclgrind.parse(device.oclgrind_reports(start))
    scratch.release()
    out.release()
    return reports


def test_each_check_has_its_own_shadow_memory():
    # Oclgrind 21.10 keeps a released buffer's shadow for the next buffer of its index: on one
    # context, a longer scratch after a short one reads back its own stores as uninitialised.
    # check() therefore runs on a fresh context (device.with_fresh_context).
    shared = device.with_fresh_context("oclgrind")
    assert _uninitialised_reports(shared, 4) == []
    stale = _uninitialised_reports(shared, 256)
    fresh = _uninitialised_reports(device.with_fresh_context("oclgrind"), 256)
    assert fresh == [], fresh[:2]
    # The hazard itself: if this fails, Oclgrind now drops released shadows and the fresh
    # context of check() is no longer needed.
    assert stale and all(r.kind.startswith("Uninitialized") for r in stale), stale[:2]


def _rule_scheduled(rule, func):
    with A100:
        mod = dlight.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))
    ((_, plan),) = rule.decided.items()
    assert plan.split_tiles, plan
    return mod


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_gemv_rule(fixup):
    # StreamKGEMV at batch 2: 3 column tiles of 128 (the last partial), 5 K-panels, 2 SMs.
    from tvm_streamk.dlight import StreamKGEMV

    func = workloads.gemm(2, 300, 320)
    mod = _rule_scheduled(
        StreamKGEMV(num_sms=2, blocks_per_sm=1, policy="stream_k", fixup=fixup), func
    )
    error, _ = _checked(mod, func)
    assert error <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_depthwise_rule(fixup):
    # StreamKDepthwise on a 5x5 depthwise conv: 10 tiles of 128 outputs, 2 K-panels, 3 SMs.
    from tvm_streamk.dlight import StreamKDepthwise

    kwargs = dict(data_shape=(1, 4, 17, 17), weight_shape=(4, 1, 5, 5), groups=4, padding=2)
    func = workloads.conv(layout="NCHW", **kwargs)
    rule = StreamKDepthwise(num_sms=3, blocks_per_sm=1, policy="stream_k", fixup=fixup)
    mod = _rule_scheduled(rule, func)
    error, _ = _checked(mod, func, conv_reference_for({"layout": "NCHW", **kwargs}))
    assert error <= FP32_TOL


def test_grouped_conv_with_epilogue():
    # The group split with a fused bias: 2 groups of 16 channels, 6 tiles, 3 K-panels, 4 SMs.
    from tvm_streamk.transform.group_axis import split_group_axis

    kwargs = dict(data_shape=(1, 8, 9, 9), weight_shape=(32, 4, 3, 3), groups=2, padding=1)
    kwargs.update(layout="NCHW", epilogue="bias")
    func = workloads.conv(**kwargs)
    sch = Schedule(_dlight_schedule(split_group_axis(func)))
    block = tvm_streamk.analysis.first_site(sch.mod["main"]).block.name_hint
    plan = tvm_streamk.stream_k(
        sch, block, num_sms=4, blocks_per_sm=1, policy="stream_k", fixup="workspace", target=A100
    )
    assert plan.split_tiles, plan
    error, _ = _checked(sch.mod, func, conv_reference_for(kwargs))
    assert error <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_implicit_gemm_conv(fixup):
    # The project's implicit GEMM: the padded input gathered into shared memory per K-panel.
    # I = 2*5*5 = 50 (4 tiles of 16), J = 6, K = 3*3*4 = 36 (5 panels of 8), 3 SMs; the
    # workspace case fuses bias + ReLU into the last arriver's write-back.
    kwargs = dict(data_shape=(2, 9, 9, 4), weight_shape=(3, 3, 4, 6), stride=2, padding=1)
    kwargs.update(layout="NHWC", epilogue="bias_relu" if fixup == "workspace" else None)
    func = workloads.conv(**kwargs)
    sch = workloads.implicit_gemm_schedule(func, bm=16, bn=8, bk=8, tm=2, tn=2)
    block = tvm_streamk.analysis.first_site(sch.mod["main"]).block.name_hint
    plan = tvm_streamk.stream_k(
        sch, block, num_sms=3, blocks_per_sm=1, policy="stream_k", fixup=fixup, target=A100
    )
    assert plan.split_tiles, plan
    error, _ = _checked(sch.mod, func, conv_reference_for(kwargs))
    assert error <= FP32_TOL


def _dlight_schedule(func):
    with A100:
        return dlight.ApplyDefaultSchedule(dlight.gpu.Matmul())(tvm.IRModule({"main": func}))[
            "main"
        ]


def test_dlight_vector_lanes():
    # The float16x2 accumulators of dlight's SIMT schedule for H100's sm_90a: the lanes go
    # innermost in the slots and the last arriver sums each peer's lanes as one vector load
    # before the vectorised write-back. 64 x 64 over 112: 2 unpredicated tiles of 7 panels on
    # 3 blocks.
    func = dlight_matmul(64, 112, 64, dlight.gpu.Matmul(), H100, "float16")
    sch = Schedule(func)
    plan = tvm_streamk.stream_k(
        sch, update_block(sch), num_sms=3, blocks_per_sm=1, fixup="workspace", target=OPENCL
    )
    assert plan.split_tiles, plan
    assert 'T.sblock("sk_lane_sum")' in tvm_streamk.lower(sch.mod, OPENCL)["main"].script()
    args = workloads.random_args(func)
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    a, b = (x.astype(np.float64) for x in args[:2])
    # float16 accumulation over K = 112 products and the peers' sums (gamma_K), plus the
    # output's own rounding.
    bound = (112 + 2) * 2.0**-11 * (np.abs(a) @ np.abs(b)) + 2.0**-11 * np.abs(a @ b)
    assert (np.abs(result.outputs[-1].astype(np.float64) - a @ b) <= bound).all()


@pytest.mark.parametrize("decision", [{"policy": "data_parallel"}, {"policy": "stream_k"}])
def test_batch_invariant_kernel(decision):
    """A batch-invariant kernel (issue 32): every chunk of every tile through the workspace,
    the last arriver summing the chunks in chunk order. 45 x 70 x 53: 6 tiles of 7 panels in
    4 chunks (2, 2, 2, 1 panels) on 4 blocks; data-parallel merges chunks too."""
    func = workloads.gemm(45, 70, 53)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=4, target=OPENCL, batch_invariant=True, **decision
    )
    assert plan.panels == 4
    error, _ = _checked(sch.mod, func)
    assert error <= FP32_TOL


@pytest.mark.parametrize("policy", ["data_parallel", "stream_k"])
def test_batch_invariant_kernel_on_a_run_time_tile_count(policy):
    """The knob fuzz's find: a batch-invariant data-parallel kernel of a run-time M launched a
    block per chunk (the iterations, the base policy's run-time grid) where each block walks a
    whole tile's chunks, so blocks past the tile count bumped counters and wrote workspace
    slots past their buffers (glibc's "double free or corruption" on PoCL, whose buffers share
    the host's heap). 37 x 72 x 27 in 16 x 32 x 4 tiles: 9 tiles of 7 panels in 4 chunks."""
    func = workloads.gemm("m", 72, 27)
    sch = workloads.reference_schedule(func, bm=16, bn=32, bk=4, tm=4, tn=4)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=7, target=OPENCL, policy=policy, batch_invariant=True
    )
    args = workloads.random_args(sch.mod["main"], m=37)
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    ref = workloads.reference(sch.mod["main"], args)
    assert workloads.relative_error(result.outputs[-1], ref) <= FP32_TOL


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("m", [1, 37])
def test_data_parallel_walk_where_tvm_cannot_bound_the_kernel_as_written(fixup, m):
    """A run-time M whose kernel as written TVM cannot build (A_shared sized over the whole
    M): data-parallel runs the walk, one block per tile (test_runtime_tiles.py)."""
    func = workloads.gemm("m", 40, 256)
    sch = workloads.reference_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=3, target=OPENCL, policy="data_parallel", fixup=fixup
    )
    args = workloads.random_args(sch.mod["main"], m=m)
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    ref = workloads.reference(sch.mod["main"], args)
    assert workloads.relative_error(result.outputs[-1], ref) <= FP32_TOL


@pytest.mark.parametrize("decision", [{"policy": "stream_k"}, {"policy": "split_k", "splits": 3}])
def test_separate_fixup_needs_no_documented_exception(decision):
    """The separate fix-up (issue 33) hands nothing off between work-groups of one kernel: the
    second kernel reads what the first wrote, so Oclgrind accepts no report at all."""
    func = workloads.gemm(45, 70, 53)
    sch = workloads.reference_schedule(func)
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=4, fixup="separate", target=OPENCL, **decision
    )
    assert plan.split_tiles
    error, result = _checked(sch.mod, func)
    assert error <= FP32_TOL
    assert result.accepted == ()


@pytest.mark.parametrize("m", [1, 37])
def test_separate_fixup_on_a_run_time_tile_count(m):
    # The second kernel over the run-time tile count, its peers found on the host's grid.
    func = workloads.gemm("m", 40, 56)
    sch = workloads.reference_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=3, blocks_per_sm=1, fixup="separate", target=OPENCL
    )
    args = workloads.random_args(sch.mod["main"], m=m)
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    ref = workloads.reference(sch.mod["main"], args)
    assert workloads.relative_error(result.outputs[-1], ref) <= FP32_TOL
    assert result.accepted == ()


@pytest.mark.parametrize("shape", [(1, 40), (10, 3)], ids=lambda s: "x".join(map(str, s)))
def test_ragged_k_data_parallel_walk_where_tvm_cannot_bound_the_kernel_as_written(shape):
    # One block per tile over its group's panels, read from the iteration offsets; the
    # tiles of the empty group written as zeros.
    counts = [9, 0, 30, 1, 5]
    func = workloads.grouped_weight_grad(len(counts), *shape)
    sch = workloads.reference_schedule(func, bm=8, bn=8, bk=8, tm=2, tn=2)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=3, blocks_per_sm=1, policy="data_parallel", target=OPENCL
    )
    args = workloads.grouped_weight_grad_args(counts, *shape, rng=np.random.default_rng(6))
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    ref = workloads.grouped_weight_grad_reference(*args[:3])
    assert workloads.relative_error(result.outputs[-1], ref) <= FP32_TOL
    assert result.accepted == ()


@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
def test_ragged_k_weight_gradient(fixup):
    # A grouped weight gradient (ragged K): uneven groups, an empty one (written as zeros),
    # one below a K-panel, one split across blocks; the iteration offsets written by the
    # prologue and searched by every block, the per-tile panel counts of the fix-ups.
    counts = [9, 0, 30, 1, 5]
    func = workloads.grouped_weight_grad(len(counts), 24, 40)
    sch = workloads.reference_schedule(func, bm=8, bn=8, bk=8, tm=2, tn=2)
    tvm_streamk.stream_k(
        sch, "C_update", num_sms=3, blocks_per_sm=1, fixup=fixup, policy="stream_k", target=OPENCL
    )
    args = workloads.grouped_weight_grad_args(counts, 24, 40, rng=np.random.default_rng(5))
    result = oclgrind.check(sch.mod, *args, pipeline="tvm_streamk")
    ref = workloads.grouped_weight_grad_reference(*args[:3])
    assert workloads.relative_error(result.outputs[-1], ref) <= FP32_TOL

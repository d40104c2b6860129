"""What a GPU sees of every kernel: ptxas's resources against the data-parallel kernel's.

PoCL runs kernels that a GPU would refuse or run slowly (it has no shared-memory limit and no
register file), so every policy x fix-up x schedule source is compiled here to a cubin for
sm_80 (A100) and sm_90 (H100) at realistic shapes, and its persistent kernel compared with the
data-parallel kernel of the same schedule: no spills, at most 16 registers and 1 KB of static
shared memory more. Dynamic shared memory (dlight's tensor-core schedule) is sized by the
host, not ptxas, and is the schedule's own. The run-time grid (``num_sms="device"``) is checked
at three shapes. Nothing runs: running these kernels is the GPU pack's job.

The kernels are built as users get them: the grid sized for the built kernel's resident blocks
per SM (:mod:`tvm_streamk.occupancy`). Every case is within budget since the workspace fix-up's
last arriver walks the tile's elements in rolled loops
(:meth:`~tvm_streamk.transform.fixup_workspace.WorkspaceFixup._rolled_writeback`). Unrolled, it
took 102 registers against 80 for the implicit-GEMM convolution's Stream-K and two-tile hybrid on
sm_80 (48 bytes of spills for the one-tile hybrid), 36 bytes of spills for the MetaSchedule
sample's split-K on sm_90, and 112 registers against 94 for dlight's tensor-core split-K on
sm_80 (rolled: 80, 80, none, 100). With one block per SM the reference one-tile hybrid's
workspace fix-up on sm_80 took 57 registers against 40 and the two-tile one spilled 20 bytes on
sm_90; at their occupancy grids both are within budget. The reference schedule's hybrids took
58-64 registers while their two kinds of unit had two copies of the tile body; with one copy
they take 32-48.
"""

import functools

import pytest
import tvm
from tvm.s_tir import Schedule

import tvm_streamk
from tests.helpers import EXTRA_REGISTERS, EXTRA_SHARED, SM_COUNTS, SM_TARGETS
from tests.kernels import budget_schedule, rule_funcs
from tvm_streamk import ptxas, workloads
from tvm_streamk._compat import dlight
from tvm_streamk.decomposition import chunks

pytestmark = [
    pytest.mark.ptxas,
    pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH"),
]

# The README's shape: 67 x 4 tiles of 64 x 64 (a partial last row) over 256 K-panels of 16.
M, N, K = 4256, 256, 4096

DECISIONS = [
    {"policy": "stream_k", "fixup": "atomic"},
    {"policy": "stream_k", "fixup": "workspace"},
    {"policy": "hybrid", "variant": "one_tile", "fixup": "atomic"},
    {"policy": "hybrid", "variant": "one_tile", "fixup": "workspace"},
    {"policy": "hybrid", "variant": "two_tile", "fixup": "atomic"},
    {"policy": "hybrid", "variant": "two_tile", "fixup": "workspace"},
    {"policy": "split_k", "splits": 2, "fixup": "workspace"},
    {"policy": "split_k", "splits": 3, "fixup": "atomic"},
    {"policy": "stream_k", "fixup": "separate"},
    {"policy": "hybrid", "variant": "two_tile", "fixup": "separate"},
]
# Tensor-core fragments take the aligned split-K only, merged through the workspace.
FRAGMENT_DECISIONS = [{"policy": "split_k", "splits": 2, "fixup": "workspace"}]


def _ids(decision) -> str:
    return "-".join(str(v) for v in decision.values())


def _resources(sch: Schedule, arch: str) -> ptxas.KernelResources:
    """The resources of the kernel holding the GEMM (the most registers among the kernels)."""
    target = tvm.target.Target(SM_TARGETS[arch])
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    report = ptxas.resources(lib.mod.imports[0].inspect_source(), str(target.attrs["arch"]))
    for name, kernel in report.items():
        assert kernel.spills == 0 and kernel.stack == 0, f"{name} spills on {arch}: {kernel}"
    return max(report.values(), key=lambda kernel: kernel.registers)


@functools.cache
def _data_parallel(source: str, arch: str) -> ptxas.KernelResources:
    sch, _ = budget_schedule(source, arch)
    return _resources(sch, arch)


def _check(source: str, arch: str, decision: dict, **stream_k) -> None:
    sch, block = budget_schedule(source, arch)
    kwargs = {"num_sms": SM_COUNTS[arch], **stream_k, **decision}
    tvm_streamk.stream_k(sch, block, target=tvm.target.Target(SM_TARGETS[arch]), **kwargs)
    found, dp = _resources(sch, arch), _data_parallel(source, arch)
    assert found.registers <= dp.registers + EXTRA_REGISTERS, (found, dp)
    assert found.shared <= dp.shared + EXTRA_SHARED, (found, dp)


# Measured over budget (registers found vs data-parallel; spills in bytes), each a strict xfail:
# fixing one turns it into a failure to remove from here. None today.
KNOWN: dict[str, str] = {}


def _case(source: str, arch: str, decision: dict):
    case_id = f"{source}-{arch}-{_ids(decision)}"
    reason = KNOWN.get(case_id)
    marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)] if reason else []
    return pytest.param(source, arch, decision, marks=marks, id=case_id)


CASES = [
    _case(source, arch, decision)
    for source in ("reference", "dlight", "meta_schedule", "implicit_gemm")
    for decision in DECISIONS
    for arch in SM_TARGETS
] + [_case("dlight_wmma", arch, decision) for decision in FRAGMENT_DECISIONS for arch in SM_TARGETS]


@pytest.mark.parametrize("source, arch, decision", CASES)
def test_resources_within_the_data_parallel_budget(source, arch, decision):
    _check(source, arch, decision)


# Batch invariance (issue 32): every tile merges its chunks through the workspace.
INVARIANT_DECISIONS = [{"policy": "data_parallel"}, {"policy": "stream_k"}, {"policy": "heuristic"}]


@pytest.mark.parametrize("arch", list(SM_TARGETS))
@pytest.mark.parametrize("decision", INVARIANT_DECISIONS, ids=_ids)
@pytest.mark.parametrize("source", ["reference", "dlight", "dlight_wmma"])
def test_batch_invariant_within_the_data_parallel_budget(source, decision, arch):
    _check(source, arch, decision, batch_invariant=True)


@functools.cache
def _small_tiles(k: int, arch: str, decision: tuple = ()) -> ptxas.KernelResources:
    sch = workloads.reference_schedule(workloads.gemm(37, 40, k), bm=16, bn=8, bk=4, tm=2, tn=2)
    if decision:
        target = tvm.target.Target(SM_TARGETS[arch])
        tvm_streamk.stream_k(
            sch, "C_update", num_sms=5, target=target, batch_invariant=True, **dict(decision)
        )
    return _resources(sch, arch)


@pytest.mark.parametrize("arch", list(SM_TARGETS))
@pytest.mark.parametrize(
    "decision",
    [
        *INVARIANT_DECISIONS,
        {"policy": "hybrid", "variant": "one_tile"},
        {"policy": "hybrid", "variant": "two_tile"},
    ],
    ids=_ids,
)
@pytest.mark.parametrize("k", [64, 392])
def test_batch_invariant_small_tiles_within_one_chunks_budget(k, decision, arch):
    """The reference schedule's 16 x 8 x 4 tiles (2 x 2 outputs a thread). A chunk of K = 64
    is 4 panels, a loop of constant trip count that nvcc unrolls whole, as it unrolls the
    data-parallel kernel of a 4-panel K: both 61 registers on sm_80 (63 on sm_90) against the
    43 (45) of data-parallel's 16-panel loop, and 49 with ``#pragma unroll 1`` written into
    the chunk loop. Chunks of 5 and 6 panels are unrolled too (K = 80, 96: 64 registers); of
    7 and more not (K = 112: 48; K = 392, chunks of 25: 48-53). The budget is therefore the
    data-parallel kernel whose K is one chunk's, at K = 64 above the full-K kernel's + 16 (the
    README says so) and at K = 392 the same loop as the full-K kernel's. The hybrids of these
    tiles stopped in TVM's FlattenBuffer before the chunk walk's subtraction
    (test_batch_invariance.py)."""
    panels = -(-k // 4)
    one_chunk = _small_tiles(4 * chunks.chunk_panels(panels), arch)
    found = _small_tiles(k, arch, tuple(decision.items()))
    assert found.registers <= one_chunk.registers + EXTRA_REGISTERS, (found, one_chunk)
    assert found.shared <= one_chunk.shared + EXTRA_SHARED, (found, one_chunk)


RUNTIME_SHAPES = [(448, 1216, 4096), (2048, 2048, 2048), (4256, 256, 4096)]


@pytest.mark.parametrize("arch", list(SM_TARGETS))
@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("shape", RUNTIME_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_run_time_grid_within_the_data_parallel_budget(shape, fixup, arch):
    target = tvm.target.Target(SM_TARGETS[arch])
    dp = workloads.reference_schedule(workloads.gemm(*shape))
    sch = workloads.reference_schedule(workloads.gemm(*shape))
    tvm_streamk.stream_k(sch, "C_update", num_sms="device", fixup=fixup, target=target)
    found, base = _resources(sch, arch), _resources(dp, arch)
    assert found.registers <= base.registers + EXTRA_REGISTERS, (found, base)
    assert found.shared <= base.shared + EXTRA_SHARED, (found, base)


# Each of rule_funcs()'s kernels against the rule's data-parallel kernel.
RULE_DECISIONS = [
    {"policy": "stream_k", "fixup": "atomic"},
    {"policy": "stream_k", "fixup": "workspace"},
    {"policy": "hybrid", "fixup": "workspace"},
]


def _rule_resources(kind: str, arch: str, decision: dict) -> ptxas.KernelResources:
    rule_type, func = rule_funcs()[kind]
    target = tvm.target.Target(SM_TARGETS[arch])
    rule = rule_type(num_sms=SM_COUNTS[arch], **decision)
    with target:
        mod = dlight.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))
    assert len(rule.decided) == 1, rule.skipped
    return _resources(Schedule(mod), arch)


# Measured over budget, each a strict xfail: fixing one turns it into a failure to remove from
# here. None today (the GEMV's hybrid on sm_90, 32 tiles on 132 SMs x 16 blocks, kept its unit
# bounds on an 8-byte stack until the lowering stopped walking a unit empty for every block).
RULE_KNOWN: dict[str, str] = {}


def _rule_cases():
    for kind in ("gemv", "depthwise", "grouped_conv"):
        for decision in RULE_DECISIONS:
            for arch in SM_TARGETS:
                case_id = f"{kind}-{_ids(decision)}-{arch}"
                reason = RULE_KNOWN.get(case_id)
                marks = (
                    [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)]
                    if reason
                    else []
                )
                yield pytest.param(kind, decision, arch, marks=marks, id=case_id)


@pytest.mark.parametrize("kind, decision, arch", list(_rule_cases()))
def test_rule_kernels_within_the_data_parallel_budget(kind, decision, arch):
    found = _rule_resources(kind, arch, decision)
    dp = _rule_resources(kind, arch, {"policy": "data_parallel", "fixup": "atomic"})
    assert found.registers <= dp.registers + EXTRA_REGISTERS, (found, dp)
    assert found.shared <= dp.shared + EXTRA_SHARED, (found, dp)

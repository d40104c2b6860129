"""Per-block buffers of run-time size, and when the pipeline checks TVM bounds them.

``BoundRunTimeAllocations`` gives a register or shared buffer of run-time extent its bound and
refuses one without; dynamic shared memory (where TVM merges shared buffers) keeps its size for
the launch and is refused without a bound. The ``tvm_streamk`` pipeline builds a kernel kept as
written at a run-time tile count without checking beforehand that TVM bounds it (a second buffer
compaction, 0.06 s of a transformer block's 0.6 s compile), and lowers again
with the check only when the build fails, so that such a kernel takes the persistent walk.
"""

import pytest
import tvm
from tvm.script import tirx as T

import tvm_streamk
from tests.helpers import A100
from tvm_streamk import workloads
from tvm_streamk._compat import structural_walk
from tvm_streamk.errors import StreamKError
from tvm_streamk.transform import bound_allocations


def _kernel(scope: str):
    @T.prim_func
    def kernel(a: T.handle, m: T.int64):
        A = T.match_buffer(a, (m,), "float32")
        clipped = T.alloc_buffer((T.min(m, T.int64(16)) * T.int64(8),), "float32", scope=scope)
        whole = T.alloc_buffer((m * T.int64(4),), "float32", scope=scope)
        clipped[0] = A[0]
        whole[0] = A[0]
        A[0] = clipped[0] + whole[0]

    return kernel


def _clipped_only(scope: str):
    @T.prim_func
    def kernel(a: T.handle, m: T.int64):
        A = T.match_buffer(a, (m,), "float32")
        clipped = T.alloc_buffer((T.min(m, T.int64(16)) * T.int64(8),), "float32", scope=scope)
        clipped[0] = A[0]
        A[0] = clipped[0]

    return kernel


def _extents(func) -> dict:
    found = {}

    def on_alloc(stmt) -> None:
        found[stmt.buffer.name] = [str(e) for e in stmt.buffer.ty.shape]

    structural_walk(func.body, (tvm.tirx.AllocBuffer, on_alloc))
    return found


@pytest.mark.parametrize("scope", ["shared", "local", "shared.dyn"])
def test_a_buffer_without_a_bound_is_refused_by_name(scope):
    with pytest.raises(StreamKError, match=rf"the {scope} buffer whole has the extent m \* "):
        bound_allocations.bound_allocations(_kernel(scope))


def test_static_buffers_take_their_bound_dynamic_shared_memory_keeps_its_size():
    for scope in ("shared", "local"):
        bounded = bound_allocations.bound_allocations(_clipped_only(scope))
        assert _extents(bounded) == {"clipped": ["T.int64(128)"]}, scope
    launched = bound_allocations.bound_allocations(_clipped_only("shared.dyn"))
    assert _extents(launched) == {"clipped": ["T.min(m, T.int64(16)) * T.int64(8)"]}


def _reference(tiles: dict, policy="data_parallel"):
    sch = workloads.reference_schedule(workloads.gemm("m", 2, 8), bk=4, **tiles)
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=A100, policy=policy)
    return sch


UNBOUNDED, BOUNDED = {"bm": 8, "bn": 8, "tm": 2, "tn": 2}, {"bm": 16, "bn": 16, "tm": 4, "tn": 4}


def test_the_build_checks_the_kernel_as_written_only_when_it_fails(monkeypatch):
    checked = []
    check = bound_allocations.bounded_as_written

    def counted(func):
        checked.append(func)
        return check(func)

    monkeypatch.setattr(bound_allocations, "bounded_as_written", counted)
    # A tiling TVM bounds: built once, as written, with no check beforehand.
    lib = tvm.compile(_reference(BOUNDED).mod, target=A100, tir_pipeline="tvm_streamk")
    assert checked == []
    assert "sk_segment" not in lib.mod.imports[0].inspect_source()
    # One TVM does not bound (A_shared sized m * 4): the first build fails, the second checks
    # the kernel as written and walks its tiles (test_runtime_tiles.py runs it at every M).
    lib = tvm.compile(_reference(UNBOUNDED).mod, target=A100, tir_pipeline="tvm_streamk")
    assert len(checked) == 1
    assert "sk_segment" in lib.mod.imports[0].inspect_source()


@pytest.mark.parametrize("policy,builds", [("stream_k", 1), ("data_parallel", 2)])
def test_a_failed_build_is_retried_only_with_a_kernel_left_unchecked(monkeypatch, policy, builds):
    """A failure with nothing left unchecked (a Stream-K walk) reaches the caller from the
    first build; with a kernel kept as written unchecked, the checked lowering runs and its
    failure is the one raised."""
    lowerings = []
    lower = tvm_streamk.pipeline.LowerStreamK

    def counted(**kwargs):
        lowerings.append(kwargs)
        return lower(**kwargs)

    def stop(mod):
        raise ValueError(f"build {len(lowerings)}")

    monkeypatch.setattr(tvm_streamk.pipeline, "LowerStreamK", counted)
    monkeypatch.setattr(tvm_streamk.pipeline, "CancelStagingOffsets", stop)
    with pytest.raises(Exception, match=f"build {builds}"):  # through TVM: a RuntimeError
        tvm.compile(_reference(BOUNDED, policy).mod, target=A100, tir_pipeline="tvm_streamk")
    assert len(lowerings) == builds

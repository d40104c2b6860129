"""``num_sms="device"``: one build whose grid comes from the device's multiprocessor count."""

import re

import pytest
import tvm

import tvm_streamk
from tests.helpers import H100, OPENCL
from tvm_streamk import decomposition, pocl, workloads
from tvm_streamk._compat import split_host_device_mods
from tvm_streamk.errors import StreamKError
from tvm_streamk.pocl import lowering as pocl_lowering


def _schedule(M=96, N=96, K=40, **kwargs):
    func = workloads.gemm(M, N, K)
    sch = workloads.reference_schedule(func)
    kwargs.setdefault("target", OPENCL)
    tvm_streamk.stream_k(sch, "C_update", num_sms="device", **kwargs)
    return func, sch


def test_host_reads_the_multiprocessor_count():
    _, sch = _schedule(target=H100)
    mod = tvm.tirx.transform.BindTarget(H100.with_host("llvm"))(sch.mod)
    mod = tvm.tirx.get_tir_pipeline("tvm_streamk")[0](mod)
    host, devices = split_host_device_mods(mod)
    host_text = host.script()
    assert 'T.call_packed("runtime.GetDeviceAttr", 2, dev_id, 7)' in host_text
    assert "tvm_streamk_device_sms" not in host_text
    # The persistent kernel takes the grid as an argument: nothing about it is compiled in.
    (device,) = devices.values()
    params = [p.name for f in device.functions.values() for p in f.params]
    assert "sk_grid" in params


@pytest.mark.usefixtures("opencl")
@pytest.mark.parametrize("units", [1, 3, 7])
@pytest.mark.parametrize(
    "kwargs",
    [{"fixup": "atomic"}, {"fixup": "workspace"}, {"deterministic": True}],
    ids=["atomic", "workspace", "deterministic"],
)
def test_one_build_fits_any_multiprocessor_count(units, kwargs, monkeypatch):
    func, sch = _schedule(**kwargs)
    monkeypatch.setattr(pocl_lowering, "compute_units", lambda: units)
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    # The persistent kernel reads A and B; a zero prologue (of C or of the counters) does not.
    persistent = [launch for launch in kernel.launches if len(launch.args) > 3]
    assert {launch.grid[0] for launch in persistent} == {units}
    args = workloads.random_args(func)
    out = kernel.run(*args)[-1]
    assert workloads.relative_error(out, workloads.reference(func, args)) <= 1e-5


@pytest.mark.usefixtures("opencl")
def test_the_workspace_is_sized_for_the_largest_run_time_grid(monkeypatch):
    """More compute units than the bound: the grid stops at the bound, the slots fit it."""
    func, sch = _schedule(M=64, N=64, K=8, fixup="workspace", blocks_per_sm=1)
    monkeypatch.setattr(decomposition.plans, "MAX_RUNTIME_SMS", 3)
    monkeypatch.setattr(pocl_lowering, "compute_units", lambda: 5)
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    persistent = [launch for launch in kernel.launches if len(launch.args) > 3]
    assert {launch.grid[0] for launch in persistent} == {3}
    args = workloads.random_args(func)
    out = kernel.run(*args)[-1]
    assert workloads.relative_error(out, workloads.reference(func, args)) <= 1e-5


# A declaration: `__shared__ alignas(64) float A_shared_ptr[256];` (CUDA), `__local float ...`.
ARRAY = re.compile(
    r"^\s*(?:__shared__\s+|__local\s+)?(?:alignas\(\d+\)\s+)?\w+\s+(\w+)_ptr\[(\d+)\];", re.M
)


def _arrays(mod, target) -> dict:
    """Fixed-size arrays (registers, shared memory) the device source declares, per name."""
    lib = tvm.compile(mod, target=target, tir_pipeline="tvm_streamk")
    source = lib.mod.imports[0].inspect_source()
    return {name: int(size) for name, size in ARRAY.findall(source)}


# Realistic shapes: 532 and 64 tiles of 32 x 32 (the tiny CI shape used to be the only one whose
# per-block buffers were tile-sized), and a square 2048 GEMM.
SHAPES = [(448, 1216, 4096), (256, 256, 256), (2048, 2048, 2048)]


@pytest.mark.parametrize("target", [H100, OPENCL], ids=["cuda", "opencl"])
@pytest.mark.parametrize("fixup", ["atomic", "workspace"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_per_block_buffers_are_sized_by_the_tile(shape, fixup, target):
    """The run-time grid declares the same per-block buffers as a grid fixed at compile time."""
    _, runtime = _schedule(*shape, fixup=fixup, target=target)
    fixed = workloads.reference_schedule(workloads.gemm(*shape))
    tvm_streamk.stream_k(fixed, "C_update", num_sms=132, fixup=fixup, target=target)
    found = _arrays(runtime.mod, target)
    assert found.pop("sk_num_blocks_local") == 1
    expected = _arrays(fixed.mod, target)
    if fixup == "workspace":
        # The peer record the last arriver's leader read, handed to its block beside the
        # verdict (fixup_workspace, "Peers").
        assert (found.pop("sk_peers_shared"), found.pop("sk_peers")) == (2, 2)
    assert found == expected
    tile = 32 * 32 // 64  # each of the 64 threads holds 4 x 4 accumulators
    assert found["C_local"] == tile


@pytest.mark.parametrize(
    "kwargs, found",
    [
        ({"policy": "hybrid"}, "policy='hybrid'"),
        ({"policy": "split_k", "splits": 2}, "policy='split_k'"),
    ],
)
def test_refusals(kwargs, found):
    with pytest.raises(StreamKError) as info:
        _schedule(**kwargs)
    assert info.value.condition == "num-sms"
    assert found in str(info.value)

"""``num_sms="device"``: one build whose grid comes from the device's multiprocessor count."""

import pytest
import tvm

import tvm_streamk
from tvm_streamk import pocl, workloads
from tvm_streamk._compat import split_host_device_mods
from tvm_streamk.errors import StreamKError
from tvm_streamk.pocl import lowering as pocl_lowering

OPENCL = tvm.target.Target({"kind": "opencl"})
H100 = tvm.target.Target("nvidia/nvidia-h100")


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
def test_one_build_fits_any_multiprocessor_count(units, monkeypatch):
    func, sch = _schedule()
    monkeypatch.setattr(pocl_lowering, "compute_units", lambda: units)
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    grids = {launch.grid[0] for launch in kernel.launches}
    assert grids == {units}
    args = workloads.random_args(func)
    out = kernel.run(*args)[-1]
    assert workloads.relative_error(out, workloads.reference(func, args)) <= 1e-5


@pytest.mark.parametrize(
    "kwargs, found",
    [
        ({"policy": "hybrid"}, "policy='hybrid'"),
        ({"fixup": "workspace"}, "workspace fix-up"),
        ({"deterministic": True}, "workspace fix-up"),
    ],
)
def test_refusals(kwargs, found):
    with pytest.raises(StreamKError) as info:
        _schedule(**kwargs)
    assert info.value.condition == "num-sms"
    assert found in str(info.value)

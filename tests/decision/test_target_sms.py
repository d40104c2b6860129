"""A decision made without an SM count is planned for the target the module is compiled for."""

import numpy as np
import pytest
import tvm

import tvm_streamk
from tests.helpers import OPENCL, block_idx_extents
from tvm_streamk import pocl, workloads
from tvm_streamk.decision import record as annotations
from tvm_streamk.errors import StreamKError
from tvm_streamk.explain import ExplainError
from tvm_streamk.pocl import lowering as pocl_lowering


def _scheduled(**kwargs):
    func = workloads.gemm(448, 128, 256)
    sch = workloads.reference_schedule(func)
    plan = sch.stream_k(sch.get_sblock("C_update"), **kwargs)
    return func, sch, plan


def _recorded_sms(sch) -> int:
    block = sch.get(sch.get_sblock("C_update"))
    return annotations.decode(block.annotations, "C_update").num_sms


def test_no_count_and_no_target_is_left_to_the_compile_target():
    _, sch, plan = _scheduled()
    assert _recorded_sms(sch) == annotations.TARGET_SMS
    assert plan.num_sms == 1 and "compile target" in plan.reason
    lib = tvm.compile(sch.mod, target="nvidia/nvidia-h100", tir_pipeline="tvm_streamk")
    source = lib.mod.imports[0].inspect_source()
    # 56 tiles x 32 panels over the H100's 132 SMs: block b starts at b * 1792 // 132.
    assert "((((int)blockIdx.x) * 1792) / 132)" in source


def test_the_lowering_plans_for_the_target_it_is_given():
    _, sch, _ = _scheduled(policy="stream_k", fixup="workspace")
    for tag, sms in (("nvidia/nvidia-h100", 132), ("nvidia/nvidia-a100", 108)):
        lowered = tvm_streamk.lower(sch, tvm.target.Target(tag))
        extents = dict(block_idx_extents(lowered))
        assert extents["blockIdx.x"] == sms, tag


@pytest.mark.usefixtures("opencl")
def test_an_opencl_build_takes_the_compute_units(monkeypatch):
    func, sch, _ = _scheduled(target=OPENCL, fixup="workspace")
    assert _recorded_sms(sch) == annotations.TARGET_SMS
    monkeypatch.setattr(pocl_lowering, "compute_units", lambda: 5)
    monkeypatch.setattr(pocl, "compute_units", lambda: 5)
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    persistent = [launch for launch in kernel.launches if len(launch.args) > 3]
    assert {launch.grid[0] for launch in persistent} == {5}
    args = workloads.random_args(func)
    assert np.isnan(args[-1]).all()
    out = kernel.run(*args)[-1]
    assert workloads.relative_error(out, workloads.reference(func, args)) <= 1e-5


def test_the_heuristic_needs_the_count_now():
    with pytest.raises(StreamKError) as info:
        _scheduled(policy="heuristic")
    assert info.value.condition == "num-sms"


def test_an_unknown_cuda_target_still_needs_the_count():
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    with pytest.raises(StreamKError, match="num-sms"):
        _scheduled(target=cuda)


def test_lowering_without_a_usable_target_says_what_to_pass():
    _, sch, _ = _scheduled()
    with pytest.raises(Exception, match="compile target's SM count"):
        tvm_streamk.lower(sch, tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))


def test_explain_asks_for_the_count():
    _, sch, _ = _scheduled()
    with pytest.raises(ExplainError, match="compiled for"):
        tvm_streamk.explain(sch, print_=False)
    report = tvm_streamk.explain(sch, num_sms=132, print_=False)
    assert report.stats.grid == 132

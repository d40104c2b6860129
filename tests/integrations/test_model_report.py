"""``model_report``: per-kernel FLOPs and decisions of a whole Relax model (issue 14, item 4).

A small CNN written with Relax ops has one kernel of each kind the pipeline's rules take: a
grouped convolution (``StreamKMatmul`` through the group split), a depthwise convolution
(``StreamKDepthwise``), a batch-1 fully connected layer with a K-major weight (``StreamKGEMV``),
and a max-pool no rule takes. The ONNX model zoo's report is ``tests/models/test_onnx_models.py``.
"""

import pytest
import tvm
from tvm import relax

import tvm_streamk
from tests.helpers import H100
from tvm_streamk.analysis.flops import kernel_flops
from tvm_streamk.model_report import ModelReport
from tvm_streamk.relax_pipeline import fusion_passes


def _cnn() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 28, 28), "float32"))
    w1 = relax.Var("w1", relax.TensorType((64, 16, 3, 3), "float32"))
    w2 = relax.Var("w2", relax.TensorType((64, 1, 3, 3), "float32"))
    fc = relax.Var("fc", relax.TensorType((64 * 14 * 14, 1000), "float32"))
    with bb.function("main", [x, w1, w2, fc]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w1, padding=1, groups=2))
            y = bb.emit(relax.op.nn.relu(y))
            y = bb.emit(relax.op.nn.conv2d(y, w2, padding=1, groups=64))
            y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
            y = bb.emit(relax.op.reshape(y, (1, 64 * 14 * 14)))
            out = bb.emit_output(relax.op.matmul(y, fc))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def report() -> ModelReport:
    return tvm_streamk.model_report(_cnn(), "nvidia/nvidia-h100")


def _by_rule(report: ModelReport) -> dict:
    return {k.rule: k for k in report.kernels if k.flops}


def test_each_kernel_goes_to_its_rule(report):
    rows = _by_rule(report)
    assert {"StreamKMatmul", "StreamKDepthwise", "StreamKGEMV"} <= rows.keys(), rows
    for rule in ("StreamKMatmul", "StreamKDepthwise", "StreamKGEMV"):
        assert rows[rule].decided and rows[rule].why_not is None, rows[rule]
    pool = next(k for k in report.kernels if "pool" in k.name)
    assert not pool.decided and "no Stream-K rule takes it" in pool.why_not


def test_flops_are_the_kernels_multiply_accumulates(report):
    rows = _by_rule(report)
    # Grouped conv: 64 outputs channels x 28 x 28 positions x (16 x 3 x 3) MACs, 2 FLOPs each.
    assert rows["StreamKMatmul"].flops == 2 * 64 * 28 * 28 * 16 * 9
    assert rows["StreamKDepthwise"].flops == 2 * 64 * 28 * 28 * 9
    assert rows["StreamKGEMV"].flops == 2 * 64 * 14 * 14 * 1000
    pool = next(k for k in report.kernels if "pool" in k.name)
    assert pool.flops == 64 * 14 * 14 * 4  # a max per window element: one operation
    assert report.total_flops == sum(k.flops for k in report.kernels)
    assert report.decided_share == pytest.approx(1 - pool.flops / report.total_flops)


def test_report_counts_the_pipelines_decisions():
    # What the report says is what tvm.compile with the same pipeline decides.
    mod = _cnn()
    pipeline = tvm_streamk.relax_pipeline(H100)
    tvm.compile(mod, H100, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
    report = tvm_streamk.model_report(mod, H100)
    assert len(pipeline.rule.decided) == sum(k.decided for k in report.kernels) == 3
    plans = sorted((p.policy, p.tiles, p.panels) for p in pipeline.rule.decided.values())
    assert plans == sorted(
        (k.plan.policy, k.plan.tiles, k.plan.panels) for k in report.kernels if k.plan
    )


def test_table_and_plain_data(report):
    text = str(report)
    assert text.splitlines()[0].startswith(f"{len(report.kernels)} kernels")
    assert "nvidia/nvidia-h100" in text.splitlines()[0] and "why not:" in text
    data = report.as_dict()
    assert data["decided_share"] == report.decided_share
    assert {k["rule"] for k in data["kernels"]} >= {"StreamKGEMV", "StreamKDepthwise"}


def test_symbolic_shapes_have_no_flops():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    a = relax.Var("a", relax.TensorType((n, 256), "float32"))
    b = relax.Var("b", relax.TensorType((256, 512), "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(a, b))
        bb.emit_func_output(out)
    with H100:
        fused = tvm.transform.Sequential(fusion_passes(H100))(bb.get())
    (func,) = [f for f in fused.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert kernel_flops(func) is None
    report = tvm_streamk.model_report(bb.get(), H100)
    assert report.decided_share is None and report.kernels[0].flops is None

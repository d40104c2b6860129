"""The ONNX model zoo through the Relax pipeline (issue 14, item 4): slow, needs onnx.

Each of the nine models the ``onnx`` package ships compiles for ``nvidia/nvidia-h100`` with
:func:`tvm_streamk.relax_pipeline`, and at least 95% of its FLOPs sit in kernels the project
decides on (:func:`tvm_streamk.model_report`; a data-parallel decision counts). The table of
docs/models.md comes from ``python bench/onnx_models.py``.

Install the model dependencies with ``pip install -e ".[test,models]"``; run ``pytest -m slow``.
"""

import pytest
import tvm

import tvm_streamk
from tests.helpers import H100, cuda_modules
from tvm_streamk import ptxas, workloads

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=workloads.ONNX_MODELS)
def model(request):
    pytest.importorskip("onnx", reason='install the model extras: pip install -e ".[test,models]"')
    return request.param, workloads.onnx_model(request.param)


def test_compiles_and_decides_95_percent_of_flops(model):
    name, mod = model
    report = tvm_streamk.model_report(mod, H100)
    assert report.decided_share >= 0.95, f"{name}\n{report}"
    pipeline = tvm_streamk.relax_pipeline(H100)
    lib = tvm.compile(mod, H100, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
    assert len(pipeline.rule.decided) == sum(k.decided for k in report.kernels)
    if ptxas.available():
        sources = [m.inspect_source() for m in cuda_modules(lib)]
        for text in sources:
            for kernel, used in ptxas.resources(text, "sm_90").items():
                assert used.spills == 0 and used.stack == 0, (name, kernel, used)

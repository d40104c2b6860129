"""The ONNX model zoo shipped inside the ``onnx`` package, imported as TVM users import models.

``onnx/backend/test/data/light/`` holds nine ImageNet CNNs with constant weights and a batch of
one (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512): plain, grouped and depthwise convolutions, fully connected layers, pools.
"""

from __future__ import annotations

import os
import re

import tvm

from .errors import check_choice

ONNX_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def onnx_model(name: str) -> tvm.IRModule:
    """The Relax module of model ``name`` (one of :data:`ONNX_MODELS`), via TVM's ONNX frontend.

    Raises
    ------
    WorkloadError
        For a name not in :data:`ONNX_MODELS`.
    ImportError
        Without the ``onnx`` package (``pip install -e ".[models]"``).
    """
    check_choice("onnx model", name, ONNX_MODELS)
    import onnx
    from tvm.relax.frontend.onnx import from_onnx

    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    model = onnx.load(os.path.join(folder, f"light_{name}.onnx"))
    _identifier_inputs(model.graph)
    return from_onnx(model)


def _identifier_inputs(graph) -> None:
    """Rename the graph's inputs to C identifiers, in place.

    TVM 0.27 names a fused kernel's parameters after the Relax variables, and the CUDA code
    generator prints them as they are: ResNet-50's input ``gpu_0/data_0`` becomes the kernel
    parameter ``gpu_0/data_0_ptr``, which nvcc rejects (``tvm.compile`` itself succeeds, it
    does not run nvcc). The frontend's ``sanitize_input_names`` does not reach that far.
    """
    renamed = {}
    weights = {init.name for init in graph.initializer}
    for value in graph.input:
        if value.name in weights:
            continue  # older models list their weights as inputs too; they become constants
        clean = re.sub(r"\W", "_", value.name)
        if clean != value.name:
            renamed[value.name] = clean
            value.name = clean
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]

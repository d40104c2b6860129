"""The ONNX model zoo shipped inside the ``onnx`` package, imported as TVM users import models.

``onnx/backend/test/data/light/`` holds nine ImageNet CNNs with constant weights and a batch of
one (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512): plain, grouped and depthwise convolutions, fully connected layers, pools.
"""

from __future__ import annotations

import os

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
    return from_onnx(onnx.load(os.path.join(folder, f"light_{name}.onnx")))

"""Workloads: TVMScript builders of the reductions the project targets, GPU schedules of them,
and the random inputs and float64 references numeric checks use.

``builders`` holds :func:`gemm`, :func:`batched_gemm` and :func:`gemv`; ``schedules`` the
:func:`reference_schedule` of a GEMM and the :func:`implicit_gemm_schedule` of a convolution;
``references`` :func:`random_args`, :func:`reference`, :func:`relative_error` and
:func:`magnitude`;
``relax_models`` :func:`relax_matmul`; ``convolutions`` :func:`conv` (and :func:`conv1d`,
:func:`conv2d`, :func:`conv3d`) with :func:`conv_reference`; ``contractions``
:func:`contraction` with :func:`contraction_reference`; ``grouped`` :func:`grouped_gemm` (G
GEMMs of different row counts, mixture-of-experts) with :func:`grouped_args`,
:func:`grouped_reference`, the MoE weight gradient :func:`grouped_weight_grad` (ragged K)
with :func:`grouped_weight_grad_args` and :func:`grouped_weight_grad_reference`,
:func:`moe_offsets` and :func:`sort_by_expert`; ``onnx_models``
:func:`onnx_model` (the ONNX model zoo, :data:`ONNX_MODELS`); ``errors`` :class:`WorkloadError`.
"""

from .builders import EPILOGUES, IN_DTYPES, LAYOUTS, batched_gemm, gemm, gemv
from .contractions import contraction, contraction_reference
from .convolutions import conv, conv1d, conv2d, conv3d, conv_output_shape, conv_reference
from .errors import WorkloadError
from .grouped import (
    grouped_args,
    grouped_gemm,
    grouped_reference,
    grouped_weight_grad,
    grouped_weight_grad_args,
    grouped_weight_grad_reference,
    moe_offsets,
    sort_by_expert,
)
from .onnx_models import ONNX_MODELS, onnx_model
from .references import magnitude, random_args, reference, relative_error
from .relax_models import relax_matmul
from .schedules import implicit_gemm_schedule, reference_schedule

__all__ = [
    "EPILOGUES",
    "IN_DTYPES",
    "LAYOUTS",
    "ONNX_MODELS",
    "WorkloadError",
    "batched_gemm",
    "contraction",
    "contraction_reference",
    "conv",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_output_shape",
    "conv_reference",
    "gemm",
    "gemv",
    "grouped_args",
    "grouped_gemm",
    "grouped_reference",
    "grouped_weight_grad",
    "grouped_weight_grad_args",
    "grouped_weight_grad_reference",
    "implicit_gemm_schedule",
    "moe_offsets",
    "onnx_model",
    "random_args",
    "reference",
    "reference_schedule",
    "relative_error",
    "magnitude",
    "relax_matmul",
    "sort_by_expert",
]

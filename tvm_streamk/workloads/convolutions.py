"""Convolutions as TensorIR workloads, with float64 numpy references.

:func:`conv` builds the PrimFunc Relax hands dlight for ``relax.op.nn.conv1d/conv2d/conv3d``:
``LegalizeOps`` lowers all three through ``topi.nn.conv``, and so does this builder (a
``pad_temp`` block, then one reduction block over the input channels and the kernel window).
dlight's GPU ``Matmul`` rule normalises that reduction to ``C[S, I, J] += A[S, I, K] * B[S, J, K]``
(I: batch and output positions, J: output channels, K: input channels and the kernel window),
inlines the padding into the shared-memory load of A (an implicit im2col) and any elementwise
epilogue into the write-back. A grouped convolution (``groups > 1``, depthwise included) indexes
the input channel by the output channel, so its output channel is a batch axis of both operands
and the rule finds no J axis.

:func:`conv_reference` computes the same convolution in float64 numpy, one strided view of the
padded input per kernel offset, without TVM.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import te, topi

from .errors import WorkloadError, check_choice

# Data layout -> the kernel layout it is built with (Relax's defaults: OIHW and HWIO).
LAYOUTS = {
    "NCW": "OIW",
    "NWC": "WIO",
    "NCHW": "OIHW",
    "NHWC": "HWIO",
    "NCDHW": "OIDHW",
    "NDHWC": "DHWIO",
}
EPILOGUES = (None, "bias", "bias_relu", "bias_relu_residual")
DTYPES = ("float32",)


def conv(
    data_shape: Sequence[int],
    weight_shape: Sequence[int],
    *,
    layout: str = "NHWC",
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    epilogue: str | None = None,
    dtype: str = "float32",
) -> tvm.tirx.PrimFunc:
    """A 1-D, 2-D or 3-D convolution (cross-correlation, as in every DL framework) named ``main``.

    Parameters
    ----------
    data_shape : sequence of int
        Shape of the input ``x`` in ``layout`` (e.g. ``(N, H, W, C)`` for ``"NHWC"``).
    weight_shape : sequence of int
        Shape of the filter ``w`` in the kernel layout ``LAYOUTS[layout]``: ``(O, I, *window)``
        for channel-first layouts, ``(*window, I, O)`` for channel-last ones, ``I = C / groups``.
    layout : str
        One of ``LAYOUTS``; its length picks the dimensionality.
    stride, padding, dilation : int or sequence of int
        Per spatial axis, or one value for all. ``padding`` may also list the begin pads of
        every axis followed by the end pads (``2 * dim`` values), as ``topi.nn.conv`` takes it.
    groups : int
        Channel groups; both channel counts must divide by it.
    epilogue : str, optional
        ``"bias"`` adds ``bias[O]`` along the channel axis, ``"bias_relu"`` then applies ReLU,
        ``"bias_relu_residual"`` then adds ``residual`` (shaped like the output). Each is its own
        elementwise block after the reduction, as Relax's ``FuseTIR`` leaves a fused epilogue.
    dtype : str
        Dtype of every tensor; accumulation is in the same dtype.

    Returns
    -------
    tvm.tirx.PrimFunc
        Parameters ``x, w[, bias][, residual], out``.

    Raises
    ------
    WorkloadError
        Naming the argument that does not describe a valid convolution.
    """
    geometry = _Geometry.check(data_shape, weight_shape, layout, stride, padding, dilation, groups)
    check_choice("epilogue", epilogue, EPILOGUES)
    check_choice("dtype", dtype, DTYPES)
    x = te.placeholder(geometry.data_shape, dtype, name="x")
    w = te.placeholder(geometry.weight_shape, dtype, name="w")
    out = topi.nn.conv(
        x,
        w,
        list(geometry.stride),
        list(geometry.pad_begin + geometry.pad_end),
        list(geometry.dilation),
        groups,
        layout,
        LAYOUTS[layout],
        out_dtype=dtype,
    )
    params = [x, w]
    if epilogue is not None:
        bias = te.placeholder((geometry.out_channels,), dtype, name="bias")
        axis = layout.index("C")
        out = te.compute(out.shape, lambda *i: out(*i) + bias[i[axis]], name="bias_add")
        params.append(bias)
    if epilogue in ("bias_relu", "bias_relu_residual"):
        out = topi.nn.relu(out)
    if epilogue == "bias_relu_residual":
        residual = te.placeholder(geometry.output_shape, dtype, name="residual")
        out = topi.add(out, residual)
        params.append(residual)
    func = te.create_prim_func([*params, out])
    return func.with_attr("global_symbol", "main")


def conv1d(data_shape, weight_shape, *, layout: str = "NWC", **kwargs) -> tvm.tirx.PrimFunc:
    """:func:`conv` for a 1-D layout (``"NWC"`` or ``"NCW"``)."""
    _check_rank(layout, 1)
    return conv(data_shape, weight_shape, layout=layout, **kwargs)


def conv2d(data_shape, weight_shape, *, layout: str = "NHWC", **kwargs) -> tvm.tirx.PrimFunc:
    """:func:`conv` for a 2-D layout (``"NHWC"`` or ``"NCHW"``)."""
    _check_rank(layout, 2)
    return conv(data_shape, weight_shape, layout=layout, **kwargs)


def conv3d(data_shape, weight_shape, *, layout: str = "NDHWC", **kwargs) -> tvm.tirx.PrimFunc:
    """:func:`conv` for a 3-D layout (``"NDHWC"`` or ``"NCDHW"``)."""
    _check_rank(layout, 3)
    return conv(data_shape, weight_shape, layout=layout, **kwargs)


def conv_output_shape(
    data_shape: Sequence[int],
    weight_shape: Sequence[int],
    *,
    layout: str = "NHWC",
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> tuple[int, ...]:
    """The output shape, in ``layout``, of the convolution :func:`conv` builds."""
    return _Geometry.check(
        data_shape, weight_shape, layout, stride, padding, dilation, groups
    ).output_shape


def conv_reference(
    args: Sequence[np.ndarray],
    *,
    layout: str = "NHWC",
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    epilogue: str | None = None,
) -> np.ndarray:
    """The output of :func:`conv` in float64 numpy, from its arguments (inputs first).

    ``args`` are the PrimFunc's parameters in order; a trailing output array is ignored. The
    keyword arguments must be the ones the workload was built with.
    """
    check_choice("epilogue", epilogue, EPILOGUES)
    inputs = 2 + {None: 0, "bias": 1, "bias_relu": 1, "bias_relu_residual": 2}[epilogue]
    if len(args) < inputs:
        raise WorkloadError(
            f"conv_reference with epilogue={epilogue!r} needs {inputs} input arrays; "
            f"found {len(args)}"
        )
    x, w, *extra = (np.asarray(a, dtype=np.float64) for a in args[:inputs])
    geometry = _Geometry.check(x.shape, w.shape, layout, stride, padding, dilation, groups)
    dim = geometry.dim
    channel_last = layout[-1] == "C"
    # Work channel-first: x as (N, C, *spatial), w as (O, I, *window).
    if channel_last:
        x = np.moveaxis(x, -1, 1)
        w = np.moveaxis(w, (-1, -2), (0, 1))
    pads = [(0, 0), (0, 0), *zip(geometry.pad_begin, geometry.pad_end)]
    x = np.pad(x, pads)
    n, c = x.shape[:2]
    o, g = geometry.out_channels, groups
    out_spatial = geometry.output_shape[1:-1] if channel_last else geometry.output_shape[2:]
    x = x.reshape(n, g, c // g, *x.shape[2:])
    w = w.reshape(g, o // g, c // g, *w.shape[2:])
    out = np.zeros((n, g, o // g, *out_spatial))
    for offset in itertools.product(*(range(k) for k in w.shape[3:])):
        window = tuple(
            slice(k * d, k * d + s * (e - 1) + 1, s)
            for k, d, s, e in zip(offset, geometry.dilation, geometry.stride, out_spatial)
        )
        taps = x[(slice(None), slice(None), slice(None), *window)]
        out += np.einsum("ngc...,gfc->ngf...", taps, w[(Ellipsis, *offset)])
    out = out.reshape(n, o, *out_spatial)
    if epilogue is not None:
        out = out + extra[0].reshape(o, *([1] * dim))
    if epilogue in ("bias_relu", "bias_relu_residual"):
        out = np.maximum(out, 0.0)
    if channel_last:
        out = np.moveaxis(out, 1, -1)
    if epilogue == "bias_relu_residual":
        out = out + extra[1]
    return out


def _check_rank(layout: str, dim: int) -> None:
    allowed = [name for name in LAYOUTS if len(name) == dim + 2]
    check_choice(f"layout of a {dim}-D convolution", layout, allowed)


@dataclass(frozen=True)
class _Geometry:
    """The checked extents of one convolution, in the layouts it is built with."""

    dim: int
    data_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    pad_begin: tuple[int, ...]
    pad_end: tuple[int, ...]
    out_channels: int
    output_shape: tuple[int, ...]

    @classmethod
    def check(cls, data_shape, weight_shape, layout, stride, padding, dilation, groups):
        """Validate the arguments of :func:`conv`; raise :class:`WorkloadError` naming the first
        that does not describe a convolution."""
        check_choice("layout", layout, list(LAYOUTS))
        dim = len(layout) - 2
        data_shape = _shape("data_shape", data_shape, dim + 2, layout)
        weight_shape = _shape("weight_shape", weight_shape, dim + 2, LAYOUTS[layout])
        stride = _per_axis("stride", stride, dim, minimum=1)
        dilation = _per_axis("dilation", dilation, dim, minimum=1)
        pad_begin, pad_end = _padding(padding, dim)
        if not isinstance(groups, int) or isinstance(groups, bool) or groups <= 0:
            raise WorkloadError(f"groups must be a positive int; found {groups!r}")
        kernel_layout = LAYOUTS[layout]
        channels = data_shape[layout.index("C")]
        per_group = weight_shape[kernel_layout.index("I")]
        out_channels = weight_shape[kernel_layout.index("O")]
        window = tuple(weight_shape[i] for i, a in enumerate(kernel_layout) if a not in "OI")
        spatial = tuple(data_shape[i] for i, a in enumerate(layout) if a not in "NC")
        if channels % groups or out_channels % groups:
            raise WorkloadError(
                f"groups={groups} must divide the input channels ({channels}) and the output "
                f"channels ({out_channels}); choose a common divisor"
            )
        if per_group * groups != channels:
            raise WorkloadError(
                f"weight_shape's I axis ({kernel_layout} layout) must hold channels / groups = "
                f"{channels} / {groups} = {channels // groups}; found {per_group}"
            )
        out_spatial = []
        for axis, (size, k, s, d, pb, pe) in enumerate(
            zip(spatial, window, stride, dilation, pad_begin, pad_end)
        ):
            extent = (size + pb + pe - d * (k - 1) - 1) // s + 1
            if extent <= 0:
                raise WorkloadError(
                    f"spatial axis {axis}: the dilated window {d * (k - 1) + 1} is wider than the "
                    f"padded input {size + pb + pe}; pad more or use a smaller kernel or dilation"
                )
            out_spatial.append(extent)
        batch = data_shape[layout.index("N")]
        if layout[-1] == "C":
            output_shape = (batch, *out_spatial, out_channels)
        else:
            output_shape = (batch, out_channels, *out_spatial)
        return cls(
            dim=dim,
            data_shape=data_shape,
            weight_shape=weight_shape,
            stride=stride,
            dilation=dilation,
            pad_begin=pad_begin,
            pad_end=pad_end,
            out_channels=out_channels,
            output_shape=output_shape,
        )


def _shape(name: str, shape, rank: int, layout: str) -> tuple[int, ...]:
    shape = tuple(shape)
    if len(shape) != rank:
        raise WorkloadError(
            f"{name} must have {rank} extents ({layout}); found {len(shape)}: {shape}"
        )
    for extent in shape:
        if not isinstance(extent, int) or isinstance(extent, bool) or extent <= 0:
            raise WorkloadError(f"{name} must hold positive ints; found {shape}")
    return shape


def _per_axis(name: str, value, dim: int, *, minimum: int) -> tuple[int, ...]:
    values = (value,) * dim if isinstance(value, int) else tuple(value)
    if len(values) != dim or any(
        not isinstance(v, int) or isinstance(v, bool) or v < minimum for v in values
    ):
        raise WorkloadError(
            f"{name} must be an int >= {minimum} or {dim} of them (one per spatial axis); "
            f"found {value!r}"
        )
    return values


def _padding(value, dim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    values = (value,) * dim if isinstance(value, int) else tuple(value)
    if len(values) == dim:
        values = values + values
    if len(values) != 2 * dim or any(
        not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values
    ):
        raise WorkloadError(
            f"padding must be an int >= 0, {dim} of them (one per spatial axis) or {2 * dim} "
            f"(all begin pads, then all end pads); found {value!r}"
        )
    return values[:dim], values[dim:]

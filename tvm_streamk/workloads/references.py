"""Random inputs, float64 references and the relative error that numeric checks of kernels use."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tvm

from .._compat import param_buffers
from .builders import LAYOUTS
from .errors import WorkloadError, check_choice


def random_args(
    func: tvm.tirx.PrimFunc, rng: np.random.Generator | None = None, **sizes: int
) -> list:
    """Fresh random inputs for every parameter, the output (last parameter) poisoned with NaN.

    Integer outputs cannot hold NaN: they are filled with a sentinel (-12345) instead. A
    dynamic-shape function takes the value of each shape variable by name (``m=100``).
    """
    rng = rng or np.random.default_rng()
    args = []
    params = param_buffers(func)
    for n, buf in enumerate(params):
        shape = tuple(_size(s, sizes) for s in buf.shape)
        dtype = str(buf.dtype)
        np_dtype = _numpy_dtype(dtype)
        if n == len(params) - 1:
            fill = (
                np.nan
                if np.issubdtype(np.dtype(np_dtype), np.floating) or dtype == "bfloat16"
                else -12345
            )
            args.append(np.full(shape, fill, dtype=np_dtype))
        elif dtype.startswith("int"):
            args.append(rng.integers(-4, 5, size=shape).astype(np_dtype))
        else:
            args.append(rng.uniform(-1.0, 1.0, size=shape).astype(np_dtype))
    return args


def _size(extent, sizes: dict) -> int:
    if isinstance(extent, tvm.tirx.IntImm):
        return int(extent)
    if isinstance(extent, tvm.tirx.Var) and extent.name in sizes:
        return int(sizes[extent.name])
    raise WorkloadError(
        f"the extent {extent} is only known at run time, and no size was given for it; pass "
        f"it by name, e.g. random_args(func, {getattr(extent, 'name', 'm')}=100)"
    )


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def reference(func: tvm.tirx.PrimFunc, args: Sequence[np.ndarray], layout: str = "NN"):
    """The output of a workload built here, in float64 numpy, from ``args`` (inputs first).

    ``layout`` must be the one the workload was built with.
    """
    check_choice("layout", layout, LAYOUTS)
    names = [buf.name for buf in param_buffers(func)]
    inputs = {n: np.asarray(a, dtype=np.float64) for n, a in zip(names, args)}
    if "W" in inputs:
        return inputs["W"] @ inputs["x"]
    A, B = inputs["A"], inputs["B"]
    if layout == "TN":
        A = np.swapaxes(A, -1, -2)
    if layout == "NT":
        B = np.swapaxes(B, -1, -2)
    out = A @ B
    if "bias" in inputs:
        out = np.maximum(out + inputs["bias"], 0.0)
    return out


def relative_error(out: np.ndarray, ref: np.ndarray, scale: float | None = None) -> float:
    """``max|out - ref| / scale`` in float64, ``scale`` ``max|ref|`` unless given; NaN anywhere
    in ``out`` gives ``inf``.

    A sum of products is as accurate as its terms are large, not as its value: where the
    outputs may all cancel to near zero (a single output of fresh random inputs), pass the
    largest sum of absolute products as ``scale`` (:func:`magnitude`)."""
    out = np.asarray(out, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    scale = float(np.max(np.abs(ref))) if scale is None else scale
    return float(np.max(np.abs(out - ref)) / max(scale, np.finfo(np.float64).tiny))


def magnitude(reference_of: Callable[[list], np.ndarray], args: Sequence[np.ndarray]) -> float:
    """The largest output of ``reference_of`` (a float64 reference, as a function of the
    arguments, the output last) on the absolute values of the inputs: the largest sum of
    absolute products, the scale of a GEMM's rounding error (:func:`relative_error`)."""
    inputs = [np.abs(np.asarray(a, dtype=np.float64)) for a in args[:-1]]
    return float(np.max(np.abs(reference_of([*inputs, args[-1]]))))

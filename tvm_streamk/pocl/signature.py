"""A PrimFunc's parameter list, and the checks that arrays handed to it match.

Symbolic extents (``m = T.int32()`` used in several buffer shapes) are bound from the first array
that carries them and must agree across all others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm

from .._compat import PrimType, is_buffer_var
from .errors import ArgumentError, UnsupportedKernelError


@dataclass(frozen=True)
class Param:
    """One PrimFunc parameter: a buffer (``shape`` is its extents) or a scalar (``shape`` empty).

    ``shape`` holds ints for static extents and the TIR ``Var`` for symbolic ones.
    """

    name: str
    dtype: str
    shape: tuple
    is_buffer: bool

    def describe(self) -> str:
        """``A: float32[128, m]`` or ``n: int32``."""
        if not self.is_buffer:
            return f"{self.name}: {self.dtype}"
        dims = ", ".join(str(s) for s in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


def signature(func: tvm.tirx.PrimFunc, func_name: str) -> tuple[Param, ...]:
    """The parameters of ``func`` in call order.

    Raises
    ------
    UnsupportedKernelError
        For a raw ``T.handle`` parameter: without a buffer declaration there is no size to
        allocate on the device.
    """
    params = []
    for p in func.params:
        if is_buffer_var(p):
            shape = tuple(_static_or_symbolic(s) for s in p.ty.shape)
            params.append(Param(p.name, str(p.ty.dtype.dtype), shape, True))
        elif isinstance(p.ty, PrimType):
            params.append(Param(p.name, str(p.ty.dtype), (), False))
        else:
            raise UnsupportedKernelError(
                f"the untyped handle parameter {p.name!r}",
                func_name,
                "Declare it as a buffer (T.Buffer(shape, dtype) or T.match_buffer).",
            )
    return tuple(params)


def _static_or_symbolic(extent):
    if isinstance(extent, tvm.tirx.IntImm):
        return int(extent.value)
    return extent


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype holding a TVM dtype; bfloat16 is ``ml_dtypes.bfloat16``."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _accepts(dtype: str, array: np.ndarray) -> bool:
    # numpy has no native bfloat16: a uint16 array holding the bit patterns is accepted as well.
    if dtype == "bfloat16" and array.dtype == np.uint16:
        return True
    return array.dtype == numpy_dtype(dtype)


def check_arguments(func_name: str, params: Sequence[Param], args: Sequence) -> list:
    """Validate ``args`` against ``params``; return the buffers as given (a copy to the device
    makes them contiguous: a broadcast view is checked without being materialised).

    Scalars are returned as 0-d arrays of the parameter's dtype.

    Raises
    ------
    ArgumentError
        On a wrong number of arguments, a non-array for a buffer, or a dtype, rank or extent that
        differs from the signature. The message gives the expected signature and what was found.
    """
    expected = "(" + ", ".join(p.describe() for p in params) + ")"
    if len(args) != len(params):
        raise ArgumentError(
            f"{func_name}{expected} takes {len(params)} arguments; found {len(args)}. "
            "Pass one array per buffer parameter and one number per scalar parameter, in order."
        )
    symbols: dict[int, tuple[int, str]] = {}
    values = []
    for index, (param, arg) in enumerate(zip(params, args)):
        where = f"argument #{index} ({param.name}) of {func_name}{expected}"
        if not param.is_buffer:
            if isinstance(arg, np.ndarray) and arg.ndim != 0:
                raise ArgumentError(f"{where} is a scalar {param.dtype}; found array {arg.shape}")
            values.append(np.asarray(arg, dtype=numpy_dtype(param.dtype)))
            continue
        if not isinstance(arg, np.ndarray):
            raise ArgumentError(
                f"{where} expects a numpy array {param.describe()}; found {type(arg).__name__}"
            )
        if not _accepts(param.dtype, arg):
            raise ArgumentError(
                f"{where} expects dtype {param.dtype}; found {arg.dtype}. Convert with "
                f"arr.astype(...) first"
            )
        if arg.ndim != len(param.shape):
            raise ArgumentError(
                f"{where} expects {len(param.shape)} dimensions {param.describe()}; "
                f"found shape {arg.shape}"
            )
        for axis, (extent, found) in enumerate(zip(param.shape, arg.shape)):
            if isinstance(extent, int):
                if extent != found:
                    raise ArgumentError(
                        f"{where} expects shape {param.describe()}; found {arg.shape} "
                        f"(axis {axis} is {found}, not {extent})"
                    )
            elif isinstance(extent, tvm.ir.Var):
                key = extent.__chandle__()
                if key in symbols and symbols[key][0] != found:
                    bound, source = symbols[key]
                    raise ArgumentError(
                        f"{where}: symbolic extent {extent.name} is {found} on axis {axis}, "
                        f"but {source} set it to {bound}"
                    )
                symbols.setdefault(key, (found, f"{param.name}.shape[{axis}]"))
        values.append(arg)
    return values

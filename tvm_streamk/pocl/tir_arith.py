"""TIR's scalar arithmetic on Python numbers, as the host code of a lowered function computes it.

On integers ``Div`` and ``Mod`` truncate toward zero (C semantics), ``FloorDiv`` and ``FloorMod``
round toward negative infinity, and a cast to an integer dtype wraps: what the values of launch
extents and kernel scalars would be on the host TVM compiles for.
"""

from __future__ import annotations

import math

import numpy as np
import tvm

from .signature import numpy_dtype


def _trunc_div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


def _trunc_mod(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _trunc_div(a, b)
    return math.fmod(a, b)


# The Python function of each binary TIR node; comparisons give Python bools.
BINARY_OPS = {
    tvm.ir.prim.expr.Add: lambda a, b: a + b,
    tvm.ir.prim.expr.Sub: lambda a, b: a - b,
    tvm.ir.prim.expr.Mul: lambda a, b: a * b,
    tvm.ir.prim.expr.Div: _trunc_div,
    tvm.ir.prim.expr.Mod: _trunc_mod,
    tvm.ir.prim.expr.FloorDiv: lambda a, b: a // b,
    tvm.ir.prim.expr.FloorMod: lambda a, b: a % b,
    tvm.ir.prim.expr.Min: min,
    tvm.ir.prim.expr.Max: max,
    tvm.ir.prim.expr.EQ: lambda a, b: a == b,
    tvm.ir.prim.expr.NE: lambda a, b: a != b,
    tvm.ir.prim.expr.LT: lambda a, b: a < b,
    tvm.ir.prim.expr.LE: lambda a, b: a <= b,
    tvm.ir.prim.expr.GT: lambda a, b: a > b,
    tvm.ir.prim.expr.GE: lambda a, b: a >= b,
    tvm.ir.prim.expr.LShift: lambda a, b: a << b,
    tvm.ir.prim.expr.RShift: lambda a, b: a >> b,
    tvm.ir.prim.expr.BitwiseAnd: lambda a, b: a & b,
    tvm.ir.prim.expr.BitwiseOr: lambda a, b: a | b,
    tvm.ir.prim.expr.BitwiseXor: lambda a, b: a ^ b,
}


def cast(value, dtype: str | None):
    """``value`` converted as a TIR ``Cast`` to ``dtype`` would (integers wrap)."""
    if dtype is None or not isinstance(value, (int, float, bool)):
        return value
    if dtype == "bool":
        return bool(value)
    if dtype.startswith(("int", "uint")):
        return int(np.array(int(value), dtype=np.int64).astype(dtype))
    return float(np.array(value, dtype=np.float64).astype(numpy_dtype(dtype)))

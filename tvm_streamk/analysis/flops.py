"""The floating-point work of an unscheduled TensorIR function, for model-level reports.

A reduction block does one operation per point of its iteration space, two when its update is a
multiply-accumulate (``acc + a * b``: GEMM, convolution, contraction). Spatial blocks (padding,
elementwise epilogues, layout changes) are not counted: next to the reductions of a network
their work is small, and counting it would make a report's share depend on the fusion.
"""

from __future__ import annotations

from math import prod

from tvm import tirx

from .._compat import SBlock, structural_walk
from . import is_reduction


def kernel_flops(func: tirx.PrimFunc) -> int | None:
    """Floating-point operations of one call of ``func``, or ``None`` when an extent is not a
    constant (a symbolic shape).

    Examples
    --------
    >>> from tvm_streamk import workloads
    >>> kernel_flops(workloads.gemm(64, 32, 16))
    65536
    """
    total = 0
    symbolic = False

    def visit(block: SBlock) -> None:
        nonlocal total, symbolic
        if not is_reduction(block):
            return
        extents = [iv.dom.extent for iv in block.iter_vars]
        if not all(isinstance(e, tirx.IntImm) for e in extents):
            symbolic = True
            return
        total += prod(int(e) for e in extents) * (2 if multiply_accumulates(block) else 1)

    structural_walk(func.body, (SBlock, visit))
    return None if symbolic else total


def multiply_accumulates(block: SBlock) -> bool:
    """Whether the block's update adds a product to its accumulator."""
    found = []

    def store(st: tirx.BufferStore) -> None:
        value = _uncast(st.value)
        if isinstance(value, tirx.Add) and any(
            isinstance(_uncast(term), tirx.Mul) for term in (value.a, value.b)
        ):
            found.append(st)

    structural_walk(block.body, (tirx.BufferStore, store))
    return bool(found)


def _uncast(expr):
    return expr.value if isinstance(expr, tirx.Cast) else expr

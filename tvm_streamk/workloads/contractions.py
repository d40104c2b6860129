"""Einsum-style tensor contractions of two operands as TensorIR workloads, with float64 references.

``contraction("bhqd,bhkd->bhqk", b=2, h=3, q=40, k=50, d=24)`` builds
``out[b, h, q, k] = sum_d A[b, h, q, d] * B[b, h, k, d]`` as one reduction block over every index
missing from the output. dlight's GPU ``Matmul`` rule sorts the indices into the GEMM it
schedules: those of both operands and the output are its batch axis (S), those of A and the
output its rows (I), those of B and the output its columns (J), those of both operands alone
its K. A contraction with no I, J or K index (an outer product, a batched dot product) is not a
GEMM to the rule.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import tvm
from tvm import te

from .errors import WorkloadError, check_choice, check_extents

DTYPES = ("float32",)
_SPEC = re.compile(r"^([a-z]+),([a-z]+)->([a-z]*)$")


def parse_spec(spec: str) -> tuple[str, str, str]:
    """``(a, b, out)`` index strings of an einsum ``spec`` such as ``"bmk,bkn->bmn"``.

    Raises :class:`WorkloadError` unless ``spec`` has two operands and an explicit output, each
    a string of distinct lowercase letters, and every output index appears in an operand.
    """
    match = _SPEC.match(spec.replace(" ", "")) if isinstance(spec, str) else None
    if match is None:
        raise WorkloadError(
            "spec must read 'A,B->OUT' with two operands and an explicit output, each a string of "
            f"lowercase letters (e.g. 'bmk,bkn->bmn'); found {spec!r}"
        )
    a, b, out = match.groups()
    for name, indices in (("first operand", a), ("second operand", b), ("output", out)):
        if len(set(indices)) != len(indices):
            raise WorkloadError(
                f"the {name} of {spec!r} repeats an index ({indices}); a diagonal or trace is "
                "not a contraction: give every axis its own letter"
            )
    missing = sorted(set(out) - set(a) - set(b))
    if missing:
        raise WorkloadError(
            f"output indices {missing} of {spec!r} appear in neither operand; every output index "
            "must come from an operand"
        )
    return a, b, out


def operand_shapes(spec: str, sizes: dict[str, int]) -> tuple[tuple[int, ...], ...]:
    """The shapes ``(A, B, out)`` of the contraction ``spec`` with the index ``sizes``."""
    a, b, out = parse_spec(spec)
    _check_sizes(spec, set(a + b), sizes)
    return tuple(tuple(sizes[i] for i in indices) for indices in (a, b, out))


def contraction(spec: str, *, dtype: str = "float32", **sizes: int) -> tvm.tirx.PrimFunc:
    """``out = einsum(spec, A, B)`` as a PrimFunc named ``main`` with parameters ``A, B, out``.

    Parameters
    ----------
    spec : str
        Two operands and the output, e.g. ``"bmk,bkn->bmn"``, ``"abcd,cdef->abef"``,
        ``"bhqd,bhkd->bhqk"``. Indices absent from the output are summed.
    dtype : str
        Dtype of every tensor; accumulation is in the same dtype.
    **sizes : int
        The extent of every index of ``spec``, by letter.

    Raises
    ------
    WorkloadError
        When ``spec`` is not a two-operand contraction, a size is missing, not positive or names
        no index of ``spec``, or the dtype is not supported.
    """
    check_choice("dtype", dtype, DTYPES)
    a_idx, b_idx, out_idx = parse_spec(spec)
    a_shape, b_shape, out_shape = operand_shapes(spec, sizes)
    A = te.placeholder(a_shape, dtype, name="A")
    B = te.placeholder(b_shape, dtype, name="B")
    summed = [i for i in dict.fromkeys(a_idx + b_idx) if i not in out_idx]
    axes = {i: te.reduce_axis((0, sizes[i]), name=f"r{i}") for i in summed}

    def body(*out_vars):
        at = {**dict(zip(out_idx, out_vars)), **axes}
        product = A[tuple(at[i] for i in a_idx)] * B[tuple(at[i] for i in b_idx)]
        return te.sum(product, axis=list(axes.values())) if axes else product

    out = te.compute(out_shape, body, name="out")
    return te.create_prim_func([A, B, out]).with_attr("global_symbol", "main")


def contraction_reference(spec: str, args: Sequence[np.ndarray]) -> np.ndarray:
    """``einsum(spec, A, B)`` in float64 numpy from the PrimFunc's arguments (inputs first)."""
    parse_spec(spec)
    if len(args) < 2:
        raise WorkloadError(f"contraction_reference needs the two operands; found {len(args)}")
    a, b = (np.asarray(x, dtype=np.float64) for x in args[:2])
    return np.einsum(spec, a, b)


def _check_sizes(spec: str, indices: set[str], sizes: dict[str, int]) -> None:
    missing = sorted(indices - set(sizes))
    if missing:
        raise WorkloadError(f"{spec!r} needs a size for every index; found none for {missing}")
    unknown = sorted(set(sizes) - indices)
    if unknown:
        raise WorkloadError(
            f"sizes {unknown} name no index of {spec!r}; give sizes for {sorted(indices)} only"
        )
    check_extents(**sizes)

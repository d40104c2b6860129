"""The arithmetic the closed forms are written against, and the shared pieces of them.

The closed forms of every policy use ``+``, ``-`` and ``*`` directly and everything else through
an :class:`Ops` object, so the same functions evaluate on Python ints (:data:`INT_OPS`) and, in
the lowering, on TIR ``PrimExpr`` values (a symbolic grid included). No closed form branches in
Python on the value of a block, unit, iteration, tile or grid.
"""

from __future__ import annotations

import operator
from typing import Any, Protocol

__all__ = [
    "INT_OPS",
    "DecompositionError",
    "IntOps",
    "Ops",
    "even_block",
    "even_range",
    "is_static",
    "positive_int",
]


class DecompositionError(ValueError):
    """An argument of the work decomposition is out of its domain.

    The message says what was expected, what was found and what to do.
    """


class Ops(Protocol):
    """Arithmetic the closed forms need beyond ``+``, ``-`` and ``*``.

    :class:`IntOps` implements it on Python ints; the lowering implements it on TIR ``PrimExpr``
    (``tir.floordiv``, ``tir.floormod``, ``tir.min``, ``tir.max``, ``tir.Select``, comparisons and
    ``tir.And``). ``select`` may evaluate both branches, so the closed forms keep both safe.
    A division whose value is used divides a non-negative value by a positive one
    (``tests/decomposition/test_decomposition.py`` checks every closed form the lowering
    emits): the lowering divides with truncation where that is cheaper (by the run-time grid
    for OpenCL, and in the workspace fix-up's peer walk), which agrees with the floor division
    only there.
    """

    def floordiv(self, a: Any, b: Any) -> Any: ...
    def floormod(self, a: Any, b: Any) -> Any: ...
    def min(self, a: Any, b: Any) -> Any: ...
    def max(self, a: Any, b: Any) -> Any: ...
    def select(self, cond: Any, a: Any, b: Any) -> Any: ...
    def lt(self, a: Any, b: Any) -> Any: ...
    def le(self, a: Any, b: Any) -> Any: ...
    def ge(self, a: Any, b: Any) -> Any: ...
    def eq(self, a: Any, b: Any) -> Any: ...
    def ne(self, a: Any, b: Any) -> Any: ...
    def and_(self, a: Any, b: Any) -> Any: ...


class IntOps:
    """:class:`Ops` on Python ints: floor division and modulo, eager ``select``."""

    def floordiv(self, a: int, b: int) -> int:
        return a // b

    def floormod(self, a: int, b: int) -> int:
        return a % b

    def min(self, a: int, b: int) -> int:
        return min(a, b)

    def max(self, a: int, b: int) -> int:
        return max(a, b)

    def select(self, cond: bool, a: int, b: int) -> int:
        return a if cond else b

    def lt(self, a: int, b: int) -> bool:
        return a < b

    def le(self, a: int, b: int) -> bool:
        return a <= b

    def ge(self, a: int, b: int) -> bool:
        return a >= b

    def eq(self, a: int, b: int) -> bool:
        return a == b

    def ne(self, a: int, b: int) -> bool:
        return a != b

    def and_(self, a: bool, b: bool) -> bool:
        return a and b


INT_OPS = IntOps()


def positive_int(name: str, value: Any, what: str) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise DecompositionError."""
    if isinstance(value, bool):
        raise DecompositionError(
            f"{name} must be a positive int, found the bool {value!r}; pass {what}"
        )
    try:
        number = operator.index(value)
    except TypeError:
        raise DecompositionError(
            f"{name} must be a positive int, found {value!r} ({type(value).__name__}); pass {what}"
        ) from None
    if number < 1:
        raise DecompositionError(f"{name} must be a positive int, found {number}; pass {what}")
    return number


def is_static(value: Any) -> bool:
    """Whether ``value`` is a Python int, which the closed forms may fold without ops."""
    return isinstance(value, int) and not isinstance(value, bool)


def even_range(b: Any, n: Any, g: Any, ops: Ops) -> tuple[Any, Any]:
    """Block ``b``'s share ``[b*n//g, (b+1)*n//g)`` of ``n`` iterations spread over ``g`` blocks."""
    return ops.floordiv(b * n, g), ops.floordiv((b + 1) * n, g)


def even_block(it: Any, n: Any, g: Any, ops: Ops) -> Any:
    """The block of :func:`even_range` holding iteration ``it``.

    It is the largest ``b`` with ``b*n//g <= it``, i.e. ``b*n < (it+1)*g``; blocks with empty
    ranges are skipped because the next block then starts at the same iteration.
    """
    return ops.floordiv((it + 1) * g - 1, n)

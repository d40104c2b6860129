"""The workloads' one exception type, and the argument checks that raise it."""

from __future__ import annotations

from collections.abc import Sequence

import tvm


class WorkloadError(ValueError):
    """A workload was asked for with arguments it does not support."""


def check_choice(name: str, value, allowed: Sequence) -> None:
    """Raise :class:`WorkloadError` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise WorkloadError(f"{name} must be one of {list(allowed)}; found {value!r}")


def check_extents(**extents: int) -> None:
    """Raise :class:`WorkloadError` unless every extent is a positive int."""
    for name, value in extents.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise WorkloadError(f"{name} must be a positive int; found {value!r}")


def run_time_extent(name: str, value):
    """``value`` as an extent: a positive int, or a run-time one.

    A run-time extent is an integer ``tvm.tirx.Var`` (the shape variable a dynamic-shape model
    has) or a string, the name of a new int64 variable.
    """
    if isinstance(value, str):
        return tvm.tirx.Var(value, "int64")
    if isinstance(value, tvm.tirx.Var) and str(value.ty).startswith("int"):
        return value
    check_extents(**{name: value})
    return value

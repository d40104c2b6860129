"""The one table of known GPUs: SM counts by TVM target tag and, where unambiguous, by arch.

Stream-K sizes its grid from the SM count, which TVM targets do not carry. The count comes from,
in order: an explicit ``num_sms``, the target's tag, the target's arch when every GPU of that
arch has the same count, else :class:`UnknownGPUError`. Pass the device's own count
(``tvm.cuda(0).multi_processor_count``) when a GPU is at hand; the table is for compiling without
one.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from ._compat import target_arch, target_tag
from .decomposition.ops import DecompositionError, positive_int

__all__ = [
    "SM_COUNT_BY_ARCH",
    "SM_COUNT_BY_TAG",
    "UnknownGPUError",
    "num_sms_for_target",
    "register_compute_units",
    "resolve_num_sms",
]


class UnknownGPUError(ValueError):
    """No SM count can be found for a target, or the one given is not a positive int.

    The message says which tag and arch were found and asks for ``num_sms=``.
    """


SM_COUNT_BY_TAG = MappingProxyType(
    {
        # TVM's tag does not say SXM or PCIe; SXM (132) is the part GEMM-bound deployments use.
        # An H100 PCIe has 114 SMs: pass num_sms=114 or the tag below.
        "nvidia/nvidia-h100": 132,
        "nvidia/nvidia-a100": 108,
        "nvidia/nvidia-a30": 56,
        "nvidia/nvidia-a40": 84,
        "nvidia/nvidia-a10": 72,
        "nvidia/nvidia-a2": 10,
        "nvidia/nvidia-v100": 80,
        "nvidia/nvidia-t4": 40,
        "nvidia/nvidia-titan-v": 80,
        "nvidia/nvidia-titan-rtx": 72,
        "nvidia/rtx-a6000": 84,
        "nvidia/quadro-gv100": 80,
        "nvidia/quadro-gp100": 56,
        "nvidia/quadro-rtx-8000": 72,
        "nvidia/quadro-rtx-6000": 72,
        "nvidia/tesla-p100": 56,
        "nvidia/geforce-rtx-4090": 128,
        "nvidia/geforce-rtx-3090-ti": 84,
        "nvidia/geforce-rtx-3090": 82,
        "nvidia/geforce-rtx-3080-ti": 80,
        "nvidia/geforce-rtx-2080-ti": 68,
        "nvidia/jetson-agx-orin-64gb": 16,
        "nvidia/jetson-agx-orin-32gb": 14,
        "nvidia/jetson-agx-xavier": 8,
        # Not registered in TVM 0.27; matched when a user-registered target carries the tag.
        "nvidia/nvidia-h100-pcie": 114,
        "nvidia/nvidia-h200": 132,
        "nvidia/nvidia-l4": 58,
        "nvidia/nvidia-l40s": 142,
    }
)
"""SM count by TVM target tag."""

SM_COUNT_BY_ARCH = MappingProxyType(
    {
        # Only archs where every product has the same count: sm_60 is GP100 alone (P100, Quadro
        # GP100), sm_70 is GV100 alone (V100 in all forms, Titan V, Quadro GV100). sm_80 (A100
        # 108, A30 56), sm_86, sm_89 and sm_90 (H100 SXM 132, PCIe 114, H20 78) are ambiguous.
        "sm_60": 56,
        "sm_70": 80,
    }
)
"""SM count by CUDA arch, only where the arch determines it."""


# Target kind -> the compute units of the device a build of that kind runs on here (the OpenCL
# CPU executor registers its own: tvm_streamk/__init__.py wires it, so nothing here imports it).
_COMPUTE_UNITS: dict[str, Callable[[], int]] = {}


def register_compute_units(kind: str, provider: Callable[[], int]) -> None:
    """Make ``provider()`` the compute-unit count of targets of ``kind`` for
    :func:`num_sms_for_target` (``opencl_compute_units=True``)."""
    _COMPUTE_UNITS[kind] = provider


def _check_positive(num_sms: Any) -> int:
    try:
        return positive_int("num_sms", num_sms, "the GPU's multiprocessor count")
    except DecompositionError as err:
        raise UnknownGPUError(str(err)) from None


def resolve_num_sms(
    num_sms: int | None = None, tag: str | None = None, arch: str | None = None
) -> int:
    """The SM count to plan for.

    Parameters
    ----------
    num_sms : int, optional
        Explicit count; wins when given.
    tag : str, optional
        The target's tag, e.g. ``target.tag`` (``"nvidia/nvidia-a100"``); empty means none.
    arch : str, optional
        The target's arch, e.g. ``target.arch`` (``"sm_80"``); empty means none.

    Returns
    -------
    int

    Raises
    ------
    UnknownGPUError
        When ``num_sms`` is not a positive int, or neither the tag nor the arch is in the table.

    Examples
    --------
    >>> resolve_num_sms(tag="nvidia/nvidia-a100")
    108
    >>> resolve_num_sms(96, tag="nvidia/nvidia-a100")
    96
    """
    if num_sms is not None:
        return _check_positive(num_sms)
    if tag and tag in SM_COUNT_BY_TAG:
        return SM_COUNT_BY_TAG[tag]
    if arch and arch in SM_COUNT_BY_ARCH:
        return SM_COUNT_BY_ARCH[arch]
    hint = (
        f" ({arch} spans GPUs with different SM counts)"
        if arch and arch.rstrip("af") in {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"}
        else ""
    )
    raise UnknownGPUError(
        f"no SM count known for target tag {tag or None!r}, arch {arch or None!r}{hint}; pass "
        "num_sms= (the GPU's multiprocessor count: tvm.cuda(0).multi_processor_count on the "
        "device, or its data sheet)"
    )


def num_sms_for_target(
    num_sms: int | None = None,
    target=None,
    tag: str | None = None,
    *,
    opencl_compute_units: bool = False,
) -> int:
    """The SM count for ``target``: the one function every integration resolves it with.

    Parameters
    ----------
    num_sms : int, optional
        Explicit count; wins when given.
    target : tvm.target.Target, optional
        Its tag (recovered from its attributes: TVM 0.27 leaves ``Target.tag`` empty) and its
        arch are looked up in the tables.
    tag : str, optional
        The tag string the target was built from, when the caller still has it.
    opencl_compute_units : bool
        For a target kind with a registered compute-unit count (:func:`register_compute_units`:
        OpenCL, the device the CPU proof runs on), take it: what the lowering and tuning for
        PoCL do.

    Raises
    ------
    UnknownGPUError
        As :func:`resolve_num_sms`; for an OpenCL target the message names the compute units.
    """
    if num_sms is not None or target is None:
        return resolve_num_sms(num_sms, tag=tag)
    if opencl_compute_units and target.kind.name in _COMPUTE_UNITS:
        return _COMPUTE_UNITS[target.kind.name]()

    arch = target_arch(target)
    try:
        return resolve_num_sms(None, tag=tag or target_tag(target), arch=arch)
    except UnknownGPUError as err:
        if target.kind.name == "opencl":
            raise UnknownGPUError(
                f"{err}; an OpenCL target has no SM count: pass its compute units, "
                "tvm_streamk.pocl.compute_units() on the CPU proof"
            ) from None
        raise

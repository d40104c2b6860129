"""Resident blocks per SM: a kernel's threads, registers and shared memory against its arch.

The persistent grid is ``num_sms x resident blocks per SM`` of the kernel being built, as CUTLASS
sizes its own (``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` on the built kernel). No GPU
is needed: the limits per arch are the CUDA C++ Programming Guide's table "Technical
Specifications per Compute Capability" and the allocation rules of NVIDIA's occupancy
calculator; the kernel's registers come from ptxas (:mod:`tvm_streamk.ptxas`), its threads and
static shared memory from the IR or from ptxas too.

Plain Python, no TVM.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["ARCH_LIMITS", "ArchLimits", "Occupancy", "arch_limits", "resident_blocks"]


@dataclass(frozen=True)
class ArchLimits:
    """What one SM of an arch holds.

    Attributes
    ----------
    max_threads, max_blocks : int
        Resident threads and blocks per SM.
    registers : int
        32-bit registers per SM (and the most one block may use).
    register_unit : int
        Registers are allocated per warp in multiples of this.
    max_registers_per_thread : int
    shared : int
        Shared memory per SM usable by blocks, in bytes (the largest carve-out).
    shared_per_block : int
        The most shared memory one block may use, in bytes (with opt-in).
    shared_reserved : int
        Shared memory the system reserves per resident block, in bytes.
    shared_unit : int
        Shared memory is allocated per block in multiples of this.
    """

    max_threads: int
    max_blocks: int
    registers: int = 65536
    register_unit: int = 256
    max_registers_per_thread: int = 255
    shared: int = 0
    shared_per_block: int = 0
    shared_reserved: int = 0
    shared_unit: int = 128


_KB = 1024
ARCH_LIMITS = MappingProxyType(
    {
        "sm_70": ArchLimits(2048, 32, shared=96 * _KB, shared_per_block=96 * _KB, shared_unit=256),
        "sm_75": ArchLimits(1024, 16, shared=64 * _KB, shared_per_block=64 * _KB, shared_unit=256),
        "sm_80": ArchLimits(
            2048, 32, shared=164 * _KB, shared_per_block=163 * _KB, shared_reserved=_KB
        ),
        "sm_86": ArchLimits(
            1536, 16, shared=100 * _KB, shared_per_block=99 * _KB, shared_reserved=_KB
        ),
        "sm_87": ArchLimits(
            2048, 32, shared=164 * _KB, shared_per_block=163 * _KB, shared_reserved=_KB
        ),
        "sm_89": ArchLimits(
            1536, 24, shared=100 * _KB, shared_per_block=99 * _KB, shared_reserved=_KB
        ),
        "sm_90": ArchLimits(
            2048, 32, shared=228 * _KB, shared_per_block=227 * _KB, shared_reserved=_KB
        ),
        "sm_100": ArchLimits(
            2048, 32, shared=228 * _KB, shared_per_block=227 * _KB, shared_reserved=_KB
        ),
    }
)
"""Per-SM limits by CUDA arch (``sm_90a`` and other feature suffixes share their base's)."""

_WARP = 32


def arch_limits(arch: str) -> ArchLimits:
    """The limits of ``arch`` (``"sm_90a"`` reads ``"sm_90"``).

    Raises
    ------
    KeyError
        With the known archs, when ``arch`` is not in :data:`ARCH_LIMITS`.
    """
    base = arch.rstrip("af") if arch else arch
    if base not in ARCH_LIMITS:
        raise KeyError(
            f"no occupancy limits for arch {arch!r}; known: {sorted(ARCH_LIMITS)}. Pass "
            "blocks_per_sm= explicitly"
        )
    return ARCH_LIMITS[base]


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM of one kernel, and what limits them.

    Attributes
    ----------
    blocks : int
        Blocks of the kernel one SM holds at once (0: the kernel does not fit an SM).
    limiter : str
        ``"threads"``, ``"blocks"``, ``"registers"`` or ``"shared"``: the tightest limit.
    by_limit : dict
        Blocks each limit allows.
    warps_per_block : int
    active_warps : int
        ``blocks * warps_per_block``.
    max_warps : int
        Warps one SM holds; ``active_warps / max_warps`` is the occupancy.
    """

    blocks: int
    limiter: str
    by_limit: dict
    warps_per_block: int
    active_warps: int
    max_warps: int

    @property
    def fraction(self) -> float:
        """Active warps over the SM's warps."""
        return self.active_warps / self.max_warps


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def resident_blocks(
    arch: str, threads: int, registers: int | None, shared_bytes: int = 0
) -> Occupancy:
    """Blocks of a kernel resident on one SM of ``arch``.

    Parameters
    ----------
    arch : str
        ``"sm_80"``, ``"sm_90a"``, ...
    threads : int
        Threads per block.
    registers : int or None
        Registers per thread (ptxas ``Used N registers``); None leaves registers out of the
        limits (when no ptxas is at hand), which can only overestimate.
    shared_bytes : int
        Shared memory per block, static and dynamic, in bytes.

    Returns
    -------
    Occupancy

    Examples
    --------
    >>> resident_blocks("sm_90", threads=256, registers=64, shared_bytes=16384).blocks
    4
    >>> resident_blocks("sm_90", threads=128, registers=56).limiter
    'registers'
    """
    lim = arch_limits(arch)
    if threads < 1:
        raise ValueError(f"threads must be a positive int, found {threads}")
    warps = -(-threads // _WARP)
    max_warps = lim.max_threads // _WARP
    by_limit = {"threads": max_warps // warps, "blocks": lim.max_blocks}
    if registers is not None:
        if registers > lim.max_registers_per_thread:
            raise ValueError(
                f"{registers} registers per thread exceed the {lim.max_registers_per_thread} "
                f"of {arch}"
            )
        per_warp = _round_up(max(registers, 1) * _WARP, lim.register_unit)
        by_limit["registers"] = (lim.registers // per_warp) // warps
    if shared_bytes > lim.shared_per_block:
        by_limit["shared"] = 0
    elif shared_bytes:
        per_block = _round_up(shared_bytes, lim.shared_unit) + lim.shared_reserved
        by_limit["shared"] = lim.shared // per_block
    limiter = min(by_limit, key=lambda k: (by_limit[k], list(by_limit).index(k)))
    blocks = by_limit[limiter]
    return Occupancy(
        blocks=blocks,
        limiter=limiter,
        by_limit=dict(by_limit),
        warps_per_block=warps,
        active_warps=blocks * warps,
        max_warps=max_warps,
    )

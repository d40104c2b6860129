"""The model in microseconds: a kernel's bytes and FLOPs on a named GPU.

What the build knows of a kernel (:class:`KernelTraits`: its tile, K-panel depth, dtypes and
instruction class, the GEMM's extents) and what the vendor publishes of a GPU
(:class:`~.gpu_specs.GPUSpec`) give the constants the scheduler of :mod:`.model` runs on, in
microseconds (:func:`price`):

* **an iteration** (one K-panel of one tile) takes the longer of its math,
  ``2 * tile_m * tile_n * panel_k`` FLOPs at ``EFFICIENCY`` of the SM's share of the peak
  for the instruction class and dtype, and its memory traffic: the A and B panels the iteration
  reads from device memory, after the reuse concurrent tiles give through L2 (tiles of one tile
  row read the same A panel; when both operands fit in half the L2, each byte comes from device
  memory once), at the SM's share of the memory bandwidth. An SM among few active ones draws
  more than its share, up to ``SM_BANDWIDTH_HEADROOM`` times;
* **a segment** pays a pipeline fill (``FILL_US``) and stores its tile's output;
* **a partial tile** moved by a fix-up is written and read through L2 (``L2_OVER_DEVICE`` times
  the device-memory rate) after a fence and an atomic (``HANDOFF_US``); the owner of a tile of
  many peers pays the hand-off once and reads the other partials back to back, at their bytes'
  cost. Stores and partials move at scattered times rather than in lockstep over the chip, so
  an SM moves them at its own port's rate, ``SM_BANDWIDTH_HEADROOM`` times its even share of
  the device bandwidth;
* **a block** costs ``BLOCK_US`` to schedule, **a launch** ``LAUNCH_US``;
* **an SM with fewer resident blocks than keep it busy** runs at ``(resident / saturation) **
  OCCUPANCY_EXPONENT`` of its throughput (:mod:`.model`).

:func:`roofline_us` is the floor no prediction goes below: the GEMM's FLOPs at the peak and its
compulsory bytes (A, B and C once) at the device bandwidth.

The constants are per instruction class. The CUDA-core ones are fitted to the project's H200
run of TVM's SIMT schedules (216 kernels; fitted to half the shapes, the rms log error of the
predicted times on the other half went from 0.65 to 0.16); the tensor-core ones are set
against CUTLASS's published Stream-K measurement and are not fitted. Their remaining
uncertainty is the reason for the heuristic's margin (:data:`MIN_GAIN`). docs/heuristic.md
sets the model's predictions beside every published measurement the project found and beside
the H200 run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .. import fixup_registry
from .gpu_specs import GPUSpec

__all__ = [
    "EFFICIENCY",
    "MIN_GAIN",
    "OCCUPANCY_EXPONENT",
    "KernelTraits",
    "Price",
    "UnpricedError",
    "price",
    "roofline_us",
]

# The constants per instruction class: "ffma" (CUDA cores) fitted to the project's H200 run of
# TVM's SIMT schedules; "mma" (tensor cores) set against CUTLASS's published kernel, because
# that run measured five tensor-core shapes of a WMMA schedule 6x off any tensor-core figure.
# docs/heuristic.md ("Beside this project's own GPU run") has the fit and its check on shapes
# it did not see (``python -m bench.gpu.fit_physical --run gpu-out --hold-out``).
#
# The fraction of an instruction class's peak a TVM-scheduled main loop reaches on a busy SM.
# FFMA: fitted, 0.27 (cuBLAS's SGEMM reaches 60% of the RTX A6000's FP32 peak; dlight's SIMT
# schedule measured 0.45 of that rate per iteration on a busy SM). mma.sync and WMMA:
# CUTLASS's 128x128x32 kernel reaches 87% of A100's clock-scaled tensor peak on its active SMs
# (docs/heuristic.md); TVM's WMMA schedules stage through shared memory without CUTLASS's
# pipelining, and Hopper's peak needs wgmma, which they do not use: 60%.
EFFICIENCY = {"ffma": 0.27, "mma": 0.6}
# How far above its even share of device-memory bandwidth one SM among few active ones draws.
SM_BANDWIDTH_HEADROOM = 4.0
# L2 bandwidth relative to device memory for the fix-up's partial tiles (written and read
# back at once, so they are L2 hits).
L2_OVER_DEVICE = 2.5
# Half of L2 holds the operands when both fit there (the rest serves the output and others).
L2_USABLE = 0.5
# A segment's pipeline fill, and a partial tile's hand-off (fence, counter atomic, wait). FFMA:
# fitted (the hand-off holds what a TVM fix-up costs beyond its bytes: the barriers around the
# merge, the counter's round trip). mma: set, with which the model's Stream-K and split-K
# speed-ups match CUTLASS example 47's within 1%.
FILL_US = {"ffma": 2.5, "mma": 0.5}
HANDOFF_US = {"ffma": 3.0, "mma": 1.0}
BLOCK_US = 0.02
LAUNCH_US = 3.0
# How an SM's throughput falls with fewer resident blocks than keep it busy
# (:attr:`~.model.CostParams.occupancy_exponent`): 1 is the latency-bound limit, where one
# block of four gets a quarter. FFMA: fitted, 0.5 (one block of four gets half; with 1, the
# model predicted 35x for a 12-tile GEMM measured at 6.3x). mma: unfitted, the limit.
OCCUPANCY_EXPONENT = {"ffma": 0.5, "mma": 1.0}
# A decomposition is chosen over data-parallel only when predicted this much faster. Fitted
# to half the H200 run's shapes, the model's times were off by a factor of exp(0.16) = 1.18
# (rms) on the other half; against CUTLASS's published Stream-K measurement its speed-ups
# agree within 1%. The losses the margin leaves are in docs/heuristic.md.
MIN_GAIN = 0.10
BYTES = {"float64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "int8": 1,
         "float8": 1}  # fmt: skip


class UnpricedError(ValueError):
    """The model has no price for this kernel on this GPU: the message says what is missing."""


@dataclass(frozen=True)
class KernelTraits:
    """What the build knows of a GEMM-like kernel.

    Attributes
    ----------
    tile_m, tile_n, panel_k : int
        Output rows and columns of a tile, and the K depth of one panel.
    in_dtype, acc_dtype, out_dtype : str
    instruction : str
        ``"ffma"`` (CUDA cores) or ``"mma"`` (tensor cores: WMMA, mma.sync).
    m, n, k : int
        The GEMM's extents (``m`` per batch), for the roofline and the operands' footprint;
        ``m = 0`` for a row count known only at run time (:meth:`at_tiles` fills it in).
    batch : int
    input_bytes : float, optional
        The bytes of every input the kernel reads, when the kernel's buffers tell (an implicit
        GEMM reads its image, not the ``m x k`` matrix it stands for); else ``(m + n) * k``
        elements per batch.
    """

    tile_m: int
    tile_n: int
    panel_k: int
    in_dtype: str = "float32"
    acc_dtype: str = "float32"
    out_dtype: str = "float32"
    instruction: str = "ffma"
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    input_bytes: float | None = None

    def bytes_of(self, dtype: str) -> int:
        if dtype not in BYTES:
            raise UnpricedError(f"no byte width known for dtype {dtype!r}")
        return BYTES[dtype]

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def tile_columns(self) -> int:
        return max(1, -(-self.n // self.tile_n))

    @property
    def operand_bytes(self) -> float:
        if self.input_bytes is not None:
            return self.input_bytes
        return self.batch * (self.m + self.n) * self.k * self.bytes_of(self.in_dtype)

    def at_tiles(self, tiles: int) -> KernelTraits:
        """These traits for ``tiles`` output tiles: a run-time row count (``m = 0``) becomes
        the rows those tiles cover; known extents stay."""
        if self.m:
            return self
        rows = -(-tiles // (self.tile_columns * self.batch)) * self.tile_m
        return replace(self, m=rows, input_bytes=None)

    @property
    def compulsory_bytes(self) -> float:
        """A and B read once, C written once."""
        out = self.batch * self.m * self.n * self.bytes_of(self.out_dtype)
        return self.operand_bytes + out


@dataclass(frozen=True)
class Price:
    """A kernel's costs on one GPU, in microseconds (what :mod:`.model` schedules with)."""

    traits: KernelTraits
    spec: GPUSpec
    compute_us: float
    segment_us: float
    fix_us: float
    block_us: float
    launch_us: float
    occupancy_exponent: float = 1.0
    # One more partial read back to back by a split tile's owner: its bytes through L2.
    read_us: float = 0.0

    @property
    def device_bytes_per_us(self) -> float:
        return self.spec.hbm_gbps * 1e3

    def bandwidth_per_sm(self, active_sms: int) -> float:
        """Bytes per microsecond one of ``active_sms`` busy SMs draws from device memory."""
        fair = self.device_bytes_per_us / max(1, active_sms)
        cap = SM_BANDWIDTH_HEADROOM * self.device_bytes_per_us / self.spec.sms
        return min(fair, cap)

    def bytes_per_iteration(self, concurrent_tiles: int, tiles: int, panels: int) -> float:
        """Device-memory bytes one iteration reads, ``concurrent_tiles`` tiles running."""
        t = self.traits.at_tiles(tiles)
        width = t.bytes_of(t.in_dtype)
        l2 = self.spec.l2_mb
        if l2 is not None and t.operand_bytes <= L2_USABLE * l2 * 2**20 and tiles and panels:
            return t.operand_bytes / (tiles * panels)
        columns = t.tile_columns
        along_row = max(1, min(concurrent_tiles, columns))
        along_column = max(1, concurrent_tiles // columns)
        return (t.tile_m / along_row + t.tile_n / along_column) * t.panel_k * width

    def floor_us(self, tiles: int) -> float:
        """The roofline of the whole GEMM with ``tiles`` tiles (:func:`roofline_us`)."""
        return roofline_us(self.traits.at_tiles(tiles), self.spec)

    def iteration_us(self, active_sms: int, concurrent_tiles: int, tiles: int, panels: int):
        """One iteration at the SM's full throughput: the longer of its math and its traffic."""
        memory = self.bytes_per_iteration(concurrent_tiles, tiles, panels) / self.bandwidth_per_sm(
            active_sms
        )
        return max(self.compute_us, memory)


def roofline_us(traits: KernelTraits, spec: GPUSpec) -> float:
    """The whole GEMM's FLOPs at the peak and its compulsory bytes at the device bandwidth:
    no decomposition runs faster."""
    peak = spec.peak_tflops(traits.instruction, traits.in_dtype)
    if peak is None:
        raise UnpricedError(
            f"{spec.name} publishes no {traits.instruction} throughput for {traits.in_dtype}"
        )
    return max(traits.flops / (peak * 1e6), traits.compulsory_bytes / (spec.hbm_gbps * 1e3))


def price(traits: KernelTraits, spec: GPUSpec, fixup: str = "workspace") -> Price:
    """The constants of ``traits`` on ``spec`` (module docstring).

    Raises
    ------
    UnpricedError
        For an instruction class, dtype or GPU figure the model has no number for.
    """
    if traits.instruction not in EFFICIENCY:
        raise UnpricedError(
            f"instruction class {traits.instruction!r}; the model prices {sorted(EFFICIENCY)}"
        )
    peak = spec.peak_tflops(traits.instruction, traits.in_dtype)
    if peak is None or not spec.hbm_gbps:
        raise UnpricedError(
            f"{spec.name} publishes no {traits.instruction} throughput for {traits.in_dtype} "
            "or no memory bandwidth"
        )
    per_sm = peak * 1e6 * EFFICIENCY[traits.instruction] / spec.sms  # FLOP per microsecond
    flops = 2.0 * traits.tile_m * traits.tile_n * traits.panel_k
    # Epilogue stores and partial tiles move at scattered times, not in lockstep over the
    # chip: an SM moving them draws up to its own port's bandwidth, not its even share.
    port = SM_BANDWIDTH_HEADROOM * spec.hbm_gbps * 1e3 / spec.sms
    tile = traits.tile_m * traits.tile_n
    store = tile * traits.bytes_of(traits.out_dtype) / port
    partial = tile * traits.bytes_of(traits.acc_dtype)
    moved = fixup_registry.get(fixup).partial_trips * partial
    kind = traits.instruction
    return Price(
        traits=traits,
        spec=spec,
        compute_us=flops / per_sm,
        segment_us=FILL_US[kind] + store,
        fix_us=HANDOFF_US[kind] + moved / (L2_OVER_DEVICE * port),
        block_us=BLOCK_US,
        launch_us=LAUNCH_US,
        occupancy_exponent=OCCUPANCY_EXPONENT[kind],
        read_us=partial / (L2_OVER_DEVICE * port),
    )


def waves_note(tiles: int, slots: int) -> str:
    waves = math.ceil(tiles / slots)
    return f"{waves} wave(s) of {slots} slots, the last {tiles - (waves - 1) * slots}/{slots} full"

"""What the analysis finds in a tiled reduction: :class:`StreamKSite`, its write-backs, and the
names of the conditions it checks (``StreamKError.condition``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tvm import tirx

from .._compat import SBlock, arith, dtype_of, structural_map, structural_walk
from ..decomposition import chunks
from ..errors import StreamKError

# Scopes of registers and of tensor-core fragments an accumulator may live in.
REGISTER_SCOPES = ("local",)
FRAGMENT_SCOPES = ("wmma.accumulator", "m16n8k8.matrixC", "m16n8k16.matrixC", "metal.simdgroup")

# Condition names, used in error messages and by tests to tell the failures apart.
COND_BLOCK = "reduction-block"
COND_BAND = "tile-band"
COND_REDUCTION = "associative-add"
COND_PANEL = "constant-panels"
COND_ACCUMULATOR = "register-accumulator"
COND_WRITEBACK = "global-writeback"
COND_EPILOGUE = "no-epilogue"
COND_ATOMIC = "atomic-dtype"
COND_RUNTIME_TILES = "runtime-tiles"


@dataclass(frozen=True)
class WriteBack:
    """A block that reads the accumulator after the reduction and stores a global buffer."""

    block: SBlock
    output: tirx.Buffer
    plain_copy: bool  # ``out[idx] = acc[idx]`` with one dtype: linear, so atomics may merge it


@dataclass(frozen=True)
class StreamKSite:
    """What the rewrite needs to know about one tiled reduction."""

    block: SBlock
    band: tuple[tirx.For, ...]
    panel_loop: tirx.For
    accumulator: tirx.Buffer
    init_block: SBlock | None
    writebacks: tuple[WriteBack, ...]
    has_init: bool = field(default=False)
    # Fragment accumulators are stored to a shared buffer before the write-back: that staging
    # buffer is what the fix-ups merge (None for register accumulators, merged directly).
    stage: tirx.Buffer | None = None
    # The panel loop and the serial loops perfectly nested in it that iterate further reduction
    # axes (a convolution's rh, rw, rc): the K-panel loop is their fusion (see _panel_chain).
    panel_chain: tuple[tirx.For, ...] = ()
    # A grouped GEMM's tile space, or a grouped weight gradient's iteration space (``analysis.
    # ragged``: ``ragged.reduction``): its count is read on the device.
    ragged: object | None = None
    # The function the block was found in (for what only its whole body tells: the tile shape).
    func: tirx.PrimFunc | None = field(default=None, compare=False, repr=False)
    # The decision's view of a batch-invariant kernel (:meth:`chunked`): its iterations are
    # chunks of this many K-panels; 0 for the kernel's own panels.
    chunk: int = 0
    # The widest integer of the target's kernels (WebGPU: 32): new index arithmetic stays
    # within it even where the band counts in int64 (a Relax-legalized function's loops).
    index_bits: int = 64

    @property
    def merged(self) -> tirx.Buffer:
        """The buffer whose per-element partial sums a fix-up merges."""
        return self.stage if self.stage is not None else self.accumulator

    @property
    def runtime_tiles(self) -> bool:
        """Whether a band loop's extent (so the tile count) is only known at run time."""
        return self.ragged is not None or any(
            not isinstance(loop.extent, tirx.IntImm) for loop in self.band
        )

    @property
    def band_extents(self) -> tuple:
        """The band loops' extents: ints, and an expression for a run-time extent."""
        return tuple(
            int(loop.extent) if isinstance(loop.extent, tirx.IntImm) else loop.extent
            for loop in self.band
        )

    @property
    def tiles(self) -> int:
        """The tile count, for a band of compile-time extents (see :attr:`tile_count`)."""
        if self.runtime_tiles:
            raise StreamKError(
                COND_RUNTIME_TILES,
                f"the tile count {self.tile_count} is only known at run time",
                "This step needs a compile-time tile count: specialise the shape first.",
            )
        return math.prod(self.band_extents)

    def tiles_at(self, sizes: dict[str, int]) -> int:
        """The tile count when the run-time extents' variables take ``sizes`` (by name)."""
        if not self.runtime_tiles:
            return self.tiles
        if self.ragged is not None:
            rows = sizes.get("group_rows")
            if rows is None or len(rows) != self.ragged.groups:
                raise StreamKError(
                    COND_RUNTIME_TILES,
                    "a grouped GEMM, whose tile count the kernel reads from its group offsets, "
                    f"with sizes {sizes}",
                    f"Pass sizes={{'group_rows': [...]}}, the rows of each of its "
                    f"{self.ragged.groups} groups.",
                )
            return self.ragged.tiles_for(rows)
        free: dict = {}

        def visit(v) -> None:
            free[v.name] = v

        structural_walk(self.tile_count, (tirx.Var, visit))
        missing = sorted(set(free) - set(sizes))
        if missing:
            raise StreamKError(
                COND_RUNTIME_TILES,
                f"the tile count {self.tile_count} is only known at run time, and no size was "
                f"given for {missing}",
                f"Pass sizes={{{', '.join(f'{n!r}: 100' for n in missing)}}} (values of the "
                "run-time shape variables).",
            )
        value = structural_map(
            self.tile_count,
            (
                tirx.Var,
                lambda v: tirx.const(int(sizes[v.name]), dtype_of(v)) if v.name in free else v,
            ),
        )
        return int(arith.Analyzer().simplify(value))

    @property
    def tile_count(self):
        """The tile count: an int, or an int64 expression of the run-time extent (the type the
        closed forms of a run-time count are evaluated in). A grouped GEMM's is the variable
        its kernels bind to the count they read on the device."""
        if not self.runtime_tiles:
            return self.tiles
        if self.ragged is not None:
            return self.ragged.tiles
        count = None
        for extent in self.band_extents:
            if isinstance(extent, int):
                extent = tirx.IntImm("int64", extent)
            elif dtype_of(extent) != "int64":
                extent = tirx.Cast("int64", extent)
            count = extent if count is None else count * extent
        return count

    @property
    def panels(self) -> int:
        """The K iterations a decision plans over: the panel loop's extent, or under
        :meth:`chunked` the chunks it is cut into."""
        if self.chunk:
            return chunks.chunk_count(self.kernel_panels, self.chunk)
        if self.ragged is not None and self.ragged.reduction:
            # Ragged K: the walk counts iterations, each one panel of one tile.
            return 1
        return self.kernel_panels

    @property
    def kernel_panels(self) -> int:
        """The panel loop's extent, whatever the view."""
        extent = self.panel_loop.extent
        if not isinstance(extent, tirx.IntImm):
            raise StreamKError(
                COND_RUNTIME_TILES,
                f"the panel count {extent} of a ragged reduction is only known at run time",
                "This step needs a compile-time panel count: specialise the token count.",
            )
        return int(extent)

    def chunked(self, chunk: int) -> StreamKSite:
        """The site as a batch-invariant decision plans it: ``panels`` counts chunks of
        ``chunk`` K-panels (:mod:`tvm_streamk.decomposition.chunks`); 0 for the kernel's own
        panels."""
        return replace(self, chunk=chunk)

    @property
    def band_tags(self) -> tuple[str, ...]:
        return tuple(loop.thread_binding.thread_tag for loop in self.band)

    @property
    def index_dtype(self) -> str:
        """The integer type of the tile band's loop variables, used for all new index
        arithmetic; int32 on a target of 32-bit kernels (:attr:`index_bits`), whose plans the
        decision checked to fit (``rules.check_index_width``)."""
        dtype = dtype_of(self.band[0].loop_var)
        return "int32" if self.index_bits == 32 and dtype == "int64" else dtype

    @property
    def accumulator_dtype(self) -> str:
        return str(self.accumulator.dtype)

    @property
    def fragment_accumulator(self) -> bool:
        return self.accumulator.scope() in FRAGMENT_SCOPES

    @property
    def epilogue(self) -> bool:
        return any(not wb.plain_copy for wb in self.writebacks)

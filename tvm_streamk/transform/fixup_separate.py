"""The separate fix-up: partial tiles meet in a workspace and a second kernel finishes them.

The persistent kernel stores every partial segment's accumulator tile to its slot of a global
workspace, as the workspace fix-up does (:mod:`.fixup_workspace`: two slots per block, the
write-back's thread loops innermost), and never reads another block's: no counter, no fence,
no atomic, no barrier after the tile body. A second kernel of the same function, launched after
it on the same stream, runs one block per tile that may be split (every tile for Stream-K, the
hybrid's Stream-K tiles): a block whose tile has more than one peer sums the peers' partials in
peer order (peer 0 holds panel 0; the plan's closed forms locate each) and runs the original
write-back on the sum, epilogue included; a block whose tile is whole does nothing, its
persistent block having written it.

A batch-invariant kernel (:mod:`tvm_streamk.decomposition.chunks`) stores every chunk of every
tile to the slot ``tile * n + chunk``, and the second kernel sums each tile's ``n`` slots in
chunk order: the same sums in the same order as the workspace fix-up's last arriver, so the
two give the same bits.

Ordering. Every partial is stored by the persistent kernel and read by the second: the kernel
boundary orders them on every target (CUDA and OpenCL order the kernels of one stream or
in-order queue; a WebGPU dispatch boundary orders storage accesses), so the argument needs no
memory model at all, and nothing races under any (Oclgrind reports nothing here, where the
workspace fix-up's reads of handed-off values are documented exceptions). Deterministic: the
sum's order is the peers' and never the arrival order. The price: a second launch, and every
split tile's reduction waits for the whole persistent kernel rather than for its last peer;
in exchange the reductions of different tiles run in parallel on the whole GPU instead of on
their last arrivers.

The values are stored as the workspace fix-up stores them (``store_partial``: OpenCL's 32-bit
partials as int32 bit patterns) and read plainly (``load_partial(..., across_kernels=True)``:
no ``__ldcg``, no atomic), so the slot layout and the vectorised lane sums are the workspace
fix-up's.
"""

from __future__ import annotations

from tvm import tirx

from ..analysis import COND_WRITEBACK, StreamKSite
from ..errors import StreamKError
from . import fixup, tile_space
from ._ir import (
    TIR_OPS,
    Segment,
    bound_loop,
    cast_to,
    fresh_definitions,
    index_dtype,
    seq,
    truncating,
    var,
)
from .fixup_workspace import WorkspaceFixup

COND_SEPARATE = "fixup"


@fixup.register
class SeparateFixup(WorkspaceFixup):
    """Merge partial tiles in a kernel of their own after the persistent one (module
    docstring)."""

    name = "separate"
    code = 2
    deterministic = True
    orders_chunks = True
    auto_rank = 20
    merges_in_own_kernel = True
    merge_kind = "second_kernel"

    @classmethod
    def check(cls, site: StreamKSite, target=None) -> None:
        """Refuse a site the second kernel cannot finish: the workspace fix-up's refusals, and
        a grouped GEMM's tile count, which only the device knows (not built: the host would
        have to launch the second kernel for the tile bound)."""
        super().check(site, target)
        if site.ragged is not None:
            raise StreamKError(
                COND_SEPARATE,
                f"fixup='separate' for the {site.ragged.kind} block {site.block.name_hint!r}, "
                "whose tile count only the device knows",
                "Use fixup='workspace' (or 'auto').",
            )
        if site.fragment_accumulator:
            raise StreamKError(
                COND_SEPARATE,
                f"fixup='separate' for the tensor-core fragment accumulator of block "
                f"{site.block.name_hint!r}",
                "Its write-back reads a shared staging buffer the second kernel does not have: "
                "use fixup='workspace' (or 'auto').",
            )

    @classmethod
    def footprint(cls, plan, tile_elems, acc_bytes, out_bytes, blocks):
        """The workspace fix-up's slots; no counters, nothing zeroed."""
        if not plan.split_tiles and blocks == plan.grid:
            return fixup.Footprint(workspace_bytes=0, zeroed_bytes=0)
        slots = cls.slots(plan, blocks) * tile_elems * acc_bytes
        return fixup.Footprint(workspace_bytes=slots, zeroed_bytes=0)

    def __init__(
        self, site: StreamKSite, plan, target, group: int | None, tile_body, grid=None, chunks=None
    ):
        super().__init__(site, plan, target, group, tile_body, grid, chunks)
        # Under a grid the host computes at run time (a run-time tile count, num_sms="device")
        # the second kernel finds a tile's peers by the closed forms on that grid, a scalar
        # argument of the launch: no peer record, no hand-off.
        self.record = self.shared_peers = self.peers = None
        if len(self.loops) == 0:
            raise StreamKError(
                COND_WRITEBACK,
                f"block {site.writebacks[0].block.name_hint!r} writes back outside any loop",
                "The second kernel re-runs the write-back's loops: give it its thread loops.",
            )

    @property
    def buffers(self) -> tuple:
        if not self.active:
            return ()
        return (self.workspace, self.sum, *fixup.Fixup.buffers.fget(self))

    def after_segment(self, seg: Segment):
        """Nothing: a partial segment's stores are all it does (the kernel boundary orders
        them before the second kernel's reads)."""
        return None

    def prologue(self):
        """Nothing to zero: no counters."""
        return None

    def epilogue(self) -> tirx.Stmt | None:
        """The second kernel: one block per tile that may be split, summing its peers'
        partials in peer order into the original write-back where the tile has more than
        one peer."""
        if not self.active:
            return None
        dtype = index_dtype(self.site, self.plan, runtime_grid=self.grid is not None)
        # Every tile under batch invariance (a hybrid's data-parallel tiles merge chunks too).
        tiles = self.counter_tiles
        b = var("sk_merge_block", dtype)
        tile = var("sk_merge_tile", dtype)
        seg = Segment(
            block=b,
            index=var("sk_merge_segment", dtype),
            tile=tile,
            k_begin=var("sk_merge_k_begin", dtype),
            k_end=var("sk_merge_k_end", dtype),
            full=var("sk_merge_full", "bool"),
        )
        if self.chunked:
            # Batch-invariant: every tile's chunks, summed in chunk order.
            merging = tirx.const(True, "bool")
        else:
            peers = self.plan.tile_peers(cast_to(dtype, tile), TIR_OPS, self.grid)
            merging = truncating(peers) > 1
        body = seq(
            [
                tirx.Bind(tile, b),
                *tile_space.coordinates(self.site, tile, self.group),
                self._finish(seg, merging=merging),
            ]
        )
        # Built from the tile body: new variables for what the persistent kernel defines too.
        return fresh_definitions(bound_loop(b, tiles, body))

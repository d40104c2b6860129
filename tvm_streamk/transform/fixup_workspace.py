"""The workspace fix-up: partial tiles meet in a workspace; the last block to arrive finishes them.

Every segment that covers only part of its tile stores its accumulator tile to its own slot of a
global workspace, then the GPU block arrives at the tile's counter by atomically adding the number
of panels it covered. The block whose arrival completes the count (``panels``) is the last one:
it sums the tile's slots in peer order -- peer 0 owns panel 0, then the next peer, and so on, a
fixed order independent of arrival order, so results are bit-reproducible -- into the accumulator
and runs the original write-back, epilogue included (bias, activation, casts to fp16/bf16).

Memory. TVM gives a PrimFunc no device memory that persists across calls: buffers allocated by
the function itself are taken from the runtime's workspace pool at each call, uninitialised. The
workspace and the counters are such buffers, so the function zeroes the counters in a prologue
kernel at every call (one int32 per tile); partial slots need no initialisation. The pool and
the stream are the calling host thread's, and the buffers go back to the pool once the kernels
are launched: calls on one stream, or from different host threads, never share state; calls
from one thread on two unsynchronised streams can (the README's "Streams" paragraph).

Slots: two per block (its first and last segment may be partial; the segments between are
whole tiles), one per block for split-K; a grid read at run time gets the slots of the largest
grid it launches. A slot holds the tile with the write-back's thread loops innermost, so a warp
stores and reads consecutive words. Where the write-back is vectorised (dlight's: two float32
or four float16 lanes per thread) and a thread's lanes make one access, the lanes go inside
the threads: each thread stores its lanes as one vector and the last arriver sums them over
the peers as vectors before the vectorised write-back (on CUDA one 64-bit ``__ldcg`` per peer
instead of one scalar read per lane; :func:`_lane_loop`). The last arriver reads its own
partial back like the others' (from L2, just written): keeping it in the accumulator across
the hand-off costs far more registers (measured with ptxas).

Peers. The last arriver sums the tile's peers in order; with a compile-time grid it finds them
by the plan's closed forms. Under a grid read at run time those divide 64-bit values by run-time
counts, so there a tile's first peer (the one holding panel 0) records its slot, and its last
peer (holding panel ``P - 1``) its block, in two int32 words per tile: the peers are the blocks
in between, each but the first with its partial in its first slot
(:meth:`WorkspaceFixup._record_peers`). Both are partial segments, so both record before they
arrive; the record is read like the partials (below) and never zeroed.

Batch invariance (:mod:`tvm_streamk.decomposition.chunks`). A batch-invariant kernel of ``n > 1``
chunks per tile merges every tile, split or not: each segment is one chunk of one tile, stores
its partial to the tile's slot for that chunk (``tile * n + chunk``) and arrives with its
panels; the last arriver sums the ``n`` slots in chunk order from zero, the canonical order,
whichever blocks ran the chunks and in whatever order they arrived. The protocol below is the
same; no peer record is needed under a run-time grid, as the slots follow from the tile alone.

Ordering (the hand-off argument). Writer side, per partial segment: every thread stores its part
of the partial tile; the block meets at a barrier; then one thread (the leader) stores the peer
record where the segment has one, fences global memory and adds the segment's panel count to the
tile's counter with an atomic. So every partial store of the block is ordered before its
arrival. Reader side: the leader whose atomic returns the count that completes ``panels`` knows
every other peer's arrival came first; it fences, reads the tile's peer record, publishes the
verdict (and the record) through shared memory and a second barrier, and then every thread reads
the peers' slots. No block ever waits for another (no spin), so there is no deadlock whatever
the scheduling, and the counters, records and slots are this call's own. The record is written
and read by leaders only, so a block never reads another thread's global store through a barrier
(OpenCL's orders local memory only).

How far each target guarantees it is its memory model's to say (:mod:`tvm_streamk.memory_model`;
``self.memory`` here, the only place the protocol meets the target). CUDA
(:mod:`~tvm_streamk.memory_model.cuda`): fences are cumulative, so the leader's fence after the
block barrier releases every thread's partial stores and its fence after the atomic acquires
for every thread's reads after the second barrier (CUTLASS's ``barrier.h``); only the leader
fences, twice per partial segment, and handed-off values are read with ``__ldcg``. OpenCL 1.2
(:mod:`~tvm_streamk.memory_model.opencl`): ``mem_fence`` orders the calling work-item's own
accesses only, so every thread fences before the first barrier (partial segments) and after
the second (the last arriver), the leader fences its peer record before it arrives, and values
handed off are read by atomics (32-bit partials travel as int32 bit patterns). The barriers
stand outside any condition (:meth:`WorkspaceFixup.after_segment`).
"""

from __future__ import annotations

import math

import tvm
from tvm import tirx

from .._compat import (
    BufferLoadNode,
    SBlock,
    SBlockRealize,
    arith,
    dtype_of,
    loaded_buffer,
    replace_block,
    structural_equal,
    structural_map,
    structural_walk,
)
from ..analysis import COND_WRITEBACK, StreamKSite, find_block_path
from ..analysis.blocks import uses_var
from ..errors import StreamKError
from ..memory_model import for_target
from . import fixup
from ._ir import (
    INT32_MAX,
    TIR_OPS,
    Segment,
    bound_loop,
    cast_to,
    fresh_definitions,
    int_imm,
    opaque_block,
    prune_to,
    seq,
    storage_sync,
    tile_panels,
    truncating,
    var,
    whole,
    with_body,
)


@fixup.register
class WorkspaceFixup(fixup.Fixup):
    """Merge partial tiles through a workspace and per-tile arrival counters (module docstring).

    ``after_segment`` reads as the protocol: the writer side (:meth:`_writer_fence`,
    a barrier, :meth:`_arrive`), a barrier, the reader side (:meth:`_read_verdict`,
    :meth:`_reader_fence`, :meth:`_finish`). What differs between targets is
    ``self.memory`` (:mod:`tvm_streamk.memory_model`).
    """

    name = "workspace"
    code = 1
    deterministic = True
    orders_chunks = True
    auto_rank = 10
    # Whether the merge runs in a kernel of its own after the persistent one (a subclass's):
    # then it reads no verdict, and reads the partials plainly (the launch orders them).
    merges_in_own_kernel = False

    @classmethod
    def check(cls, site: StreamKSite, target=None) -> None:
        """Refuse a site the workspace fix-up cannot finish."""
        if len(site.writebacks) != 1:
            names = [wb.block.name_hint for wb in site.writebacks]
            raise StreamKError(
                COND_WRITEBACK,
                f"{len(names)} blocks read the accumulator after the reduction: {names}",
                "The workspace fix-up re-runs one write-back block per tile; fuse them into one.",
            )
        if target is not None and not cls.merges_in_own_kernel:
            memory = for_target(target)
            if not memory.orders_handoffs:
                raise StreamKError(
                    "fixup",
                    f"fixup={cls.name!r} on a {memory.kind} target, whose memory model orders "
                    "no store of one block before another block's read within a kernel (the "
                    "last arriver's hand-off cannot be argued there)",
                    "Use fixup='separate' (or 'auto'): its partials cross a kernel boundary.",
                )

    @staticmethod
    def slots(plan, blocks: int) -> int:
        """Partial-tile slots for ``plan`` launched on ``blocks`` blocks."""
        return blocks * plan.slots_per_block

    @classmethod
    def footprint(cls, plan, tile_elems, acc_bytes, out_bytes, blocks):
        """Slots and counters, allocated whenever a tile may be split; the counters zeroed."""
        if not plan.split_tiles and blocks == plan.grid:
            return fixup.Footprint(workspace_bytes=0, zeroed_bytes=0)
        counters = fixup.COUNTER_BYTES * plan.counter_tiles
        slots = cls.slots(plan, blocks) * tile_elems * acc_bytes
        return fixup.Footprint(workspace_bytes=slots + counters, zeroed_bytes=counters)

    @classmethod
    def chunk_footprint(cls, tiles: int, chunks: int, tile_elems: int, acc_bytes: int):
        """:class:`Footprint` of a batch-invariant kernel of ``chunks`` chunks per tile: a slot
        per chunk of every tile and a counter per tile, zeroed (none for a single chunk)."""
        if chunks < 2:
            return fixup.Footprint(workspace_bytes=0, zeroed_bytes=0)
        counters = fixup.COUNTER_BYTES * tiles
        slots = tiles * chunks * tile_elems * acc_bytes
        return fixup.Footprint(workspace_bytes=slots + counters, zeroed_bytes=counters)

    def __init__(
        self, site: StreamKSite, plan, target, group: int | None, tile_body, grid=None, chunks=None
    ):
        super().__init__(site, plan, target, group, tile_body, grid, chunks)
        path = find_block_path_below(tile_body, site.writebacks[0].block.name_hint)
        self.writeback = path[-1].block
        self.loops = [s for s in path if isinstance(s, tirx.For)]
        for loop in self.loops:
            if not isinstance(loop.extent, tirx.IntImm):
                raise StreamKError(
                    COND_WRITEBACK,
                    f"write-back loop {loop.loop_var.name} has the non-constant extent "
                    f"{loop.extent}",
                    "The workspace holds one tile per slot: give the write-back constant loops.",
                )
        self.elems = math.prod(int(loop.extent) for loop in self.loops)
        self.dtype = str(site.merged.dtype)
        # With a lane loop, the write-back's guard without the lane (None: no lane loop).
        self.lane, self.lane_guard = _lane_loop(path, self.dtype, self.memory)
        self.acc_load = _accumulator_load(self.writeback, site.merged)
        # A batch-invariant kernel of several chunks: every tile is merged, chunk by chunk.
        self.chunked = chunks is not None and chunks[1] > 1
        self.active = self.chunked or grid is not None or bool(plan.split_tiles)
        # A grouped GEMM's tile count is read on the device (its counters take the bound); a
        # ragged reduction's tiles are the band's.
        ragged = site.ragged
        self.counter_tiles = plan.counter_tiles if ragged is None else ragged.counter_tiles
        # A grid of resident blocks read at run time (Stream-K's), not one that follows the
        # tiles alone (split-K's tiles x S, whatever the SM count).
        resident = grid is not None and plan.scheme.needs_num_sms
        # Slot indices in int64 where the workspace passes 2^31 elements (_chunk_slot).
        self.wide = False
        if self.chunked:
            # One slot per chunk of every tile, at tile * n + chunk (_chunk_slot): a tile
            # count read at run time sizes it at run time (a grouped GEMM's, read on the
            # device, at its bound).
            if ragged is None:
                self.counter_tiles = plan.tiles
            tiles = self.counter_tiles
            slots = tiles * chunks[1]
            self.wide = not isinstance(tiles, int) or tiles * chunks[1] * self.elems > INT32_MAX
        else:
            # A resident grid gets slots for the largest grid it can launch.
            blocks = plan.runtime_grid_bound() if resident else plan.grid
            slots = self.slots(plan, blocks)
        shape = (slots, self.elems)
        if self.wide:
            shape = tuple(
                int_imm(d, "int64") if isinstance(d, int) else cast_to("int64", d) for d in shape
            )
        self.workspace = tirx.decl_buffer(
            shape, self.memory.partial_dtype(self.dtype), name="sk_workspace"
        )
        self.arrivals = tirx.decl_buffer((self.counter_tiles,), "int32", name="sk_arrivals")
        # The leader's verdict for its block (1: it arrived last), through shared memory, and
        # every thread's register copy of it (ThreadSync refuses shared loads in branch
        # conditions).
        self.verdict = tirx.decl_buffer((1,), "int32", name="sk_last", scope="shared")
        self.is_last = tirx.decl_buffer((1,), "int32", name="sk_is_last", scope="local")
        # Under a grid read at run time, a split tile's first and last peers record where its
        # peers are (_record_peers): the last arriver then walks them without the closed forms'
        # 64-bit divisions by run-time counts. Written before the writers arrive, read after the
        # last arrival: never zeroed. The last arriver's leader hands the two words it read
        # (the first peer's slot, the last peer's block) to its block like the verdict. A grid
        # of tiles x S blocks (split-K) has its peers at tile * S + p, with no such division.
        self.record = self.shared_peers = self.peers = None
        if resident and not self.chunked:
            self.record = tirx.decl_buffer(
                (self.counter_tiles * 2,), "int32", name="sk_peer_record"
            )
            self.shared_peers = tirx.decl_buffer(
                (2,), "int32", name="sk_peers_shared", scope="shared"
            )
            self.peers = tirx.decl_buffer((2,), "int32", name="sk_peers", scope="local")
        lanes = 1 if self.lane is None else int(self.lane.extent)
        self.sum = tirx.decl_buffer((lanes,), self.dtype, name="sk_sum", scope="local")

    @property
    def buffers(self) -> tuple:
        if not self.active:
            return ()
        record = () if self.record is None else (self.record,)
        handed = () if self.record is None else (self.shared_peers, self.peers)
        return (
            self.workspace, self.arrivals, *record, self.verdict, *handed, self.is_last, self.sum,
            *super().buffers,
        )  # fmt: skip

    def _linear(self, loops) -> tirx.Expr:
        """This thread's element of its slot: the write-back's loops flattened with the thread
        loops innermost (``threadIdx.x`` last), so the threads of a warp store and read
        consecutive words whatever order the write-back walks its elements in; a lane loop
        (:func:`_lane_loop`) goes inside them, so each thread's lanes are one access."""
        threads = sorted(
            (lp for lp in loops if _tag(lp).startswith("threadIdx")), key=_tag, reverse=True
        )
        lane = [lp for lp in loops if self._is_lane(lp)]
        others = [
            lp for lp in loops if not _tag(lp).startswith("threadIdx") and not self._is_lane(lp)
        ]
        ordered = others + threads + lane
        index = int_imm(0, str(loops[0].loop_var.ty)) if loops else int_imm(0)
        for loop in ordered:
            index = index * int(loop.extent) + loop.loop_var
        return index

    def _is_lane(self, loop: tirx.For) -> bool:
        return self.lane is not None and loop.loop_var.same_as(self.lane.loop_var)

    def _slot(self, block, first_segment) -> tirx.Expr:
        if self.plan.slots_per_block == 1:
            return block
        return block * 2 + tirx.Select(
            first_segment, int_imm(0, str(block.ty)), int_imm(1, str(block.ty))
        )

    def _threads(self) -> list[tirx.For]:
        return [lp for lp in self.loops if _tag(lp).startswith("threadIdx")]

    # -- the protocol --------------------------------------------------------------------------

    def merge_writeback(self, block: SBlock, seg: Segment) -> SBlock:
        """A partial segment stores its accumulator to its slot instead of writing back."""
        if not self.active:
            return block
        if self.chunked:
            slot = self._chunk_slot(seg.tile, seg.chunk, seg.block)
        else:
            slot = self._slot(seg.block, seg.index == 0)
        element = [slot, self._linear(self.loops)]

        def store(acc):
            return tirx.BufferStore(
                self.workspace, self.memory.store_partial(acc, self.dtype), element
            )

        partial, regions = self.partial_merge(block, self.acc_load, seg, store)
        return replace_block(
            block,
            body=tirx.IfThenElse(seg.full, block.body, partial),
            reads=[*block.reads, *regions],
            writes=[*block.writes, whole(self.workspace)],
        )

    def after_segment(self, seg: Segment) -> tirx.Stmt | None:
        """Arrive at the tile's counter; the last block sums the slots and writes the tile.

        The barriers stand in unconditional code, run by every segment, and the conditions
        move into the work between them. Every thread walks the same segments, so a barrier
        under ``if (partial)`` would be uniform and legal OpenCL; PoCL 3.1 still miscompiles a
        barrier region under an ``if`` in a loop (it ignores guards inside it for some
        work-items), so the kernel does not rely on every compiler getting that right.
        """
        if not self.active:
            return None
        partial = tirx.Not(seg.full)
        return seq(
            [
                self._writer_fence(partial),
                storage_sync(),
                fresh_definitions(self._arrive(seg, partial)),
                storage_sync(),
                self._read_verdict(partial),
                self._reader_fence(),
                fresh_definitions(self._finish(seg)),
            ]
        )

    def _writer_fence(self, partial) -> tirx.Stmt | None:
        """Every thread of a partial segment fences its stores, where a fence orders only its
        own thread's accesses (with cumulative fences the leader's does, in :meth:`_arrive`)."""
        if self.memory.cumulative_fences:
            return None
        return tirx.IfThenElse(partial, self.memory.fence(), None)

    def _reader_fence(self) -> tirx.Stmt | None:
        """Every thread of the last arriver fences before it reads the peers' partials, where
        a fence orders only its own thread's accesses."""
        if self.memory.cumulative_fences:
            return None
        is_last = tirx.BufferLoad(self.is_last, [int_imm(0)]) != 0
        return tirx.IfThenElse(is_last, self.memory.fence(), None)

    def _arrive(self, seg: Segment, partial) -> tirx.Stmt:
        """The leader of a partial segment's block (thread 0) arrives at the tile's counter
        with the panels it covered and publishes whether it arrived last; under a run-time
        grid it records its place among the peers before and reads the tile's record after.
        With cumulative fences it fences before its arrival (release for the block's partial
        stores) and after (acquire for the block's reads after the next barrier)."""
        panels = tile_panels(self.site, seg)
        covered = seg.k_end - seg.k_begin
        address = tirx.address_of(self.arrivals[seg.tile])
        old = self.memory.atomic_add("int32", address, covered)
        verdict = tirx.Cast("int32", old + covered == panels)
        if self.record is not None:
            # Bound: the leader reads the record on it too (_read_record).
            bound = var("sk_verdict", "int32")
            body = seq(
                [tirx.Bind(bound, verdict), tirx.BufferStore(self.verdict, bound, [int_imm(0)])]
            )
            verdict = bound
        else:
            body = tirx.BufferStore(self.verdict, verdict, [int_imm(0)])
        cumulative = self.memory.cumulative_fences
        if cumulative:
            body = seq([self.memory.fence(), body, self.memory.fence()])
        if self.record is not None:
            # The record travels with the partial: fenced before the arrival, read after it
            # (no barrier need order global memory inside the block: OpenCL's orders local
            # memory only).
            recorded = seq([self._record_peers(seg), None if cumulative else self.memory.fence()])
            body = seq([recorded, body, self._read_record(seg, verdict)])
        leader = partial
        for loop in self._threads():
            # Compared as int32: LiftThreadBinding gives every loop of a thread tag one int32
            # variable, whatever the loop's own type (int64 below a run-time extent), and an
            # int64 comparison of it is then ill-typed.
            leader = tirx.And(leader, cast_to("int32", loop.loop_var) == int_imm(0, "int32"))
        record = [] if self.record is None else [whole(self.record)]
        handed = [] if self.record is None else [whole(self.shared_peers)]
        arrive = opaque_block(
            "sk_arrive",
            body,
            reads=[whole(self.arrivals), *record],
            writes=[whole(self.arrivals), whole(self.verdict), *handed, *record],
            predicate=leader,
        )
        for loop in reversed(self._threads()):
            arrive = with_body(loop, arrive)
        return arrive

    def _read_verdict(self, partial) -> tirx.Stmt:
        """Every thread copies the leader's verdict (and the peer record it read) to registers;
        a full segment leaves its flag alone: it may hold the previous partial's arrival."""
        copies = [(self.verdict, self.is_last)]
        if self.record is not None:
            copies.append((self.shared_peers, self.peers))
        return opaque_block(
            "sk_read_last",
            seq(
                [
                    tirx.BufferStore(
                        local,
                        tirx.Select(partial, tirx.BufferLoad(shared, [i]), int_imm(0)),
                        [int_imm(i)],
                    )
                    for shared, local in copies
                    for i in range(int(shared.shape[0]))
                ]
            ),
            reads=[whole(shared) for shared, _ in copies],
            writes=[whole(local) for _, local in copies],
        )

    def _finish(self, seg: Segment, merging=None) -> tirx.Stmt:
        """The last arriver's write-back nest: per element, the sum of the tile's peers'
        partials in peer order, then the original write-back on it (epilogue included).
        ``merging`` is the condition under which the nest runs (default: this block arrived
        last).

        The last arriver reads its own partial back too (from L2, just written) rather than
        from its accumulator: keeping the accumulator live across the hand-off took dlight's
        hybrid on sm_90 from 64 registers to 255 and 728 bytes of spills (ptxas -v); taking
        its own peer's term from the accumulator (a select in the peer walk) took dlight's
        Stream-K on sm_80 from 56 to 80 registers rolled, 72 and 24 bytes of spills unrolled.
        """
        # The recorded walk counts in int32 (block indices); the closed forms multiply a tile by
        # the grid and the iterations, in the blocks' type.
        p = var("sk_peer", "int32" if self.record is not None else dtype_of(seg.block))
        if self.chunked:
            peers, slot = int_imm(self.chunks[1], dtype_of(p)), self._chunk_slot(seg.tile, p, p)
        elif self.record is not None:
            peers, slot = self._recorded_walk(p)
        else:
            peers, slot = self._closed_form_walk(seg, p)
        is_last = tirx.BufferLoad(self.is_last, [int_imm(0)]) != 0
        if merging is not None:
            is_last = merging
        if self.lane is None:
            rewrite = self._scalar_writeback(peers, slot, p, is_last)
            lane_sum = None
        else:
            rewrite = self._lane_writeback()
            lane_sum = opaque_block(
                "sk_lane_sum",
                self._sum_lanes(peers, slot, p),
                reads=[whole(self.workspace)],
                writes=[whole(self.sum)],
            )
        roll = self._rolled_writeback()

        def element_loop(loop: tirx.For):
            # One element at a time (the peer loop inside cannot be vectorised), in a rolled
            # loop where that is leaner (_rolled_writeback). The peer loop is nvcc's to unroll.
            # A lane loop stays vectorised, after the peers' sum of its lanes; the test and the
            # write-back's lane-free guard hold both, evaluated once: no barrier is ever
            # placed inside either.
            if self._is_lane(loop):
                guard = self.lane_guard
                always = isinstance(guard, tirx.IntImm) and bool(int(guard))
                test = is_last if always else tirx.And(is_last, guard)
                return tirx.IfThenElse(test, seq([lane_sum, loop]), None)
            if loop.thread_binding is not None or loop.loop_var.same_as(p):
                return loop
            if roll:
                return tirx.For(
                    loop.loop_var,
                    loop.min,
                    loop.extent,
                    tirx.ForKind.SERIAL,
                    loop.body,
                    None,
                    {**loop.annotations, "disable_unroll": True},
                )
            if int(loop.kind) != int(tirx.ForKind.VECTORIZED):
                return loop
            return with_body(loop, loop.body, tirx.ForKind.SERIAL)

        return structural_map(
            prune_to(self.tile_body, {self.writeback.name_hint}, rewrite), (tirx.For, element_loop)
        )

    def _scalar_writeback(self, peers, slot, p, is_last):
        """The write-back realize rewritten to sum one element over the peers into ``sk_sum``
        and write it back from there; the last-arriver test joins the block predicate, not an
        enclosing branch, so ThreadSync may still place barriers between the nests."""
        zero = [int_imm(0)]
        total = tirx.BufferLoad(self.sum, zero)
        partial = self.memory.load_partial(
            tirx.BufferLoad(self.workspace, [slot, self._linear(self.loops)]),
            self.dtype,
            across_kernels=self.merges_in_own_kernel,
        )
        summed = [
            tirx.BufferStore(self.sum, tirx.const(0, self.dtype), zero),
            tirx.For(
                p,
                int_imm(0, str(p.ty)),
                peers,
                tirx.ForKind.SERIAL,
                tirx.BufferStore(self.sum, total + partial, zero),
            ),
        ]

        def rewrite(realize: SBlockRealize) -> SBlockRealize:
            block = self._from_sum(realize.block, total, summed, scalar=True)
            return SBlockRealize(realize.iter_values, tirx.And(realize.predicate, is_last), block)

        return rewrite

    def _lane_writeback(self):
        """The write-back realize rewritten to read this thread's lane of ``sk_sum``, which
        the lane sum (:meth:`_sum_lanes`) filled before the lane loop."""
        total = tirx.BufferLoad(self.sum, [self.lane.loop_var])

        def rewrite(realize: SBlockRealize) -> SBlockRealize:
            block = self._from_sum(realize.block, total, [], scalar=False)
            return SBlockRealize(realize.iter_values, tirx.const(True), block)

        return rewrite

    def _from_sum(self, block: SBlock, total, summed: list, scalar: bool) -> SBlock:
        """The write-back ``block`` reading the merged sum from a register (``total``), not the
        merged buffer: writing it back to a shared staging buffer would need barriers inside
        the last arriver's branch."""
        merged = loaded_buffer(self.acc_load)

        def from_sum(load):
            return total if loaded_buffer(load).same_as(merged) else load

        return replace_block(
            block,
            name_hint=block.name_hint + "_sk_fixup",
            body=seq([*summed, structural_map(block.body, (BufferLoadNode, from_sum))]),
            reads=[
                *[r for r in block.reads if not loaded_buffer(r).same_as(merged)],
                *([whole(self.workspace)] if scalar else []),
                *([] if self.merges_in_own_kernel else [whole(self.is_last)]),
                whole(self.sum),
            ],
            writes=[*block.writes, *([whole(self.sum)] if scalar else [])],
            annotations={},
        )

    # -- where the peers are -------------------------------------------------------------------

    def _chunk_slot(self, tile, chunk, like) -> tirx.Expr:
        """A batch-invariant kernel's slot of ``chunk`` of ``tile``, in ``like``'s type: its
        peers are the tile's chunks, summed in chunk order (module docstring)."""
        dtype = "int64" if self.wide else dtype_of(like)
        return cast_to(dtype, tile) * self.chunks[1] + cast_to(dtype, chunk)

    def _closed_form_walk(self, seg: Segment, p):
        """The peer count of the segment's tile and the slot of its peer ``p``, from the plan's
        closed forms, in the blocks' type (the tile, int32 where it fits, widened to it)."""
        plan, panels = self.plan, self.site.panels
        tile = cast_to(dtype_of(seg.block), seg.tile)
        # The divisions truncate (_ir.truncating; the Ops contract allows it): a floor division
        # by a value TVM cannot sign is a division, a modulo and a sign test.
        peers = truncating(plan.tile_peers(tile, TIR_OPS, self.grid))
        peer = plan.peer_block(tile, p, TIR_OPS, self.grid)
        peer_lo, _ = plan.block_range(peer, 0, TIR_OPS, self.grid)
        return peers, truncating(self._slot(peer, tirx.floordiv(peer_lo, panels) == tile))

    def _record_peers(self, seg: Segment) -> tirx.Stmt:
        """A partial segment records its place among the tile's peers: the first peer (it
        holds panel 0) its slot, the last peer (it holds panel ``P - 1``) its block.

        Under a grid read at run time every block holds an iteration (never more blocks than
        iterations, ``Policy.run_time_grid``), so a tile's peers are the consecutive blocks
        from its first to its last peer (``StreamK.peer_block``), and every peer but the first
        starts its range inside the tile: its partial is in its first slot. The last arriver
        needs only these two numbers (:meth:`_recorded_walk`); both peers are partial (the tile
        is split) and record before they arrive.
        """
        index = seg.tile * 2
        first_slot = cast_to("int32", self._slot(seg.block, seg.index == 0))
        return seq(
            [
                tirx.IfThenElse(
                    seg.k_begin == 0, tirx.BufferStore(self.record, first_slot, [index]), None
                ),
                tirx.IfThenElse(
                    seg.k_end == tile_panels(self.site, seg),
                    tirx.BufferStore(self.record, cast_to("int32", seg.block), [index + 1]),
                    None,
                ),
            ]
        )

    def _read_record(self, seg: Segment, verdict) -> tirx.Stmt:
        """The last arriver's leader reads its tile's peer record (like the partials, after its
        arrival) into shared memory for its block; any other leader writes zeros."""
        values = [
            self.memory.handed_off(tirx.BufferLoad(self.record, [seg.tile * 2 + i]), "int32")
            for i in range(2)
        ]
        zero = int_imm(0)
        return tirx.IfThenElse(
            verdict != 0,
            seq(
                [tirx.BufferStore(self.shared_peers, v, [int_imm(i)]) for i, v in enumerate(values)]
            ),
            seq([tirx.BufferStore(self.shared_peers, zero, [int_imm(i)]) for i in range(2)]),
        )

    def _recorded_walk(self, p):
        """The peer count of the segment's tile and the slot of its peer ``p``, from what its
        first and last peers recorded (:meth:`_record_peers`), as the block's leader read it."""
        first_slot = tirx.BufferLoad(self.peers, [int_imm(0)])
        last_block = tirx.BufferLoad(self.peers, [int_imm(1)])
        per_block = self.plan.slots_per_block
        first = tirx.truncdiv(first_slot, per_block) if per_block > 1 else first_slot
        peers = last_block - first + 1
        # Every later peer's partial is in its first slot (_slot).
        slot = tirx.Select(p == 0, first_slot, (first + p) * per_block)
        return peers, slot

    def _rolled_writeback(self) -> bool:
        """Whether the last arriver walks the tile's elements in rolled loops.

        Unrolled, every element repeats the peer walk's closed forms and its own part of the
        write-back, and nvcc keeps their values live across the copies: 102 registers against
        the data-parallel kernel's 80 for a ResNet-50 convolution's implicit GEMM on sm_80 (80
        rolled), 36 bytes of spills in a MetaSchedule split-K on sm_90 (none rolled), 112 against
        94 for dlight's WMMA split-K on sm_80 (100 rolled); ``tests/transform/test_ptxas.py``.
        The walk is the last arriver's alone, once per split tile. A write-back that reads another
        register buffer than the accumulator keeps the unrolled form: indexed by a rolled loop,
        that buffer would move to local memory.

        A run-time tile count kept it too while its walk divided 64-bit values by run-time
        counts (rolled, nvcc kept their quotients live: 80 registers and 48 bytes of spills for
        dlight's dynamic-M kernel on sm_80, against 96 and none). With the peer record rolled
        measures alike or leaner: 72 registers either way on sm_80, 56 against 62 on sm_90;
        the grouped GEMM's 64 on sm_80 either way. With a lane loop (:func:`_lane_loop`) a
        run-time tile count keeps the unrolled form: rolled, the same kernel on sm_80 took 64
        registers and 28 bytes of spills, unrolled 72 and none (56 either way on sm_90).
        """
        if self.lane is not None and self.site.runtime_tiles:
            return False
        registers = []

        def visit(load) -> None:
            buffer = loaded_buffer(load)
            if buffer.scope() == "local" and not buffer.same_as(self.site.merged):
                registers.append(buffer)

        structural_walk(self.writeback.body, (BufferLoadNode, visit))
        return not registers

    def _sum_lanes(self, peers, slot, p) -> tirx.Stmt:
        """The sum over the tile's peers of this thread's lanes (:func:`_lane_loop`) in
        ``sk_sum``, each peer's lanes read as one access (the memory model's) and added as a
        vector."""
        lanes = int(self.lane.extent)
        # The slot's elements with the lanes innermost (_linear): this thread's lanes are the
        # run of its other loops' index.
        group = self._linear([lp for lp in self.loops if not self._is_lane(lp)])
        decls, value = self.memory.read_lanes(
            self.workspace, slot, group, lanes, self.dtype, self.merges_in_own_kernel
        )
        everything = [tirx.Ramp(int_imm(0), 1, lanes)]
        zero = tirx.Broadcast(tirx.const(0, self.dtype), lanes)
        add = tirx.BufferStore(self.sum, tirx.BufferLoad(self.sum, everything) + value, everything)
        walk = tirx.For(p, int_imm(0, str(p.ty)), peers, tirx.ForKind.SERIAL, add)
        return seq([*decls, tirx.BufferStore(self.sum, zero, everything), walk])

    def prologue(self) -> tirx.Stmt | None:
        """A kernel zeroing the arrival counters (the pool hands out uninitialised memory)."""
        if not self.active:
            return None
        threads = 128
        tiles = self.counter_tiles
        # A run-time tile count (int64) gives the kernel an extent computed at run time.
        dtype = self.site.index_dtype if isinstance(tiles, int) else dtype_of(tiles)
        b, t = var("sk_count_block", dtype), var("sk_count_thread", dtype)
        index = b * threads + t
        store = opaque_block(
            "sk_arrivals_zero",
            tirx.BufferStore(self.arrivals, int_imm(0), [index]),
            writes=[whole(self.arrivals)],
            predicate=index < tiles,
        )
        thread = bound_loop(t, threads, store, "threadIdx.x")
        if isinstance(tiles, int):
            return bound_loop(b, int_imm((tiles + threads - 1) // threads, dtype), thread)
        return bound_loop(b, tirx.floordiv(tiles + (threads - 1), threads), thread)


def _lane_loop(path: list, dtype: str, memory):
    """The write-back's innermost loop when it is vectorised and each thread can store and read
    its lanes of a slot as one access (``memory.lanes_in_one_access``), with the write-back's
    guard written without the lane; ``(None, None)`` otherwise (the Slots paragraph of the
    module docstring).

    The loop directly holds the write-back block and its guard does not depend on the lane:
    the last arriver reads all of a thread's lanes, so the writer must have stored them all.
    The lanes must make one access each way; otherwise the threads-innermost scalar layout
    moves fewer memory sectors (a warp's scalar read of one float32 lane covers 128 consecutive
    bytes; two 8-byte reads per thread on a 16-byte stride each cover 512 bytes for 256 used).
    """
    none = (None, None)
    if len(path) < 2 or not isinstance(path[-2], tirx.For):
        return none
    loop, realize = path[-2], path[-1]
    if int(loop.kind) != int(tirx.ForKind.VECTORIZED) or not isinstance(loop.min, tirx.IntImm):
        return none
    if int(loop.min) != 0 or int(loop.extent) < 2:
        return none
    if not memory.lanes_in_one_access(int(loop.extent), dtype):
        return none
    guard = _without_lane(realize.predicate, loop)
    return none if guard is None else (loop, guard)


def _without_lane(expr, lane: tirx.For):
    """``expr`` written without the lane loop's variable, or None where it depends on the
    lane. A guard may name the lane and not depend on it: ``(4 x + lane) // 32`` for lanes
    below 4."""
    analyzer = arith.Analyzer()
    analyzer.bind(lane.loop_var, tvm.ir.Range.from_min_extent(lane.min, lane.extent))
    simplified = analyzer.simplify(expr)
    return None if uses_var(simplified, lane.loop_var) else simplified


def _tag(loop: tirx.For) -> str:
    return loop.thread_binding.thread_tag if loop.thread_binding is not None else ""


def find_block_path_below(stmt, name: str) -> list:
    """Statements from ``stmt`` down to the realize of block ``name``."""
    wrapper = tirx.PrimFunc([], stmt)
    return find_block_path(wrapper, name)


def _accumulator_load(block: SBlock, acc: tirx.Buffer):
    loads = []

    def visit(load) -> None:
        if loaded_buffer(load).same_as(acc):
            loads.append(load)

    structural_walk(block.body, (BufferLoadNode, visit))
    if not loads or any(not structural_equal(a.indices, loads[0].indices) for a in loads[1:]):
        raise StreamKError(
            COND_WRITEBACK,
            f"write-back block {block.name_hint!r} reads the accumulator {acc.name} "
            f"{len(loads)} times at different elements",
            "The write-back must read one accumulator element per output element.",
        )
    return loads[0]

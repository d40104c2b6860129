"""``LowerStreamK``: rewrite blocks annotated by ``tvm_streamk.stream_k`` into persistent kernels.

For each annotated reduction block the pass replaces the ``blockIdx`` tile band around it with::

    for b in blockIdx.x(grid):                    # one block per plan entry
      for u in range(units):                      # ranges of flattened (tile, panel) iterations
        lo, hi = plan.block_range(b, u)
        for s in range(ceil(hi / P) - lo // P if lo < hi else 0):  # one segment per tile touched
          tile = lo // P + s;  k0 = max(lo - tile * P, 0);  k1 = min(hi - tile * P, P)
          <band coordinates> = tile_order(tile)
          <original tile body, panel loop over [k0, k1)>

The original body is kept whole (thread loops, shared-memory staging, barriers, micro-kernel), so
``ThreadSync`` and the rest of the pipeline treat it as before. The closed forms come from
:mod:`tvm_streamk.decomposition`, evaluated on TIR expressions: the kernel and the Python plan
cannot disagree. A segment that covers its whole tile writes it back as before; any other
segment merges its partial sums through the fix-up the decision names (:mod:`.fixup_atomic`,
:mod:`.fixup_workspace`), which may add a prologue kernel and buffers of its own. Split-K with a
split dividing the panel count takes a simpler aligned form (:func:`_aligned_nest`).

The pass runs first in the ``tvm_streamk`` pipeline, while blocks and ``T.init`` still exist.
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import tirx

from .. import decomposition, fixup_registry
from .._compat import (
    SBlock,
    SBlockRealize,
    dtype_of,
    replace_block,
    structural_map,
    structural_walk,
)
from ..analysis import StreamKSite, analyze, blocks_under, first_site, ragged_views
from ..decision import DEVICE_SMS, Decision, check, counts_chunks, record, rules
from ..decomposition import chunks
from ..errors import StreamKError
from ..memory_model import for_target
from . import (  # noqa: F401 - registers
    bound_allocations,
    declare_occupancy,
    device_sms,
    drop_unused_binds,
    fixup_atomic,
    fixup_separate,
    fixup_workspace,
    ragged_k,
    tile_space,
)
from ._ir import (
    TIR_OPS,
    Segment,
    bound_loop,
    cast_to,
    fresh_copy,
    host_branch,
    index_dtype,
    int_imm,
    opaque_bind,
    over_units,
    reads_ranges_per_unit,
    segment_dtype,
    seq,
    tile_count_check,
    truncating,
    var,
    with_body,
)
from .localize import localize_accumulator


def make_fixup(site: StreamKSite, plan, decision, target, tile_body, grid, chunk_grid=None):
    """The fix-up object that merges partial tiles for this decision."""
    if target is None:
        raise StreamKError(
            "target",
            "a function without a target attribute",
            "Lower through tvm.compile(..., target=...) or tvm_streamk.lower(mod, target).",
        )
    fixup = fixup_registry.get(decision.fixup)
    return fixup(site, plan, target, decision.group or None, tile_body, grid, chunk_grid)


def chunk_grid(site: StreamKSite, decision: Decision) -> tuple[int, int] | None:
    """``(panels per chunk, chunks per tile)`` of a batch-invariant decision whose plan counts
    chunks (:mod:`tvm_streamk.decomposition.chunks`); None otherwise, and for a tensor-core
    fragment, whose plan is the aligned split of its own panels, one block per chunk."""
    if not counts_chunks(site, decision.chunk):
        return None
    return decision.chunk, chunks.chunk_count(site.panels, decision.chunk)


def rewrite(
    func: tirx.PrimFunc,
    block_name: str,
    target,
    decision: Decision | None = None,
    *,
    unchecked: list | None = None,
) -> tirx.PrimFunc:
    """Rewrite the Stream-K decision recorded on ``block_name`` in ``func`` (or ``decision``).

    Step 1: check the decision (:func:`tvm_streamk.decision.check`, as every entry point
    does) and take its plan. Step 2: rewrite the tile band into the persistent nest.

    With ``unchecked`` (a list), a kernel kept as written at a run-time tile count is kept
    without :func:`~tvm_streamk.transform.bound_allocations.bounded_as_written` (a second
    buffer compaction, 10-20 ms) and its block's name appended: the caller builds the module,
    whose ``BoundRunTimeAllocations`` refuses what TVM did not bound, and lowers again
    without ``unchecked`` if the build fails (:func:`tvm_streamk.pipeline.stream_k_pipeline`).
    """
    site = analyze(func, block_name)
    if decision is None:
        decision = record.decode(site.block.annotations, block_name)
    plan = check(site, decision, target)
    if target is not None and for_target(target).index_bits == 32:
        site = dataclasses.replace(site, index_bits=32)
    chunked = chunk_grid(site, decision)
    root_realize: SBlockRealize = func.body
    root = root_realize.block

    def strip(block: SBlock) -> SBlock:
        if block.name_hint == block_name:
            return replace_block(block, annotations=record.stripped(block.annotations))
        return block

    persistent_when = True
    if site.runtime_tiles and site.ragged is None and chunked is None:
        # A run-time tile count: the policy may keep the kernel as written for some counts.
        # Not a batch-invariant one of several chunks: the kernel as written sums its panels
        # in one pass, and every count must sum the chunks in chunk order.
        persistent_when = plan.scheme.run_time_persistent(plan, TIR_OPS, decision.fixup)
    # A grouped GEMM's data-parallel kernel walks the tiles the groups hold; a ragged
    # reduction's (a weight gradient's) is the kernel as written, its panels past a group's
    # rows reading zeros from the views (where TVM can bound it, below).
    whole_tiles = plan.scheme.is_original and site.ragged is not None and not site.ragged.reduction
    as_written = persistent_when is False or (
        plan.scheme.is_original and (chunked is None or chunked[1] == 1)
    )
    if as_written and rules.walks_reserved_grid_z(site, target):
        # The kernel as written binds blockIdx.z, which TVM's WebGPU runtime keeps for wide
        # grids and its WGSL generator refuses (the reference schedule's batch, even one wide):
        # the same tiles, one block each, walked on blockIdx.x by the data-parallel plan's own
        # closed forms (rules.check_index_width bounds them). Found by a WebGPU campaign of
        # the workload fuzz (tests/backends/test_webgpu.py).
        as_written, whole_tiles = False, True
    checks_bounds = as_written and site.runtime_tiles
    checks_bounds = checks_bounds and (site.ragged is None or site.ragged.reduction)
    if checks_bounds and unchecked is not None:
        unchecked.append(block_name)
    elif checks_bounds and not bound_allocations.bounded_as_written(func):
        # The kernel as written, at a run-time tile count, has a staging buffer TVM's buffer
        # compaction does not narrow to one block's tile (sized over the whole run-time axis;
        # stock TVM refuses the kernel too): the persistent walk, which bounds it, runs every
        # count, data-parallel's as one block per tile. Found by the knob fuzz (the reference
        # schedule's 8 x 8 x 4 tiles at N = 2 and K = 3, 4 or 8); its 16 x 16 x 8 tiles at
        # N = 40, K = 256 are another. The kernel as written beside a persistent one
        # (``persistent_when`` an expression) is not checked: TVM bounded the 16 x 16 x 8
        # kernel there and not alone (tests/transform/test_runtime_tiles.py), and a check of
        # the kernel alone would walk it needlessly. A ragged reduction's (a grouped weight
        # gradient's, found by the workload fuzz: N = 1 in 8 x 8 x 4 tiles, the token rows'
        # panels sized over every token) walks one block per tile over its group's panels, in
        # token order: the kernel as written's bits, whatever the other groups hold.
        persistent_when, as_written = True, False
        whole_tiles = site.ragged is not None
    if whole_tiles and _ragged_k(site):
        # A ragged reduction's: one block per tile (ragged_k.whole_tile_range); the plan
        # counts its iterations, as the ragged walk's does.
        plan = decomposition.plan_at_run_time(
            site.tile_count, site.panels, site.ragged.real_tiles, 1, "stream_k"
        )
    elif whole_tiles and site.ragged is not None:
        # A grouped GEMM's data-parallel kernel: one block per tile the groups hold (the
        # closed forms of Stream-K on as many blocks as tiles), not the padded band. A
        # batch-invariant one walks its tile's chunks, merged in chunk order.
        units = site.panels if chunked is None else chunked[1]
        plan = decomposition.plan_at_run_time(site.tile_count, units, 1, 1, "stream_k")
    elif as_written:
        # The original kernel already is this decomposition (a batch-invariant one of a single
        # chunk too: its panel loop is the canonical order), or is what the policy runs for
        # every run-time count.
        return func.with_body(structural_map(func.body, (SBlock, strip)))

    # A batch-invariant plan counts chunks: the persistent walk cuts them (_persistent_nest).
    # Where blockIdx.z is not the kernel's (WebGPU), the same plan walks persistently.
    aligned = rules.takes_aligned_nest(plan, chunked is not None, target)
    if aligned and decision.group:
        # The aligned nest keeps the band's loops, in their own row-major order: no tile order
        # applies, and a fix-up that finds a tile's coordinates from its index (the separate
        # fix-up's second kernel) must find them in that order. Found by the knob fuzz: with
        # group=2 it merged split-K's partials into the wrong tiles (9 x 9 x 5 in 8 x 8 x 4
        # tiles: 14 outputs never written; 16 x 16 x 8: relative error 1.3).
        decision = dataclasses.replace(decision, group=0)
    # Fragments are addressed through intrinsics, not element indices: nothing to localize.
    tile_body = site.band[-1].body
    if not site.fragment_accumulator:
        tile_body = localize_accumulator(tile_body, site)
    extra_buffers: list = []
    device_grid = None
    if decision.num_sms == DEVICE_SMS or site.runtime_tiles:
        device_grid = var("sk_grid", index_dtype(site, plan, runtime_grid=True))
    if whole_tiles and chunked is None:
        fixup = tile_space.WholeTiles(site, plan, target, None, tile_body, device_grid)
    else:
        fixup = make_fixup(site, plan, decision, target, tile_body, device_grid, chunked)
    if aligned:
        main = _aligned_nest(site, plan, fixup, strip, tile_body)
    else:
        main = _persistent_nest(
            site, plan, decision, fixup, strip, tile_body, device_grid, chunked, whole_tiles
        )
    nests = [tile_space.group_offsets_kernel(site), fixup.prologue(), main, fixup.epilogue()]
    if device_grid is not None:
        persistent = _bind_runtime_grid(
            device_grid, plan, decision, seq(nests), target, site, whole_tiles
        )
        nests = [tile_count_check(site, plan), persistent]
        if persistent_when is not True:
            # Where the persistent kernel would run one block per tile, the host launches the
            # kernel as written: the same tiles at its own registers and occupancy.
            original, own = fresh_copy(
                structural_map(site.band[0], (SBlock, strip)), _used(root.alloc_buffers, site)
            )
            extra_buffers += own
            nests = [
                nests[0],
                host_branch(persistent_when, persistent),
                host_branch(tirx.Not(persistent_when), original),
            ]
    band_var = site.band[0].loop_var

    def swap_band(loop: tirx.For):
        if loop.loop_var.same_as(band_var):
            return seq(nests)
        return loop

    new_root = replace_block(
        root,
        body=structural_map(root.body, (tirx.For, swap_band)),
        alloc_buffers=[
            *root.alloc_buffers,
            *tile_space.buffers(site),
            *fixup.buffers,
            *extra_buffers,
        ],
    )
    func = func.with_body(SBlockRealize(root_realize.iter_values, root_realize.predicate, new_root))
    if decision.declares_occupancy:
        func = declare_occupancy.record(func, decision.blocks_per_sm)
    return func.with_attr(drop_unused_binds.LOWERED_ATTR, True)


def _used(buffers, site: StreamKSite) -> list:
    """Those of ``buffers`` (the root block's) the tile band uses."""
    used: list = []

    def on_var(v) -> None:
        if any(v.same_as(b) for b in buffers) and not any(v.same_as(u) for u in used):
            used.append(v)

    structural_walk(site.band[0], (tirx.Var, on_var))
    return used


def _bind_runtime_grid(
    grid: tirx.Var, plan, decision, body: tirx.Stmt, target, site: StreamKSite, whole_tiles=False
) -> tirx.Stmt:
    """``body`` with ``grid`` read from the device: one block per resident slot, never more
    than the plan's run-time bound.

    The host binds the count and launches that many blocks. Each kernel reads it back through
    :func:`~._ir.opaque_bind` rather than using the host's variable, whose value is a call the
    region analysis cannot bound (every per-block buffer would be sized for the whole matrix).

    Where the target's memory model asks for it (OpenCL, :mod:`tvm_streamk.memory_model.opencl`:
    the dlight schedule's vectorised zeroing for the atomic fix-up did not compile,
    tests/decision/test_knob_fuzz.py) the divisions by the count truncate. The closed forms divide
    non-negative values by this positive count, where the two divisions agree. CUDA keeps the
    floor division: the truncating one cost the sm_80 workspace kernel a register it then
    spilled (4 to 56 bytes).

    A grouped GEMM's tile count is only known on the device: the host launches every slot, and
    each kernel binds the count it reads (:func:`~.tile_space.bind_tile_count`), computes the
    policy's grid from it, and leaves the blocks beyond that grid idle. Its data-parallel
    kernel (``whole_tiles``) launches a block for each tile the groups may hold and keeps one
    per tile busy.
    """
    dtype = dtype_of(grid)
    if decision.num_sms == DEVICE_SMS:
        slots = cast_to(dtype, device_sms.placeholder() * decision.blocks_per_sm)
    else:
        slots = int_imm(plan.runtime_grid_bound(), dtype)
    truncate = target is not None and for_target(target).truncating_divisions

    def kernel(loop: tirx.For):
        if loop.kind != tirx.ForKind.THREAD_BINDING or not loop.extent.same_as(grid):
            return loop
        inner, binds = opaque_bind("sk_num_blocks", grid, dtype)
        if site.ragged is not None:
            # The blocks the tile count read on the device keeps busy; the others idle.
            # At least one, the divisor of the closed forms: no group may hold a row.
            if whole_tiles and _ragged_k(site):
                launched = int_imm(site.ragged.real_tiles, dtype)
            elif whole_tiles:
                launched = site.ragged.tiles
            else:
                launched = plan.scheme.run_time_grid(plan, inner, TIR_OPS, decision.fixup)
            launched = tirx.Select(site.ragged.tiles > 0, launched, int_imm(1, dtype))
            inner, active = opaque_bind("sk_active_blocks", launched, dtype)
            binds += active
        kernel_body = structural_map(
            loop.body, (tirx.Var, lambda v: inner if v.same_as(grid) else v)
        )
        if site.ragged is not None:
            # No branch around the body (it holds barriers): the blocks from ``inner`` on get
            # empty ranges (``over_units(..., idle=True)``).
            kernel_body = seq(tile_space.bind_tile_count(site, seq([*binds, kernel_body])))
            binds = []
        if truncate:
            kernel_body = truncating(kernel_body, inner)
        return with_body(loop, seq([*binds, kernel_body]))

    launched = tirx.min(slots, int_imm(plan.runtime_grid_bound(), dtype))
    if whole_tiles:
        launched = cast_to(dtype, site.ragged.tile_bound)
    elif isinstance(plan, decomposition.RuntimeTilesPlan) and site.ragged is None:
        # The policy's grid for the run-time tile count (every block owns an iteration).
        launched = cast_to(
            dtype, plan.scheme.run_time_grid(plan, launched, TIR_OPS, decision.fixup)
        )
    return seq([tirx.Bind(grid, launched), structural_map(body, (tirx.For, kernel))])


def _persistent_nest(
    site, plan, decision, fixup, strip, tile_body, device_grid=None, chunked=None, whole_tiles=False
) -> tirx.Stmt:
    panels = site.panels
    # Blocks and ranges in the type their largest intermediate needs; the segment values
    # (below the tile and panel counts) in int32 where those fit (_ir.segment_dtype).
    dtype = index_dtype(site, plan, runtime_grid=device_grid is not None)
    own = segment_dtype(site, plan, dtype)
    seg = Segment(
        block=var("sk_block", dtype),
        index=var("sk_segment", own),
        tile=var("sk_tile", own),
        k_begin=var("sk_k_begin", own),
        k_end=var("sk_k_end", own),
        full=var("sk_full", "bool"),
        chunk=var("sk_chunk", own) if chunked is not None else None,
        panels=var("sk_tile_panels", own) if _ragged_k(site) else None,
    )
    tile, k0, k1 = seg.tile, seg.k_begin, seg.k_end
    # A run-time tile count's walk reads its ranges back through registers (over_units, walk):
    # a block's range, and a run-time M's segment range.
    opaque_range = site.runtime_tiles and site.ragged is None
    # A grouped GEMM's Stream-K walk reads back its block's range only. Its value, the
    # iterations times the block over a grid computed from the tile count, inlined into every
    # use: TVM's CompactBufferAllocation, bounding each access indexed by a segment's tile
    # (workspace slots, counters, the group search), took 38 s on the batch-invariant kernel
    # (5 s on the workspace kernel), and ptxas spilled the sm_90 workspace kernel (48
    # registers, 56 B of spills); read back, 0.4 s and 60 registers, the panel loop 205 SASS
    # instructions against 222. With its segments' range too the panel loops grew
    # (data-parallel 233 against 198), and the data-parallel walk keeps its inlined range
    # (``whole_tiles``; 218 against 198 read back). A ragged reduction reads back neither: with
    # the block's range read back ptxas spilled its sm_90 workspace kernel (72 B).
    opaque_units = site.runtime_tiles and not _ragged_k(site) and not whole_tiles
    band_body = tile_body
    tile_body = _ranged(tile_body, site, seg, fixup, strip, k1 - k0)

    per_unit_ranges = reads_ranges_per_unit(plan, device_grid)
    # Where a tile is one K-panel and each unit's range is read back, the tile is the range's
    # start plus the segment, and buffer compaction offsets the staging buffers by its
    # coordinates written through the range read back, the accesses through the variable:
    # TVM 0.27's FlattenBuffer divides by zero simplifying the difference of the two column
    # remainders (``tile % tiles_n``), as it did the chunks' (chunk_walk reads its
    # coordinates back likewise). Found by the knob fuzz: every hybrid of the reference
    # schedule with one K-panel stopped there (103 x 133 x 1 in 8 x 8 x 4 tiles;
    # tests/transform/test_one_panel_shared.py; dlight's built). Read back as symbols, the
    # coordinates give the compaction nothing to subtract. The price, in dlight's one-panel
    # hybrids on sm_80 and sm_90: none, but for 4096 x 1024 x 16 on sm_90, 72 registers
    # against 64 (data-parallel 56).
    opaque_tiles = per_unit_ranges and panels == 1

    def chunk_walk(lo, hi, may_be_empty: bool) -> tirx.Stmt:
        # A batch-invariant plan's range counts chunk iterations, ``tile * n + chunk``: one
        # segment per chunk, each accumulated from zero over its own panels and merged by the
        # fix-up in chunk order (decomposition.chunks), even where one block runs a whole tile.
        chunk, count = chunked
        unit = lo + cast_to(dtype, seg.index)
        extent = cast_to(own, hi - lo)
        if may_be_empty:
            extent = tirx.Select(lo < hi, extent, int_imm(0, own))
        # Where each unit's range is read back inside the unit loop (a hybrid with Stream-K
        # tiles, _ir.reads_ranges_per_unit), the chunk and the tile's coordinates are read back
        # as symbols: buffer compaction offsets the staging buffers by the chunk's first panel
        # and the tile's coordinates written through the range read back, the accesses through
        # the variable, and TVM 0.27's FlattenBuffer divides by zero simplifying the difference
        # of two such remainders (``iter_map_simplify`` of ``(a + s) % 4 - (b + s) % 4``, even
        # with a = b). Found by the knob fuzz: batch-invariant hybrids whose chunks divide the
        # panels evenly stopped in TVM's pipeline (tests/transform/test_batch_invariance.py);
        # the chunk written as the unit less its tile's first chunk mended those, but TVM's
        # simplifier turns that back into the remainder where the chunks are one panel each
        # (9 x 1 x 5 in 8 x 8 x 4 tiles). Read back, the batch-invariant hybrids of the ptxas
        # suite's reference and dlight schedules and of 16 x 8 x 4 tiles keep their registers
        # (sm_80 and sm_90). Elsewhere the remainder stays: with the subtraction the
        # batch-invariant grouped workspace kernel on sm_90 kept the tile live and spilled 8
        # bytes at its estimated grid's 48 registers.
        reads: list = []
        if per_unit_ranges:
            chunk_of_unit, reads = opaque_bind(
                "sk_unit_chunk", unit - tirx.floordiv(unit, count) * count, own, 0, count - 1
            )
        else:
            chunk_of_unit = tirx.floormod(unit, count)
        if count == 1:
            k_begin, k_end = int_imm(0, own), int_imm(panels, own)
        else:
            k_begin = seg.chunk * chunk
            k_end = k0 + chunk if chunk * count == panels else tirx.min(k0 + chunk, panels)
        segment = seq(
            [
                tirx.Bind(tile, cast_to(own, tirx.floordiv(unit, count))),
                *reads,
                tirx.Bind(seg.chunk, cast_to(own, chunk_of_unit)),
                tirx.Bind(k0, k_begin),
                tirx.Bind(k1, k_end),
                *tile_space.coordinates(site, tile, decision.group or None, opaque=per_unit_ranges),
                tirx.Bind(seg.full, tirx.const(count == 1, "bool")),
                tile_body,
                fixup.after_segment(seg),
            ]
        )
        return tirx.For(seg.index, int_imm(0, own), extent, tirx.ForKind.SERIAL, segment)

    def walk(lo, hi, may_be_empty: bool) -> tirx.Stmt:
        # The tiles a range touches are lo // P .. ceil(hi / P) - 1: one segment each. A counted
        # loop, not a while over a mutable cursor, keeps every index a pure function of loop
        # variables, which the region analyses of the rest of the pipeline need.
        # The tile is the narrowed first tile plus the index, not their wide sum narrowed:
        # nvcc then keeps the walk in 32-bit registers (dlight's dynamic-M workspace kernel on
        # sm_80: 72 registers, 96 with the sum narrowed).
        first = tirx.floordiv(lo, panels)
        count = cast_to(own, tirx.floordiv(hi + (panels - 1), panels) - first)
        first_tile, reads = cast_to(own, first), []
        read_back = opaque_range and panels > 1
        if panels == 1:
            # A tile of one panel is one iteration: every segment covers its whole tile. The
            # forms below give the same values, but through the narrowing casts of int64
            # ranges (a Relax matmul's shapes) the analyzer cannot prove ``max(lo - start, 0)``
            # is 0. dlight folds a panel loop of extent 1 out of its shared-memory staging
            # indices but not out of the reduction's, so the staging buffers were sized over
            # every panel the segment might start at, a bound growing with the tiles a block
            # walks: 31,488 bytes of shared memory for 71 x 69 x 9 on three blocks, 2,102,016
            # for 1000 x 1000 x 9, against 6,912 data-parallel. With more panels the staging
            # indices move with the panel loop and keep their size
            # (tests/transform/test_one_panel_shared.py).
            k_begin, k_end = int_imm(0, own), int_imm(1, own)
        elif read_back:
            # A run-time tile count's range is wide (int64). StmtSimplify inlines the segment's
            # tile and panel range into each of their uses (34 in dlight's run-time-M matmul)
            # as arithmetic on it, and what ptxas made of that depended on the panel count:
            # on sm_80 the atomic kernel took 112 registers at K = 3072 (192 panels), holding
            # 4 resident blocks of the 6 the estimated grid counts on, 72 at K = 1024; the
            # workspace kernel 80 and an 8 B stack at any K. So the unit's first tile, its
            # offset into that tile, its end past the tile's start and its segment count are
            # read back through registers once a unit, and a segment's range is arithmetic on
            # them: 72 and 80 registers, no stack, at K = 256 to 4096
            # (tests/transform/test_runtime_tiles.py). The count too: as the loop's bound it
            # kept the range alive (95 registers at K = 3072 without it). The price is on
            # sm_90: ptxas builds the workspace kernel in 56 registers and recomputes panel
            # addresses in its K loop, 1.41 SASS instructions per FMA against 1.29 before and
            # data-parallel's 1.25 (K = 1024; within tests/transform/test_hot_loop.py's 15%).
            start = cast_to(dtype, first) * panels
            first_tile, first_reads = opaque_bind("sk_first_tile", first, own, 0)
            offset, offset_reads = opaque_bind("sk_first_panel", lo - start, own, 0, panels - 1)
            past, past_reads = opaque_bind("sk_past_first", hi - start, dtype, 0)
            reads = [*first_reads, *offset_reads, *past_reads]
            passed = cast_to(dtype, seg.index) * panels
            k_begin = cast_to(own, tirx.max(cast_to(dtype, offset) - passed, 0))
            k_end = cast_to(own, tirx.min(past - passed, panels))
        else:
            start = cast_to(dtype, tile) * panels
            k_begin = cast_to(own, tirx.max(lo - start, 0))
            k_end = cast_to(own, tirx.min(hi - start, panels))
        segment = seq(
            [
                tirx.Bind(tile, first_tile + seg.index),
                tirx.Bind(k0, k_begin),
                tirx.Bind(k1, k_end),
                *tile_space.coordinates(site, tile, decision.group or None, opaque=opaque_tiles),
                tirx.Bind(seg.full, tirx.And(k0 == 0, k1 == panels)),
                tile_body,
                fixup.after_segment(seg),
            ]
        )
        # The trip count holds a Select only where a range can be empty: barriers sit inside
        # this loop, and some OpenCL compilers (PoCL) mishandle them under a selected bound.
        extent = tirx.Select(lo < hi, count, int_imm(0, own)) if may_be_empty else count
        if read_back:
            extent, extent_reads = opaque_bind("sk_segments", extent, own, 0)
            reads += extent_reads
        return seq(
            [*reads, tirx.For(seg.index, int_imm(0, own), extent, tirx.ForKind.SERIAL, segment)]
        )

    grid = int_imm(plan.grid, dtype) if device_grid is None else device_grid
    walker = walk if chunked is None else chunk_walk
    zeros = None
    if _ragged_k(site):
        walker = ragged_k.walker(site, seg, tile_body, fixup, decision.group or None, own)
        zeros = ragged_k.zero_empty_tiles(
            site, seg, band_body, seg.block, grid, decision.group or None
        )
    if _ragged_k(site) and whole_tiles:
        (lo, hi), reads = ragged_k.whole_tile_range(site, seg.block)
        units = seq([*reads, walker(lo, hi, True)])
    else:
        units = over_units(
            plan,
            seg.block,
            walker,
            device_grid,
            idle=site.ragged is not None,
            opaque_range=opaque_units,
        )
    # Keep the schedule's own annotations of the tile band (unroll pragmas, for instance).
    return bound_loop(seg.block, grid, seq([units, zeros]), annotations=site.band[0].annotations)


def _ragged_k(site: StreamKSite) -> bool:
    return site.ragged is not None and site.ragged.reduction


def _ranged(tile_body, site: StreamKSite, seg: Segment, fixup, strip, extent) -> tirx.Stmt:
    """``tile_body`` with the panel loop over ``extent`` panels from ``seg.k_begin``, and the
    write-back blocks handed to the fix-up."""
    panel, begin = site.panel_loop, seg.k_begin
    writeback_names = {wb.block.name_hint for wb in site.writebacks}

    def retarget(block: SBlock) -> SBlock:
        block = strip(block)
        if block.name_hint in writeback_names:
            return fixup.merge_writeback(block, seg)
        return block

    def ranged_panel(loop: tirx.For):
        if not loop.loop_var.same_as(panel.loop_var):
            return loop
        # Substituted rather than bound: block regions hoisted by later passes must see the loop
        # variable itself to relax over it.
        old = loop.loop_var
        k_dtype = dtype_of(old)
        k = var(old.name + "_sk", k_dtype)
        start, size = cast_to(k_dtype, begin), cast_to(k_dtype, extent)
        body = structural_map(loop.body, (tirx.Var, lambda v: k + start if v.same_as(old) else v))
        annotations = loop.annotations
        if int(loop.kind) == int(tirx.ForKind.SERIAL) and "pragma_unroll" not in annotations:
            # One panel an iteration, as nvcc builds the kernel as written's loop: where every
            # segment is a whole tile the trip count is a constant, and nvcc unrolled the loop
            # inside the segment loop where it had not the data-parallel one (dlight's int8
            # SIMT 128 x 256 x 192 on 3 blocks, sm_80: 128 registers against 61; rolled, 56).
            # It rolls the fp32 kernels' loops either way (registers unchanged).
            annotations = {**annotations, "disable_unroll": True}
        return tirx.For(k, int_imm(0, k_dtype), size, loop.kind, body, None, annotations)

    ranged = structural_map(tile_body, [(SBlock, retarget), (tirx.For, ranged_panel)])
    return fixup.with_staged_copies(ranged, seg)


def _aligned_nest(site, plan, fixup, strip, tile_body) -> tirx.Stmt:
    """Aligned split-K: the original tile band, ``S`` blocks per tile, ``P / S`` panels each.

    The band loops stay loops (only ``blockIdx.z`` gains the split), so every index keeps the
    form TVM's analyses expect, and the panel loop keeps a constant trip count, which software
    pipelining and tensor-core fragments need. Block ``tile * S + s`` runs split ``s``.
    """
    splits, dtype = plan.splits, index_dtype(site, plan)
    per = site.panels // splits
    seg = Segment(
        block=var("sk_block", dtype),
        index=int_imm(0, dtype),
        tile=var("sk_tile", dtype),
        k_begin=var("sk_k_begin", dtype),
        k_end=var("sk_k_end", dtype),
        full=var("sk_full", "bool"),
    )
    split = var("sk_split", dtype)

    tile_index = int_imm(0, dtype)
    for loop in site.band:
        tile_index = tile_index * cast_to(dtype, loop.extent) + cast_to(dtype, loop.loop_var)
    body = seq(
        [
            tirx.Bind(seg.tile, tile_index),
            tirx.Bind(seg.k_begin, split * per),
            tirx.Bind(seg.k_end, seg.k_begin + per),
            tirx.Bind(seg.block, seg.tile * splits + split),
            tirx.Bind(seg.full, tirx.const(splits == 1, "bool")),
            _ranged(tile_body, site, seg, fixup, strip, int_imm(per, dtype)),
            fixup.after_segment(seg),
        ]
    )
    z_loop = next((lp for lp in site.band if lp.thread_binding.thread_tag == "blockIdx.z"), None)
    for loop in reversed(site.band):
        if loop is z_loop:
            # blockIdx.z = z * S + split: the division keeps z analysable.
            zz = var("sk_z", dtype)
            body = seq(
                [
                    tirx.Bind(
                        loop.loop_var, cast_to(dtype_of(loop.loop_var), tirx.floordiv(zz, splits))
                    ),
                    tirx.Bind(split, tirx.floormod(zz, splits)),
                    body,
                ]
            )
            body = bound_loop(zz, cast_to(dtype, loop.extent) * splits, body, "blockIdx.z")
        else:
            body = with_body(loop, body)
    if z_loop is None:
        body = bound_loop(split, splits, body, "blockIdx.z")
    return body


# The decision a grouped GEMM without one is lowered by.
WHOLE_TILES = Decision(
    policy="data_parallel",
    variant=None,
    num_sms=1,
    blocks_per_sm=1,
    splits=1,
    fixup="atomic",
    group=0,
)


def annotated_blocks(func: tirx.PrimFunc) -> list[str]:
    """Names of the blocks of ``func`` that carry a Stream-K decision."""
    return [b.name_hint for b in blocks_under(func.body) if record.has_decision(b.annotations)]


def _lowered(func: tirx.PrimFunc, unchecked: list | None) -> tirx.PrimFunc:
    names = annotated_blocks(func)
    target = func.attrs.get("target") if func.attrs is not None else None
    if not names and ragged_views(func) is not None:
        # A grouped GEMM without a decision: its data-parallel kernel over the groups' tiles.
        site = first_site(func)
        if site is not None:
            return rewrite(func, site.block.name_hint, target, WHOLE_TILES, unchecked=unchecked)
    for name in names:
        func = rewrite(func, name, target, unchecked=unchecked)
    return func


def LowerStreamK(unchecked: list | None = None) -> tvm.transform.Pass:
    """Rewrite every block annotated by :func:`tvm_streamk.stream_k` into a Stream-K kernel.

    Every decision is checked again here (:func:`tvm_streamk.decision.check`: a schedule may
    have changed after ``stream_k`` ran, or the decision was written by MetaSchedule or by
    hand); a violated precondition raises :class:`~tvm_streamk.errors.StreamKError`. Functions
    without annotated blocks pass through unchanged. ``unchecked``: as for :func:`rewrite`.
    """
    return tvm.tirx.transform.prim_func_pass(
        lambda func, _mod, _ctx: _lowered(func, unchecked),
        opt_level=0,
        name="tvm_streamk.LowerStreamK",
    )

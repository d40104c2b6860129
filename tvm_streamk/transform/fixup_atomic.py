"""The atomic fix-up: partial tiles are merged by atomic adds into a pre-zeroed output.

A segment that covers its whole tile stores it as the original write-back does; any other
segment atomically adds its partial sums to the output. A prologue kernel, launched first by the
same function, zeroes exactly the split tiles, so nothing else of the output is touched twice.
Fast, but the order of the adds is the order of arrival (not bit-reproducible), the merge happens
in the output dtype, and a write-back that is more than a copy (an epilogue) cannot be split.
CUDA's fp32 atomic add flushes subnormal inputs and results to zero (PTX ``atom``/``red``
``.add.f32``); the OpenCL emulation TVM emits (a compare-and-swap loop) does not, so the CPU
proof keeps subnormal partial sums that a GPU drops.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .. import memory_model
from .._compat import SBlock, SBlockRealize, dtype_of, replace_block
from ..analysis import COND_ATOMIC, COND_EPILOGUE, StreamKSite
from ..errors import StreamKError
from . import fixup, ragged_k, tile_space
from ._ir import (
    Segment,
    bound_loop,
    cast_to,
    fresh_definitions,
    index_dtype,
    int_imm,
    over_units,
    prune_to,
    segment_dtype,
    seq,
    var,
)

# Accumulator dtypes whose atomic merge is exact (int) or as accurate as the serial sum
# (fp32/64): the only ones the atomic fix-up takes.
EXACT_ENOUGH = ("float32", "float64", "int32")


@fixup.register
class AtomicFixup(fixup.Fixup):
    """Merge partial tiles with atomic adds; see the module docstring."""

    name = "atomic"
    code = 0
    auto_rank = 0
    merge_kind = "atomic"
    partial_trips = 1

    @classmethod
    def check(cls, site: StreamKSite, target: tvm.target.Target | None) -> None:
        """Refuse a site the atomic fix-up cannot merge; ``target`` may be None (checked later)."""
        if site.epilogue:
            wb = next(w for w in site.writebacks if not w.plain_copy)
            raise StreamKError(
                COND_EPILOGUE,
                f"write-back block {wb.block.name_hint!r} computes `{wb.block.body.value}` "
                f"into {wb.output.name} ({wb.output.dtype}) from the {site.accumulator_dtype} "
                "accumulator",
                "Atomic adds merge raw partial sums, so a fused epilogue (bias, activation, cast) "
                "would be applied to each partial; use the workspace fix-up (fixup='workspace') "
                "or move the epilogue into its own kernel.",
            )
        if site.fragment_accumulator:
            raise StreamKError(
                COND_ATOMIC,
                f"accumulator {site.accumulator.name} lives in tensor-core fragment scope "
                f"{site.accumulator.scope()!r}, whose elements have no addresses",
                "Use the workspace fix-up (fixup='workspace').",
            )
        if site.accumulator_dtype not in EXACT_ENOUGH:
            raise StreamKError(
                COND_ATOMIC,
                f"a {site.accumulator_dtype} accumulator: atomic adds would round every partial "
                f"sum to {site.accumulator_dtype} as it lands, and OpenCL has no such atomic",
                f"Use the workspace fix-up (fixup='workspace'), which sums in the accumulator "
                f"once, or accumulate in one of {list(EXACT_ENOUGH)}.",
            )
        if target is not None:
            model = memory_model.for_target(target)
            reason = model.atomic_add_error(site.accumulator_dtype)
            if reason is not None:
                # Where hand-offs are not ordered either, only the separate fix-up merges.
                other = "workspace" if model.orders_handoffs else "separate"
                raise StreamKError(
                    COND_ATOMIC,
                    reason,
                    f"Use the {other} fix-up (fixup={other!r}), or accumulate in float32.",
                )

    @classmethod
    def footprint(cls, plan, tile_elems, acc_bytes, out_bytes, blocks):
        """Nothing allocated; the prologue zeroes the split tiles of the output."""
        zeroed = len(plan.split_tiles) * tile_elems * out_bytes
        return fixup.Footprint(workspace_bytes=0, zeroed_bytes=zeroed)

    def __init__(
        self, site: StreamKSite, plan, target, group: int | None, tile_body, grid=None, chunks=None
    ):
        super().__init__(site, plan, target, group, tile_body, grid, chunks)
        self.names = {wb.block.name_hint for wb in site.writebacks}

    def merge_writeback(self, block: SBlock, seg: Segment) -> SBlock:
        """``out[i] = acc[i]`` becomes ``store if the segment is full else atomic add``; a plan
        that splits no tile keeps the plain store."""
        if self.grid is None and not self.plan.split_tiles:
            return block
        store: tirx.BufferStore = block.body
        dtype = str(store.buffer.dtype)
        address = tirx.address_of(tirx.BufferLoad(store.buffer, store.indices))

        def merge(value):
            return tirx.Evaluate(self.memory.atomic_add(dtype, address, value))

        merged, regions = self.partial_merge(block, store.value, seg, merge)
        return replace_block(
            block, body=tirx.IfThenElse(seg.full, store, merged), reads=[*block.reads, *regions]
        )

    def prologue(self) -> tirx.Stmt | None:
        """A kernel zeroing every split tile before the atomic adds land on it.

        A tile is split exactly when some unit range starts strictly inside it (the ranges
        partition the iteration space), so block ``b`` zeroes the tile where each of its ranges
        starts unaligned. Two blocks may zero the same tile: identical stores, a benign race.
        """
        if self.grid is None and not self.plan.split_tiles:
            return None
        site, panels = self.site, self.site.panels

        def zero(realize: SBlockRealize) -> SBlockRealize:
            block = realize.block
            store = block.body
            new_block = replace_block(
                block,
                name_hint=block.name_hint + "_sk_zero",
                reads=[],
                body=tirx.BufferStore(
                    store.buffer, tirx.const(0, dtype_of(store.value)), store.indices
                ),
                annotations={},
            )
            return SBlockRealize(realize.iter_values, realize.predicate, new_block)

        zero_body = prune_to(self.tile_body, self.names, zero)
        dtype = index_dtype(site, self.plan, runtime_grid=self.grid is not None)
        own = segment_dtype(site, self.plan, dtype)
        tile, b = var("sk_zero_tile", own), var("sk_zero_block", dtype)

        def zero_where_split(lo, hi, may_be_empty: bool) -> tirx.Stmt:
            if site.ragged is not None and site.ragged.reduction:
                # Tiles of their own panel counts: the tile is found in the iteration offsets.
                (first, inside), found = ragged_k.starting_tile(site, lo, "sk_zero_first")
            else:
                first, inside, found = tirx.floordiv(lo, panels), tirx.floormod(lo, panels) != 0, []
            body = seq(
                [
                    tirx.Bind(tile, cast_to(own, first)),
                    *tile_space.coordinates(site, tile, self.group),
                    zero_body,
                ]
            )
            return seq([*found, tirx.IfThenElse(tirx.And(lo < hi, inside), body, None)])

        grid = int_imm(self.plan.grid, dtype) if self.grid is None else self.grid
        units = over_units(
            self.plan, b, zero_where_split, grid=self.grid, idle=site.ragged is not None
        )
        return fresh_definitions(bound_loop(b, grid, units))

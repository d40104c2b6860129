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

from .._compat import SBlock, SBlockRealize, dtype_of, target_arch
from ..analysis import COND_ATOMIC, COND_EPILOGUE, StreamKSite
from ..errors import StreamKError
from . import fixup, tile_space
from ._ir import (
    Segment,
    bound_loop,
    cast_to,
    fresh_definitions,
    index_dtype,
    int_imm,
    over_units,
    prune_to,
    replace_block,
    segment_dtype,
    seq,
    var,
)

# Minimum CUDA compute capability of a native atomicAdd per dtype.
CUDA_ATOMIC_MIN_ARCH = {"int32": 0, "float32": 0, "float64": 60, "float16": 70, "bfloat16": 80}
OPENCL_ATOMIC_DTYPES = ("int32", "float32")


def _cuda_arch(target: tvm.target.Target) -> int | None:
    arch = target_arch(target) or ""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    return int(digits[:2] if len(digits) >= 2 else digits) if digits else None


def atomic_dtype_error(dtype: str, target: tvm.target.Target) -> str | None:
    """Why ``target`` has no atomic add for ``dtype``, or None when it has one."""
    kind = target.kind.name
    if kind == "cuda":
        need = CUDA_ATOMIC_MIN_ARCH.get(dtype)
        arch = _cuda_arch(target)
        if need is None:
            return f"a {dtype} accumulator on CUDA, which has no atomicAdd for {dtype}"
        if need and arch is not None and arch < need:
            return (
                f"a {dtype} accumulator on CUDA arch {target.attrs.get('arch')} "
                f"(atomicAdd for {dtype} needs sm_{need} or newer)"
            )
        return None
    if kind == "opencl":
        if dtype not in OPENCL_ATOMIC_DTYPES:
            return (
                f"a {dtype} accumulator on OpenCL, which adds atomically only "
                f"{list(OPENCL_ATOMIC_DTYPES)}"
            )
        return None
    return f"target kind {kind!r}; the atomic fix-up is emitted for CUDA and OpenCL only"


def atomic_add(target: tvm.target.Target, dtype: str, address, value) -> tirx.Expr:
    """The target's atomic ``*address += value`` (returning the old value) as a TIR call."""
    if target.kind.name == "cuda":
        return tirx.call_extern(dtype, "atomicAdd", address, value)
    # TVM's OpenCL codegen turns a float ``atomic_add`` into a compare-and-swap helper of its own;
    # int32 maps to the native builtin.
    return tirx.call_extern(dtype, "atomic_add", address, value)


@fixup.register
class AtomicFixup(fixup.Fixup):
    """Merge partial tiles with atomic adds; see the module docstring."""

    name = "atomic"
    code = 0

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
        if target is not None:
            reason = atomic_dtype_error(site.accumulator_dtype, target)
            if reason is not None:
                raise StreamKError(
                    COND_ATOMIC,
                    reason,
                    "Use the workspace fix-up (fixup='workspace'), or accumulate in float32.",
                )

    @classmethod
    def footprint(cls, plan, tile_elems, acc_bytes, out_bytes, blocks):
        """Nothing allocated; the prologue zeroes the split tiles of the output."""
        zeroed = len(plan.split_tiles) * tile_elems * out_bytes
        return fixup.Footprint(workspace_bytes=0, zeroed_bytes=zeroed)

    def __init__(self, site: StreamKSite, plan, target, group: int | None, tile_body, grid=None):
        super().__init__(site, plan, target, group, tile_body, grid)
        self.names = {wb.block.name_hint for wb in site.writebacks}

    def merge_writeback(self, block: SBlock, seg: Segment) -> SBlock:
        """``out[i] = acc[i]`` becomes ``store if the segment is full else atomic add``."""
        store: tirx.BufferStore = block.body
        dtype = str(store.buffer.dtype)
        address = tirx.address_of(tirx.BufferLoad(store.buffer, store.indices))
        merge = tirx.Evaluate(atomic_add(self.target, dtype, address, store.value))
        return replace_block(block, body=tirx.IfThenElse(seg.full, store, merge))

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
            starts_inside = tirx.And(lo < hi, tirx.floormod(lo, panels) != 0)
            body = seq(
                [
                    tirx.Bind(tile, cast_to(own, tirx.floordiv(lo, panels))),
                    *tile_space.coordinates(site, tile, self.group),
                    zero_body,
                ]
            )
            return tirx.IfThenElse(starts_inside, body, None)

        grid = int_imm(self.plan.grid, dtype) if self.grid is None else self.grid
        units = over_units(
            self.plan, b, zero_where_split, grid=self.grid, idle=site.ragged is not None
        )
        return fresh_definitions(bound_loop(b, grid, units))

"""The fix-up interface the lowering drives.

A *fix-up* merges the partial tiles of split tiles. Each is one :class:`Fixup` subclass in its
own module (:mod:`.fixup_atomic`, :mod:`.fixup_workspace`, :mod:`.fixup_separate`),
registered with :func:`register` into :mod:`tvm_streamk.fixup_registry`, where the decision
layer, MetaSchedule and ``explain`` find it. :class:`~tvm_streamk.transform.LowerStreamK`
drives it through the hooks below, for one annotated block whose decision
:func:`tvm_streamk.decision.check` accepted:

1. the constructor, with the analysed site, the plan, the target, the tile-row group, the tile
   body, the grid variable of a grid read at run time (None for the plan's own grid) and a
   batch-invariant kernel's chunk grid (None otherwise; only a fix-up that ``orders_chunks``
   gets one);
2. ``merge_writeback(block, segment)`` for each write-back block in the persistent nest,
   building its merge through :meth:`Fixup.partial_merge`; then, on the tile body holding
   them, ``with_staged_copies(body, segment)`` (the base class's);
3. ``after_segment(segment)`` once per segment, after the tile body (None for nothing);
4. ``prologue()`` and ``epilogue()``: kernels launched before and after the persistent one
   (None for none);
5. ``buffers``: the buffers the fix-up allocates in the function.

What differs between targets (fences, atomics, how a value another block stored is read) is
the target's :mod:`tvm_streamk.memory_model`, never a switch here.
"""

from __future__ import annotations

from typing import Any, ClassVar

import tvm
from tvm import tirx

from .. import fixup_registry
from .._compat import (
    Call,
    SBlockRealize,
    loaded_buffer,
    replace_block,
    structural_map,
    structural_walk,
)
from ..analysis import find_block_path
from ..fixup_registry import Footprint
from ..memory_model import for_target
from ._ir import fresh_definitions, prune_to, seq

__all__ = ["COUNTER_BYTES", "Fixup", "Footprint", "register"]

# Bytes of one arrival counter (int32).
COUNTER_BYTES = 4
register = fixup_registry.register


class Fixup:
    """A way of merging partial tiles; subclass, set ``name``/``code`` and register.

    Attributes
    ----------
    name : str
        What ``fixup=`` is spelled as.
    code : int
        The fix-up's code in a block's annotations: stable, unique, never reused.
    deterministic : bool
        Whether results are bit-reproducible whatever the arrival order.
    auto_rank : int
        ``fixup="auto"`` takes the lowest-ranked fix-up whose :meth:`auto_ok` holds.
    orders_chunks : bool
        Whether it merges a batch-invariant kernel's chunks in chunk order (the constructor's
        ``chunks``; :mod:`tvm_streamk.decomposition.chunks`).
    merge_kind : str
        How the cost model prices its merges (:mod:`tvm_streamk.cost_model.model`):
        ``"atomic"`` (each partial added in place, the split tiles zeroed first),
        ``"last_arriver"`` (partials written, the tile's last peer reads them) or
        ``"second_kernel"`` (partials written, a kernel after the persistent one reads them).
    partial_trips : int
        Times a partial tile crosses memory: written and read back (2), added in place (1).
    """

    name: ClassVar[str] = ""
    code: ClassVar[int] = -1
    deterministic: ClassVar[bool] = False
    orders_chunks: ClassVar[bool] = False
    merge_kind: ClassVar[str] = "last_arriver"
    partial_trips: ClassVar[int] = 2
    auto_rank: ClassVar[int] = 100

    @classmethod
    def check(cls, site, target) -> None:
        """Raise StreamKError when ``site`` cannot use this fix-up; ``target`` may be None
        before a target is known."""

    @classmethod
    def auto_ok(cls, site, target) -> bool:
        """Whether ``fixup="auto"`` may pick this fix-up for ``site`` (its check passes, by
        default)."""
        try:
            cls.check(site, target)
        except Exception:  # noqa: BLE001 - any refusal means no
            return False
        return True

    @classmethod
    def footprint(cls, plan, tile_elems: int, acc_bytes: int, out_bytes: int, blocks: int):
        """:class:`Footprint` of ``plan`` for tiles of ``tile_elems`` elements, launched on
        ``blocks`` blocks (the plan's grid, or the bound of a grid read at run time)."""
        raise NotImplementedError

    def __init__(self, site, plan, target, group: int | None, tile_body, grid=None, chunks=None):
        self.site, self.plan, self.target, self.group = site, plan, target, group
        # A batch-invariant kernel's chunk grid, ``(panels per chunk, chunks per tile)``; None
        # otherwise. Its plan counts chunks, and every segment is one chunk of one tile.
        self.chunks = chunks
        self.memory = for_target(target)
        self.tile_body = tile_body
        # The launched grid when only known at run time; None for the plan's own grid.
        self.grid = grid
        # Register copies of the accumulator that partial segments merge from
        # (:meth:`partial_merge`): the copy buffer by merged buffer, the copies by write-back.
        self._staging: dict = {}
        self._copies: dict = {}

    @property
    def buffers(self) -> tuple:
        """Buffers the fix-up allocates in the function (a subclass adds its own to these)."""
        return tuple(self._staging.values())

    # -- merging from a partial segment ----------------------------------------------------------
    #
    # A merge may hold a call TVM does not vectorise (an atomic add; OpenCL's bit cast of a
    # partial to int32), and ``VectorizeLoop`` scalarises every statement holding one, its
    # read of the accumulator included. One element-wise read is enough for ``StorageRewrite``
    # to leave the whole accumulator a scalar array: dlight's fp32 tile became ``float
    # acc[16]``, updated in the K loop through ``vload2``/``vstore2``, where the data-parallel
    # kernel has ``float2 acc[8]``. On pip's PoCL, Stream-K and split-K then ran 1.7-2.2x
    # slower than data-parallel per tile, even where nothing was split (issue 31, item 8).
    # So such a merge reads a copy: before the write-back's vectorised loop, a copy of that
    # loop nest stores the partial segment's elements to a small register buffer with
    # vectorised loads and stores, and the merge reads that buffer element-wise. The copy
    # needs a loop nest of its own: a buffer only the write-back touches is allocated and
    # compacted inside the vectorised loop, to one element, which the vectorised copy
    # overwrote lane by lane (wrong sums).

    def partial_merge(self, block, load, seg, merge) -> tuple[Any, list]:
        """``(statement, regions)``: ``merge(value)``, the statement merging a partial segment
        ``seg`` in write-back ``block``, and the regions ``block`` then reads in addition.
        ``value`` is ``load``, an element of the register tile, or its staged copy
        (:meth:`with_staged_copies`) where the merge holds a call, a vectorised loop encloses
        ``block`` and the target's memory model asks for it (``staged_partial_reads``)."""
        stmt = merge(load)
        merged = loaded_buffer(load)
        if not self.memory.staged_partial_reads:
            return stmt, []
        if merged.scope() != "local" or not _holds_call(stmt):
            return stmt, []
        if not self._vectorised(block.name_hint):
            return stmt, []
        stage = self._staging.get(merged)
        if stage is None:
            stage = tirx.decl_buffer(
                merged.shape, merged.dtype, name=merged.name + "_sk_partial", scope="local"
            )
            self._staging[merged] = stage
        indices = list(load.indices)
        copy = tirx.BufferStore(stage, load, indices)
        self._copies.setdefault(block.name_hint, {})[stage] = (copy, _element(merged, indices))
        return merge(tirx.BufferLoad(stage, indices)), [_element(stage, indices)]

    def with_staged_copies(self, body, seg):
        """``body``, a tile body whose write-backs :meth:`merge_writeback` rewrote for segment
        ``seg``, with the copies :meth:`partial_merge` asked for: before each vectorised loop
        holding such a write-back, the same loop nest down to it copying a partial segment's
        elements."""
        if not self._copies:
            return body
        names = set(self._copies)

        def copy(realize):
            block = realize.block
            copies = self._copies[block.name_hint]
            stores = [store for store, _ in copies.values()]
            new_block = replace_block(
                block,
                name_hint=block.name_hint + "_sk_stage",
                body=tirx.IfThenElse(tirx.Not(seg.full), seq(stores), None),
                reads=[region for _, region in copies.values()],
                writes=[_element(store.buffer, list(store.indices)) for store in stores],
                init=None,
                alloc_buffers=[],
                match_buffers=[],
                annotations={},
            )
            return SBlockRealize(realize.iter_values, realize.predicate, new_block)

        def split(loop):
            if int(loop.kind) != int(tirx.ForKind.VECTORIZED):
                return loop
            nest = prune_to(loop, names, copy)
            return loop if nest is None else seq([fresh_definitions(nest), loop])

        return structural_map(body, (tirx.For, split))

    def _vectorised(self, name: str) -> bool:
        """Whether a vectorised loop encloses write-back ``name`` in the tile body."""
        path = find_block_path(tirx.PrimFunc([], self.tile_body), name)
        return any(
            isinstance(s, tirx.For) and int(s.kind) == int(tirx.ForKind.VECTORIZED) for s in path
        )

    def merge_writeback(self, block, seg):
        """The write-back ``block`` rewritten to merge a partial segment ``seg``."""
        raise NotImplementedError

    def after_segment(self, seg) -> Any:
        """A statement run after each segment's tile body, or None."""
        return None

    def prologue(self) -> Any:
        """A kernel launched before the persistent one, or None."""
        return None

    def epilogue(self) -> Any:
        """A kernel launched after the persistent one, or None."""
        return None


def _element(buffer, indices):
    """The region of one element of ``buffer``."""
    return tirx.BufferRegion(buffer, [tvm.ir.Range.from_min_extent(i, 1) for i in indices])


def _holds_call(stmt) -> bool:
    calls = []
    structural_walk(stmt, (Call, calls.append))
    return bool(calls)

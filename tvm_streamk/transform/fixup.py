"""The fix-up interface the lowering drives.

A *fix-up* merges the partial tiles of split tiles. Each is one :class:`Fixup` subclass in its
own module (:mod:`.fixup_atomic`, :mod:`.fixup_workspace`), registered with :func:`register`
into :mod:`tvm_streamk.fixup_registry`, where the decision layer, MetaSchedule and ``explain``
find it. :class:`~tvm_streamk.transform.LowerStreamK` drives it through the hooks below, for one
annotated block whose decision :func:`tvm_streamk.decision.check` accepted:

1. the constructor, with the analysed site, the plan, the target, the tile-row group, the tile
   body and the grid variable of a grid read at run time (None for the plan's own grid);
2. ``merge_writeback(block, segment)`` for each write-back block in the persistent nest;
3. ``after_segment(segment)`` once per segment, after the tile body (None for nothing);
4. ``prologue()``: a kernel launched before the persistent one (None for none);
5. ``buffers``: the buffers the fix-up allocates in the function.

What differs between targets (fences, atomics, how a value another block stored is read) is
the target's :mod:`tvm_streamk.memory_model`, never a switch here.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .. import fixup_registry
from ..fixup_registry import Footprint
from ..memory_model import for_target

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
    """

    name: ClassVar[str] = ""
    code: ClassVar[int] = -1
    deterministic: ClassVar[bool] = False
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

    def __init__(self, site, plan, target, group: int | None, tile_body, grid=None):
        self.site, self.plan, self.target, self.group = site, plan, target, group
        self.memory = for_target(target)
        self.tile_body = tile_body
        # The launched grid when only known at run time; None for the plan's own grid.
        self.grid = grid

    @property
    def buffers(self) -> tuple:
        """Buffers the fix-up allocates in the function."""
        return ()

    def merge_writeback(self, block, seg):
        """The write-back ``block`` rewritten to merge a partial segment ``seg``."""
        raise NotImplementedError

    def after_segment(self, seg) -> Any:
        """A statement run after each segment's tile body, or None."""
        return None

    def prologue(self) -> Any:
        """A kernel launched before the persistent one, or None."""
        return None

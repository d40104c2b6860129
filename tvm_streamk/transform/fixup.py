"""The fix-up interface and its registry.

A *fix-up* merges the partial tiles of split tiles. Each is one :class:`Fixup` subclass in its
own module (:mod:`.fixup_atomic`, :mod:`.fixup_workspace`), registered with :func:`register`;
:class:`~tvm_streamk.transform.LowerStreamK` drives it through the hooks below, the primitive
and MetaSchedule ask it :meth:`Fixup.check`, and :func:`footprint` gives the bytes it needs to
the lowering and to :func:`tvm_streamk.explain` alike.

The lowering calls, for one annotated block:

1. ``check(site, target)`` (also called by the primitive, with ``target`` possibly None);
2. the constructor, with the analysed site, the plan, the target, the tile-row group, the tile
   body and the grid variable of a grid read at run time (None for the plan's own grid);
3. ``merge_writeback(block, segment)`` for each write-back block in the persistent nest;
4. ``after_segment(segment)`` once per segment, after the tile body (None for nothing);
5. ``prologue()``: a kernel launched before the persistent one (None for none);
6. ``buffers``: the buffers the fix-up allocates in the function.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import StreamKError

__all__ = ["Fixup", "Footprint", "by_code", "footprint", "get", "names", "register"]

# Bytes of one arrival counter (int32).
COUNTER_BYTES = 4
# The fix-ups of the package, imported on the first registry query so that each registers itself.
_BUILTIN = ("fixup_atomic", "fixup_workspace")


@dataclass(frozen=True)
class Footprint:
    """Global memory one call of a kernel needs for its fix-up.

    Attributes
    ----------
    workspace_bytes : int
        Bytes the fix-up allocates (partial-tile slots and arrival counters).
    zeroed_bytes : int
        Bytes the fix-up's prologue zeroes (split output tiles, or counters).
    """

    workspace_bytes: int
    zeroed_bytes: int


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
    """

    name: ClassVar[str] = ""
    code: ClassVar[int] = -1
    deterministic: ClassVar[bool] = False

    @classmethod
    def check(cls, site, target) -> None:
        """Raise StreamKError when ``site`` cannot use this fix-up; ``target`` may be None
        before a target is known."""

    @classmethod
    def footprint(cls, plan, tile_elems: int, acc_bytes: int, out_bytes: int, blocks: int):
        """:class:`Footprint` of ``plan`` for tiles of ``tile_elems`` elements, launched on
        ``blocks`` blocks (the plan's grid, or the bound of a grid read at run time)."""
        raise NotImplementedError

    def __init__(self, site, plan, target, group: int | None, tile_body, grid=None):
        type(self).check(site, target)
        self.site, self.plan, self.target, self.group = site, plan, target, group
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


_FIXUPS: dict[str, type[Fixup]] = {}
# Set once the built-in fix-ups have been imported (and so registered).
_builtins_loaded = False


def register(cls: type[Fixup]) -> type[Fixup]:
    """Class decorator adding a :class:`Fixup` subclass to the registry."""
    if not cls.name or cls.code < 0:
        raise ValueError(f"fix-up class {cls.__name__} must set name and a non-negative code")
    for other in _FIXUPS.values():
        if other.name == cls.name or other.code == cls.code:
            raise ValueError(
                f"fix-up {cls.name!r} (code {cls.code}) clashes with {other.name!r} "
                f"(code {other.code}); codes are recorded in annotations and must stay unique"
            )
    _FIXUPS[cls.name] = cls
    return cls


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        for module in _BUILTIN:
            importlib.import_module(f"{__package__}.{module}")
        _builtins_loaded = True


def names() -> tuple[str, ...]:
    """The registered fix-ups, by code."""
    _load_builtins()
    return tuple(sorted(_FIXUPS, key=lambda n: _FIXUPS[n].code))


def get(name: str) -> type[Fixup]:
    """The fix-up class registered as ``name``; StreamKError (condition ``fixup``) otherwise."""
    _load_builtins()
    if name not in _FIXUPS:
        raise StreamKError("fixup", f"fixup={name!r}", f"Use one of {list(names())}.")
    return _FIXUPS[name]


def by_code(code: int) -> type[Fixup] | None:
    """The fix-up recorded in annotations as ``code``, or None."""
    _load_builtins()
    return next((f for f in _FIXUPS.values() if f.code == code), None)


def footprint(
    plan, fixup: str, tile_elems: int, acc_bytes: int, out_bytes: int, blocks: int | None = None
) -> Footprint:
    """Workspace and zeroed bytes of one call of the kernel ``plan`` describes with ``fixup``.

    Parameters
    ----------
    plan : tvm_streamk.decomposition.Plan
    fixup : str
        A registered fix-up.
    tile_elems : int
        Output elements per tile.
    acc_bytes, out_bytes : int
        Bytes per element of the accumulator and of the output.
    blocks : int, optional
        Blocks launched, when the grid is read at run time (its bound); the plan's grid by
        default.

    Returns
    -------
    Footprint
    """
    return get(fixup).footprint(
        plan, tile_elems, acc_bytes, out_bytes, plan.grid if blocks is None else blocks
    )

"""The fix-ups that exist: their names, codes and determinism, what each needs, the one default.

A *fix-up* merges the partial tiles of split tiles. Each is one class in its own module of
:mod:`tvm_streamk.transform` (the lowering it drives), registered here with :func:`register`.
Everything that asks which fix-ups exist reads this registry: the decision layer
(:mod:`tvm_streamk.decision`) checks a decision against the fix-up's own ``check`` and resolves
``fixup="auto"`` with :func:`default`; MetaSchedule samples among :func:`names`; ``explain``
and the cost model read :func:`footprint`. The registry imports nothing of the package but its
error type: the lowering registers into it, never the other way round.

What a registered class provides (:class:`tvm_streamk.transform.fixup.Fixup` documents the
lowering hooks besides):

* ``name`` (what ``fixup=`` is spelled as), ``code`` (its annotation code: stable, unique,
  never reused), ``deterministic`` (bit-reproducible whatever the arrival order);
* ``check(site, target)``: raise :class:`~tvm_streamk.errors.StreamKError` when the analysed
  site (or the target, which may be None before one is known) cannot use the fix-up;
* ``auto_rank`` and ``auto_ok(site, target)``: ``fixup="auto"`` takes the lowest-ranked fix-up
  whose ``auto_ok`` holds (and, with ``deterministic=True``, that is deterministic);
* ``footprint(plan, tile_elems, acc_bytes, out_bytes, blocks)``: a :class:`Footprint`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import StreamKError

__all__ = ["AUTO", "Footprint", "by_code", "default", "footprint", "get", "names", "register"]

# What ``fixup=`` is spelled as to let the registry choose (:func:`default`).
AUTO = "auto"
COND_FIXUP = "fixup"


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


_FIXUPS: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator adding a fix-up class to the registry.

    Raises
    ------
    ValueError
        When the class sets no name or code, or either is already taken.
    """
    if not getattr(cls, "name", "") or getattr(cls, "code", -1) < 0:
        raise ValueError(f"fix-up class {cls.__name__} must set name and a non-negative code")
    if cls.name == AUTO:
        raise ValueError(f"{AUTO!r} is what fixup= is spelled as to choose; pick another name")
    for other in _FIXUPS.values():
        if other is not cls and (other.name == cls.name or other.code == cls.code):
            raise ValueError(
                f"fix-up {cls.name!r} (code {cls.code}) clashes with {other.name!r} "
                f"(code {other.code}); codes are recorded in annotations and must stay unique"
            )
    _FIXUPS[cls.name] = cls
    return cls


def names() -> tuple[str, ...]:
    """The registered fix-ups, by code."""
    return tuple(sorted(_FIXUPS, key=lambda n: _FIXUPS[n].code))


def get(name: str) -> type:
    """The fix-up registered as ``name``.

    Raises
    ------
    StreamKError
        Condition ``fixup``, naming the registered ones.
    """
    if name not in _FIXUPS:
        raise StreamKError(COND_FIXUP, f"fixup={name!r}", f"Use one of {[AUTO, *names()]}.")
    return _FIXUPS[name]


def by_code(code: int) -> type | None:
    """The fix-up recorded in annotations as ``code``, or None."""
    return next((f for f in _FIXUPS.values() if f.code == code), None)


def default(site, target, deterministic: bool = False, batch_invariant: bool = False) -> str:
    """What ``fixup="auto"`` becomes for ``site`` on ``target`` (None: not known yet): the
    lowest-ranked registered fix-up whose ``auto_ok`` holds, deterministic ones only when
    ``deterministic``, ones that merge chunks in chunk order (``orders_chunks``) only when
    ``batch_invariant``.

    Raises
    ------
    StreamKError
        When no registered fix-up takes the site (each one's own refusal is then the reason).
    """
    ranked = sorted(_FIXUPS.values(), key=lambda f: (f.auto_rank, f.code))

    def wanted(fixup) -> bool:
        if batch_invariant and not fixup.orders_chunks:
            return False
        return not deterministic or fixup.deterministic

    for fixup in ranked:
        if wanted(fixup) and fixup.auto_ok(site, target):
            return fixup.name
    # None applies: each one's own check says why, all in one message.
    refusals = []
    for fixup in ranked:
        if not wanted(fixup):
            continue
        try:
            fixup.check(site, target)
        except StreamKError as err:
            refusals.append(f"{fixup.name}: {err.found}")
    where = f" on {target.kind.name}" if target is not None else ""
    raise StreamKError(
        COND_FIXUP,
        f"no fix-up{where} merges the split tiles of block {site.block.name_hint!r} "
        f"({'; '.join(refusals) or 'none registered'})",
        "Pass policy='data_parallel' (it splits no tile and needs no fix-up), or change what "
        "the refusals name.",
    )


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
    """
    return get(fixup).footprint(
        plan, tile_elems, acc_bytes, out_bytes, plan.grid if blocks is None else blocks
    )

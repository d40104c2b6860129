"""Plans of a tile count known only at run time: the closed forms on an expression.

A dynamic-shape kernel (a symbolic M) has one build for every tile count. Its plan is made for a
stand-in count that fills the largest grid the run time can launch, then viewed with the tile
count an expression (:func:`at_run_time`): the lowering evaluates the same closed forms on it,
and the kernel computes its grid when it runs.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from . import policy as registry
from .ops import DecompositionError, positive_int
from .plans import MAX_RUNTIME_SMS, Plan, _concrete, _spelled, plan

__all__ = ["RuntimeTilesPlan", "at_run_time", "plan_at_run_time"]


class RuntimeTilesPlan(Plan):
    """A :class:`~tvm_streamk.decomposition.Plan` whose tile count is an expression: made by
    :func:`at_run_time`."""

    _grid_bound: int

    def runtime_grid_bound(self) -> int:
        """The most blocks the kernel launches (the grid is computed at run time)."""
        return self._grid_bound

    @property
    def split_tiles(self) -> tuple[int, ...]:
        raise DecompositionError(
            "the split tiles of a run-time tile count are only known at run time; every tile "
            "may be split"
        )


def at_run_time(
    p: Plan, tiles: Any, grid_bound: int, reason: str = "", variant: str | None = None
) -> RuntimeTilesPlan:
    """The closed forms of ``p`` on a tile count known only at run time.

    ``tiles`` is an expression (a dynamic-shape kernel's tile count); the kernel launches a
    grid computed at run time, at most ``grid_bound`` blocks. The view is the lowering's: its
    ``tiles``, ``iterations``, ``sk_tiles`` and ``counter_tiles`` are expressions, and what
    enumerates the work (``work``, ``split_tiles``) needs ints. Only a policy whose closed
    forms take a run-time tile count (``runtime_tiles``) has them here; a policy that is the
    kernel as written (``is_original``) launches one block per tile.
    ``variant`` picks another variant of the plan's policy for the view (one whose grid only
    the run time decides).
    """
    if not (p.scheme.runtime_tiles or p.scheme.is_original):
        raise DecompositionError(
            f"a tile count known only at run time with policy={p.policy!r}; only "
            f"{_spelled(r.name for r in registry.concrete() if r.runtime_tiles)} splits a "
            "run-time count"
        )
    view = object.__new__(RuntimeTilesPlan)
    for f in fields(p):
        object.__setattr__(view, f.name, getattr(p, f.name))
    if variant is not None:
        object.__setattr__(view, "variant", registry.get(p.policy, variant).variant)
    derived = view.scheme.derived(tiles, p.panels, p.grid, p.splits)
    grid = {"grid": tiles} if view.scheme.is_original else {}
    for name, value in {"tiles": tiles, **derived, **grid, "reason": reason}.items():
        object.__setattr__(view, name, value)
    object.__setattr__(view, "_grid_bound", grid_bound)
    return view


def plan_at_run_time(
    tiles: Any,
    panels: int,
    num_sms: int,
    blocks_per_sm: int = 1,
    policy: str = "stream_k",
    runtime_sms: bool = False,
    variant: str | None = None,
    buckets: tuple | None = None,
    splits: int | None = None,
) -> RuntimeTilesPlan:
    """The plan of a kernel whose tile count ``tiles`` (an expression) is known only at run time.

    The kernel computes its grid at run time, ``min(num_sms * blocks_per_sm, tiles * panels)``
    blocks, and evaluates the closed forms of ``policy`` on the run-time count (see
    :func:`at_run_time`). With ``runtime_sms`` the SM count is the device's too, read at
    run time (``num_sms`` is then 1, and the grid at most ``MAX_RUNTIME_SMS`` SMs' worth).
    ``data_parallel``'s view is the kernel as written, one block per tile; a ``variant`` of
    ``policy`` may choose the grid from the run-time count
    (:class:`tvm_streamk.run_time_choice.StreamKOrDataParallel`), and ``buckets`` are its
    Stream-K tile counts as decided (:attr:`Plan.buckets`); ``splits`` serves a policy that
    takes them (split-K's grid, ``tiles * splits``, is the run-time count's).
    """
    panels = positive_int("panels", panels, "the number of K-panels per tile")
    blocks_per_sm = positive_int("blocks_per_sm", blocks_per_sm, "the resident blocks per SM")
    num_sms = positive_int("num_sms", num_sms, "the SM count of the GPU")
    rule = _concrete(policy)
    if not (rule.runtime_tiles or rule.is_original):
        raise DecompositionError(
            f"a tile count known only at run time with policy={policy!r}; pass policy="
            f"{_spelled(p.name for p in registry.concrete() if p.runtime_tiles or p.is_original)}"
        )
    if runtime_sms and variant is not None and not registry.get(policy, variant).runtime_grid:
        raise DecompositionError(
            f"policy {policy}({variant}) needs the SM count at compile time, found a count read "
            "at run time; pass num_sms"
        )
    # A stand-in count that fills the largest grid the run time can launch: the plan's grid and
    # run-time bound are then those of any large enough count.
    stand_in = max(num_sms, MAX_RUNTIME_SMS) * blocks_per_sm
    static = plan(stand_in, panels, num_sms, blocks_per_sm, policy, splits=splits)
    bound = static.runtime_grid_bound() if runtime_sms else static.grid
    reason = (
        "the tile count is known only at run time: the kernel computes its grid and work split "
        "from it"
    )
    return at_run_time(static.with_buckets(buckets), tiles, bound, reason, variant)

"""``Plan``: a decomposition's fields, its closed forms (delegated to its policy) and its work.

Build plans with :func:`plan`. See :mod:`tvm_streamk.decomposition` for the conventions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from . import policy as registry
from .ops import INT_OPS, DecompositionError, Ops, positive_int
from .policy import Policy

__all__ = ["MAX_RUNTIME_SMS", "Plan", "plan"]

# A grid read from the device at run time (``num_sms="device"``) launches at most this many
# SMs' worth of blocks: the kernel's index types and the workspace fix-up's slots are sized for
# it at compile time. A larger GPU runs correctly with that many blocks per launch.
MAX_RUNTIME_SMS = 256

Segment = tuple[int, int, int]


@dataclass(frozen=True)
class Plan:
    """A work decomposition of ``tiles`` x ``panels`` iterations over ``grid`` blocks.

    Build plans with :func:`plan`; the constructor only checks that the fields agree with the
    closed forms of the plan's policy.

    Attributes
    ----------
    policy : str
        The name of a registered policy (:func:`tvm_streamk.decomposition.policy.names`).
    tiles, panels : int
        Output tiles and K-panels per tile (``P``).
    grid : int
        Blocks launched.
    num_sms : int or None
        Streaming multiprocessors the plan was made for (None for policies that do not need it).
    blocks_per_sm : int
        Blocks of the kernel resident per SM.
    splits : int
        K splits per tile (``split_k`` only; 1 otherwise).
    sk_tiles : int
        Tiles walked Stream-K style: all tiles for ``stream_k``, the leading ``SK`` tiles for
        ``hybrid``, 0 otherwise.
    variant : str or None
        The policy's variant (``"one_tile"`` or ``"two_tile"`` for ``hybrid``), None otherwise.
    reason : str
        Why this policy and grid were chosen; ``"requested"`` for explicit policies.
    buckets : tuple of (int, int), or None
        For a policy that picks its grid from a run-time tile count
        (:class:`tvm_streamk.run_time_choice.StreamKOrDataParallel`), the inclusive tile-count
        ranges that take Stream-K, fixed by the model when the decision was made; None
        otherwise, or to let the policy compute them with the unit model.
    """

    policy: str
    tiles: int
    panels: int
    grid: int
    num_sms: int | None
    blocks_per_sm: int
    splits: int = 1
    sk_tiles: int = 0
    variant: str | None = None
    reason: str = ""
    buckets: tuple | None = None

    def __post_init__(self) -> None:
        _check_plan(self)

    @cached_property
    def scheme(self) -> Policy:
        """The registered :class:`~tvm_streamk.decomposition.policy.Policy` of this plan."""
        return registry.get(self.policy, self.variant)

    @property
    def label(self) -> str:
        """A short name of the decomposition: ``split_k(S=3)``, ``hybrid(one_tile)``, ..."""
        return self.scheme.label(self)

    @property
    def iterations(self) -> int:
        """``TOTAL = tiles * panels``, the flattened iteration count."""
        return self.tiles * self.panels

    def runtime_grid_bound(self) -> int:
        """The most blocks a grid read at run time launches: ``MAX_RUNTIME_SMS`` SMs' worth,
        never more blocks than iterations."""
        return min(MAX_RUNTIME_SMS * self.blocks_per_sm, self.iterations)

    @property
    def aligned_splits(self) -> int | None:
        """``S`` when every tile is cut into ``S`` equal panel ranges (see
        :meth:`Policy.aligned_splits`), else None."""
        return self.scheme.aligned_splits(self)

    @property
    def counter_tiles(self) -> int:
        """Tiles the workspace fix-up keeps an arrival counter for: every tile that can be split
        (a hybrid's Stream-K tiles ``[0, SK)``; its data-parallel tiles are always whole)."""
        return self.scheme.counter_tiles(self)

    @property
    def slots_per_block(self) -> int:
        """Partial-tile slots of the workspace fix-up per block (two: only a block's first and
        last segment can be partial; one for split-K, whose blocks run one segment)."""
        return self.scheme.slots_per_block(self)

    @property
    def workspace_slots(self) -> int:
        """Partial-tile slots of the workspace fix-up in all (0 when no tile is split)."""
        return self.grid * self.slots_per_block if self.split_tiles else 0

    def largest_intermediate(self, grid: int | None = None) -> int:
        """An upper bound of every value the closed forms compute, intermediates included.

        The kernel evaluates them in an integer type that must hold this bound. ``grid`` bounds
        a grid only known at run time (defaults to :attr:`grid`).
        """
        return self.scheme.largest_intermediate(self, self.grid if grid is None else grid)

    def stream_k_tiles(self, ops: Ops = INT_OPS, grid: Any = None) -> Any:
        """Number ``SK`` of leading tiles walked Stream-K style, as a closed form of ``grid``.

        Parameters
        ----------
        ops : Ops
            Arithmetic to evaluate with.
        grid : int or expression, optional
            Blocks launched; defaults to ``self.grid``. The lowering may pass a symbolic grid.

        Returns
        -------
        int or expression
            ``tiles`` for ``stream_k``, the hybrid's ``SK`` and 0 for the other policies; an int
            whenever ``grid`` is.
        """
        return self.scheme.stream_k_tiles(self, ops, self._grid(grid))

    def units(self, ops: Ops = INT_OPS, grid: Any = None) -> Any:
        """Number ``U`` of work units every block walks (1 except for ``hybrid``:
        ``1 + (tiles - SK) // grid``, which divides exactly); an int whenever ``grid`` is."""
        return self.scheme.units(self, ops, self._grid(grid))

    def block_range(self, b: Any, u: Any, ops: Ops = INT_OPS, grid: Any = None) -> tuple[Any, Any]:
        """Half-open range ``[lo, hi)`` of flattened iterations of unit ``u`` of block ``b``.

        The range is empty when ``hi <= lo``. For policies with ``U == 1`` the range does not
        depend on ``u`` (which must then be 0).

        Parameters
        ----------
        b, u : int or expression
            Block and unit index.
        ops : Ops
            Arithmetic to evaluate with.
        grid : int or expression, optional
            Blocks launched; defaults to ``self.grid``.

        Returns
        -------
        tuple
            ``(lo, hi)``.

        Examples
        --------
        >>> p = plan(3, 4, num_sms=2, policy="stream_k")
        >>> [p.block_range(b, 0) for b in range(p.grid)]
        [(0, 6), (6, 12)]
        """
        return self.scheme.block_range(self, b, u, ops, self._grid(grid))

    def locate(self, it: Any, ops: Ops = INT_OPS, grid: Any = None) -> tuple[Any, Any]:
        """Block and unit ``(b, u)`` whose range holds flattened iteration ``it`` in
        ``[0, TOTAL)``."""
        return self.scheme.locate(self, it, ops, self._grid(grid))

    def tile_peers(self, tile: Any, ops: Ops = INT_OPS, grid: Any = None) -> Any:
        """Number of segments covering ``tile``, as a closed form (see :meth:`peers`)."""
        return self.scheme.tile_peers(self, tile, ops, self._grid(grid))

    def peer_index(
        self, b: Any, tile: Any, k_begin: Any, ops: Ops = INT_OPS, grid: Any = None
    ) -> Any:
        """Position, in ``k`` order, of block ``b``'s segment of ``tile`` starting at ``k_begin``;
        the owner (``k_begin == 0``) is peer 0."""
        return self.scheme.peer_index(self, b, tile, k_begin, ops, self._grid(grid))

    def peer_block(self, tile: Any, p: Any, ops: Ops = INT_OPS, grid: Any = None) -> Any:
        """The block running peer ``p`` (in ``k`` order) of ``tile``: the inverse of
        :meth:`peer_index`.

        Examples
        --------
        >>> p = plan(3, 4, num_sms=2, policy="stream_k")
        >>> [p.peer_block(1, i) for i in range(p.tile_peers(1))]
        [0, 1]
        """
        return self.scheme.peer_block(self, tile, p, ops, self._grid(grid))

    def _grid(self, grid: Any) -> Any:
        return self.grid if grid is None else grid

    def with_reason(self, reason: str) -> Plan:
        """This plan with :attr:`reason` replaced."""
        view = copy.copy(self)
        object.__setattr__(view, "reason", reason)
        return view

    def with_buckets(self, buckets) -> Plan:
        """This plan with :attr:`buckets` replaced."""
        view = copy.copy(self)
        value = None if buckets is None else tuple((int(lo), int(hi)) for lo, hi in buckets)
        object.__setattr__(view, "buckets", value)
        return view

    @cached_property
    def work(self) -> list[list[Segment]]:
        """Per block, the ``(tile, k_begin, k_end)`` segments in the order the block runs them."""
        P = self.panels
        units = self.units()
        blocks = []
        for b in range(self.grid):
            segments = []
            for u in range(units):
                lo, hi = self.block_range(b, u)
                while lo < hi:
                    tile = lo // P
                    end = min(hi, (tile + 1) * P)
                    segments.append((tile, lo - tile * P, end - tile * P))
                    lo = end
            blocks.append(segments)
        return blocks

    @cached_property
    def _peer_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for segments in self.work:
            for tile, _, _ in segments:
                counts[tile] = counts.get(tile, 0) + 1
        return counts

    @property
    def split_tiles(self) -> tuple[int, ...]:
        """Tiles covered by more than one segment (they need a fixup), sorted."""
        return tuple(sorted(t for t, n in self._peer_counts.items() if n > 1))

    @property
    def max_peers(self) -> int:
        """Most segments covering one tile (1 when nothing is split)."""
        return max(self._peer_counts.values(), default=1)

    def peers(self, tile: int) -> int:
        """Number of segments covering ``tile`` (1 for a tile one block computes whole)."""
        if not 0 <= tile < self.tiles:
            raise DecompositionError(
                f"tile must be in [0, {self.tiles}), found {tile}; pass a tile index of this plan"
            )
        return self._peer_counts[tile]

    @property
    def iterations_per_block(self) -> list[int]:
        """Iterations each block runs, in block order."""
        return [sum(k1 - k0 for _, k0, k1 in segments) for segments in self.work]


def _check_plan(p: Plan) -> None:
    """Raise DecompositionError unless the fields of ``p`` agree with its policy's closed forms."""
    if registry.chooser(p.policy) is not None:
        raise DecompositionError(
            f"Plan.policy must be a concrete policy, found {p.policy!r}; use plan() to resolve "
            f"{p.policy!r}"
        )
    rule = registry.get(p.policy, p.variant)
    if rule.variant != p.variant:
        raise DecompositionError(
            f"{p.policy} needs variant in {registry.variants(p.policy)}, found {p.variant!r}"
        )
    positive_int("tiles", p.tiles, "the number of output tiles")
    positive_int("panels", p.panels, "the number of K-panels per tile")
    positive_int("grid", p.grid, "the number of blocks")
    positive_int("blocks_per_sm", p.blocks_per_sm, "the resident blocks per SM")
    if p.num_sms is not None:
        positive_int("num_sms", p.num_sms, "the SM count of the GPU")
    rule.validate(p)
    slots = None if p.num_sms is None else p.num_sms * p.blocks_per_sm
    if rule.persistent and slots is not None and p.grid > slots:
        raise DecompositionError(
            f"{p.policy} is a persistent grid of resident blocks: grid <= "
            f"num_sms*blocks_per_sm = {slots}, found grid={p.grid}; launch fewer blocks"
        )
    for name, value in rule.derived(p.tiles, p.panels, p.grid, p.splits).items():
        if getattr(p, name) != value:
            raise DecompositionError(
                f"{p.policy} plan needs {name}={value!r}, found {getattr(p, name)!r}; "
                "build plans with tvm_streamk.decomposition.plan()"
            )


def check_policy_args(policy, splits=None, variant=None):
    """Check what of ``(policy, splits, variant)`` no shape decides: a known policy, ``splits``
    only for a policy that takes it (and then required), ``variant`` only for one with variants.

    Returns the concrete policy's rule, or None for a chooser (``"heuristic"``).

    Raises
    ------
    DecompositionError
        Naming the argument, what was found and what to pass instead.
    """
    choose = registry.chooser(policy) if isinstance(policy, str) else None
    rule = None if choose is not None else _concrete(policy)
    if splits is not None and (rule is None or not rule.takes_splits):
        takers = _spelled(p.name for p in registry.concrete() if p.takes_splits)
        raise DecompositionError(
            f"splits={splits!r} only applies to policy={takers}, found policy={policy!r}; "
            f"drop splits or ask for {takers}"
        )
    if variant is not None and (rule is None or not registry.variants(policy)):
        takers = _spelled(p.name for p in registry.concrete() if p.variant)
        raise DecompositionError(
            f"variant={variant!r} only applies to policy={takers}, found policy={policy!r}; "
            f"drop variant or ask for {takers}"
        )
    if rule is not None and rule.takes_splits and splits is None:
        raise DecompositionError(
            f"policy={policy!r} needs splits=S with 1 <= S <= panels, found splits=None; pass "
            "splits, the number of K ranges every tile is cut into"
        )
    if splits is not None:
        positive_int("splits", splits, "a split count of at least 1")
    return rule


def plan(
    tiles: int,
    panels: int,
    num_sms: int | None,
    blocks_per_sm: int = 1,
    policy: str = "heuristic",
    splits: int | None = None,
    variant: str | None = None,
    cost: Any = None,
    fixup: str = "workspace",
    dp_blocks_per_sm: int | None = None,
    saturation: int | None = None,
) -> Plan:
    """Decompose ``tiles`` x ``panels`` iterations over a grid of blocks.

    Parameters
    ----------
    tiles : int
        Output tiles of the GEMM (batch included).
    panels : int
        K-panels per tile.
    num_sms : int or None
        SMs of the GPU; needed by ``stream_k``, ``hybrid`` and ``heuristic`` (see
        :func:`tvm_streamk.gpus.num_sms_for_target`).
    blocks_per_sm : int
        Blocks of the kernel resident per SM (its occupancy).
    policy : str
        A registered policy (:func:`~tvm_streamk.decomposition.policy.names`), or a chooser:
        ``"heuristic"`` lets :func:`tvm_streamk.cost_model.choose` pick the policy and fills
        :attr:`Plan.reason`.
    splits : int, optional
        K splits per tile; required by, and only accepted with, ``split_k``.
    variant : str, optional
        ``"one_tile"`` or ``"two_tile"`` (default) for ``hybrid``; only accepted with it.
    cost : tvm_streamk.cost_model.CostParams, optional
        Constants of the model a chooser uses; ignored by concrete policies.
    fixup : str
        The fixup the kernel will use (``"workspace"`` or ``"atomic"``), which a chooser's model
        prices; ignored by concrete policies.
    dp_blocks_per_sm, saturation : int, optional
        Resident blocks per SM of the data-parallel kernel, and the resident blocks that keep an
        SM busy, for a chooser's model (:func:`tvm_streamk.cost_model.choose`); ignored by
        concrete policies.

    Returns
    -------
    Plan

    Raises
    ------
    DecompositionError
        When an argument is out of its domain.

    Examples
    --------
    >>> plan(5, 2, num_sms=2, policy="hybrid", variant="one_tile").work
    [[(0, 0, 1), (1, 0, 2), (3, 0, 2)], [(0, 1, 2), (2, 0, 2), (4, 0, 2)]]
    """
    tiles = positive_int("tiles", tiles, "the number of output tiles")
    panels = positive_int("panels", panels, "the number of K-panels per tile")
    blocks_per_sm = positive_int("blocks_per_sm", blocks_per_sm, "the resident blocks per SM")
    choose = registry.chooser(policy) if isinstance(policy, str) else None
    rule = check_policy_args(policy, splits, variant)
    if num_sms is not None:
        num_sms = positive_int("num_sms", num_sms, "the SM count of the GPU")
    elif choose is not None or rule.needs_num_sms:
        raise DecompositionError(
            f"policy={policy!r} sizes the grid from the SM count, found num_sms=None; pass "
            "num_sms= (tvm_streamk.gpus.num_sms_for_target looks it up from the target)"
        )
    if choose is not None:
        return choose(
            tiles,
            panels,
            num_sms,
            blocks_per_sm,
            cost=cost,
            fixup=fixup,
            dp_blocks_per_sm=dp_blocks_per_sm,
            saturation=saturation,
        )
    rule = registry.get(policy, variant)
    if rule.takes_splits:
        splits = positive_int("splits", splits, f"a split count in [1, {panels}]")
    else:
        splits = 1
    slots = None if num_sms is None else num_sms * blocks_per_sm
    grid = rule.grid_for(tiles, panels, slots, splits)
    fields = rule.derived(tiles, panels, grid, splits)
    fields.pop("grid", None)
    return Plan(
        policy,
        tiles=tiles,
        panels=panels,
        grid=grid,
        num_sms=num_sms,
        blocks_per_sm=blocks_per_sm,
        variant=rule.variant,
        reason="requested",
        **fields,
    )


def _spelled(names) -> str:
    return " or ".join(repr(n) for n in dict.fromkeys(names))


def _concrete(policy: Any) -> Policy:
    if not isinstance(policy, str):
        raise DecompositionError(
            f"policy must be one of {registry.names()}, found {policy!r} ({type(policy).__name__})"
        )
    try:
        return registry.get(policy)
    except DecompositionError:
        raise DecompositionError(
            f"policy must be one of {registry.names()}, found {policy!r}"
        ) from None

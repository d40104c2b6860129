"""Stream-K work decomposition: the closed forms shared by the lowering, the report and the tests.

A GEMM is tiled into ``tiles`` output tiles; each tile reduces over ``P = panels`` K-panels. The
iteration space is flattened tile-major: iteration ``it = tile * P + k`` for ``k`` in ``[0, P)``,
``TOTAL = tiles * P``. A kernel launches ``G = grid`` blocks; block ``b`` walks ``U`` work units
``u = 0 .. U-1``, unit ``u`` being one half-open range ``[lo, hi)`` of flattened iterations (empty
when ``hi <= lo``). A block cuts its ranges at tile boundaries into *segments*
``(tile, k_begin, k_end)``.

Closed forms (``//`` and ``%`` are floor division and modulo)

data_parallel
    ``G = tiles``, ``U = 1``; block ``b`` runs ``[b*P, (b+1)*P)``.
split_k (``S = splits``, ``1 <= S <= P``)
    ``G = tiles*S``, ``U = 1``; with ``t = b // S``, ``s = b % S`` block ``b`` runs
    ``[t*P + s*P//S, t*P + (s+1)*P//S)``. Every split is non-empty because ``S <= P``.
stream_k
    ``G = min(num_sms*blocks_per_sm, TOTAL)``, ``U = 1``; block ``b`` runs
    ``[b*TOTAL//G, (b+1)*TOTAL//G)``: per-block iteration counts differ by at most one.
hybrid (Stream-K for the last partial wave, data-parallel for the full ones)
    ``G = min(num_sms*blocks_per_sm, tiles)``, ``R = tiles % G``. The Stream-K tiles are
    ``[0, SK)`` with ``SK = R`` (``one_tile``) or ``SK = min(R + G, tiles)`` if ``R != 0`` else
    ``0`` (``two_tile``: each block gets between one and two tiles of Stream-K work, which hides
    the fixup better than ``one_tile`` when ``R`` is small). Unit ``u = 0`` is the Stream-K range
    ``[b*SKI//G, (b+1)*SKI//G)`` with ``SKI = SK*P``; unit ``u >= 1`` is the data-parallel tile
    ``t = SK + b + (u-1)*G``: ``[t*P, (t+1)*P)``. ``U = 1 + (tiles - SK) // G``: the
    data-parallel tiles always fill whole waves, for any ``G`` (``G > tiles`` gives
    ``SK = tiles``), so no data-parallel unit is ever empty.

Fixup convention: a tile covered by more than one segment is *split*; its segments are its
*peers*, numbered in ``k`` order (peer 0 holds ``k_begin == 0``). The workspace fixup of the
lowering lets the last peer to arrive sum all partials in peer order and write the tile, so no
block ever waits on another; :func:`plan` still keeps Stream-K grids within the resident blocks
(``grid <= num_sms * blocks_per_sm``), the persistent kernel the model assumes.

The closed forms are written against an *ops* object (:class:`IntOps` by default) and use only
``+``, ``-`` and ``*`` directly, so the lowering can evaluate the same functions on TIR
``PrimExpr`` values (including a symbolic ``grid``) by passing its own ops. No closed form branches
in Python on the value of ``b``, ``u``, ``it``, ``tile`` or ``grid``; a ``grid`` that is a Python
int is folded to ints where that keeps loop extents constant.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

__all__ = [
    "CONCRETE_POLICIES",
    "HYBRID_VARIANTS",
    "INT_OPS",
    "MAX_RUNTIME_SMS",
    "POLICIES",
    "DecompositionError",
    "FixupLayout",
    "IntOps",
    "Ops",
    "Plan",
    "fixup_layout",
    "plan",
    "tile_order",
]

POLICIES = ("data_parallel", "split_k", "stream_k", "hybrid", "heuristic")
CONCRETE_POLICIES = POLICIES[:-1]
HYBRID_VARIANTS = ("one_tile", "two_tile")
# A grid read from the device at run time (``num_sms="device"``) launches at most this many
# SMs' worth of blocks: the kernel's index types and the workspace fix-up's slots are sized for
# it at compile time. A larger GPU runs correctly with that many blocks per launch.
MAX_RUNTIME_SMS = 256


class DecompositionError(ValueError):
    """An argument of the work decomposition is out of its domain.

    The message says what was expected, what was found and what to do.
    """


class Ops(Protocol):
    """Arithmetic the closed forms need beyond ``+``, ``-`` and ``*``.

    :class:`IntOps` implements it on Python ints; the lowering implements it on TIR ``PrimExpr``
    (``tir.floordiv``, ``tir.floormod``, ``tir.min``, ``tir.max``, ``tir.Select``, comparisons and
    ``tir.And``). ``select`` may evaluate both branches, so the closed forms keep both safe.
    """

    def floordiv(self, a: Any, b: Any) -> Any: ...
    def floormod(self, a: Any, b: Any) -> Any: ...
    def min(self, a: Any, b: Any) -> Any: ...
    def max(self, a: Any, b: Any) -> Any: ...
    def select(self, cond: Any, a: Any, b: Any) -> Any: ...
    def lt(self, a: Any, b: Any) -> Any: ...
    def le(self, a: Any, b: Any) -> Any: ...
    def ge(self, a: Any, b: Any) -> Any: ...
    def eq(self, a: Any, b: Any) -> Any: ...
    def ne(self, a: Any, b: Any) -> Any: ...
    def and_(self, a: Any, b: Any) -> Any: ...


class IntOps:
    """:class:`Ops` on Python ints: floor division and modulo, eager ``select``."""

    def floordiv(self, a: int, b: int) -> int:
        return a // b

    def floormod(self, a: int, b: int) -> int:
        return a % b

    def min(self, a: int, b: int) -> int:
        return min(a, b)

    def max(self, a: int, b: int) -> int:
        return max(a, b)

    def select(self, cond: bool, a: int, b: int) -> int:
        return a if cond else b

    def lt(self, a: int, b: int) -> bool:
        return a < b

    def le(self, a: int, b: int) -> bool:
        return a <= b

    def ge(self, a: int, b: int) -> bool:
        return a >= b

    def eq(self, a: int, b: int) -> bool:
        return a == b

    def ne(self, a: int, b: int) -> bool:
        return a != b

    def and_(self, a: bool, b: bool) -> bool:
        return a and b


INT_OPS = IntOps()

Segment = tuple[int, int, int]


def _positive_int(name: str, value: Any, what: str) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise DecompositionError."""
    if isinstance(value, bool):
        raise DecompositionError(
            f"{name} must be a positive int, found the bool {value!r}; pass {what}"
        )
    try:
        number = operator.index(value)
    except TypeError:
        raise DecompositionError(
            f"{name} must be a positive int, found {value!r} ({type(value).__name__}); pass {what}"
        ) from None
    if number < 1:
        raise DecompositionError(f"{name} must be a positive int, found {number}; pass {what}")
    return number


def _static(value: Any) -> bool:
    """Whether ``value`` is a Python int, which the closed forms may fold without ops."""
    return isinstance(value, int) and not isinstance(value, bool)


def _even_range(b: Any, n: Any, g: Any, ops: Ops) -> tuple[Any, Any]:
    """Block ``b``'s share ``[b*n//g, (b+1)*n//g)`` of ``n`` iterations spread over ``g`` blocks."""
    return ops.floordiv(b * n, g), ops.floordiv((b + 1) * n, g)


def _even_block(it: Any, n: Any, g: Any, ops: Ops) -> Any:
    """The block of :func:`_even_range` holding iteration ``it``.

    It is the largest ``b`` with ``b*n//g <= it``, i.e. ``b*n < (it+1)*g``; blocks with empty
    ranges are skipped because the next block then starts at the same iteration.
    """
    return ops.floordiv((it + 1) * g - 1, n)


def _hybrid_sk_tiles(tiles: int, g: Any, variant: str | None, ops: Ops) -> Any:
    """The hybrid's Stream-K tile count ``SK`` for ``g`` blocks (see the module docstring)."""
    rem = ops.floormod(tiles, g)
    if variant == "one_tile":
        return rem
    return ops.select(ops.ne(rem, 0), ops.min(rem + g, tiles), 0)


@dataclass(frozen=True)
class Plan:
    """A work decomposition of ``tiles`` x ``panels`` iterations over ``grid`` blocks.

    Build plans with :func:`plan`; the constructor only checks that the fields agree with the
    closed forms of the module docstring.

    Attributes
    ----------
    policy : str
        One of :data:`CONCRETE_POLICIES`.
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
        ``"one_tile"`` or ``"two_tile"`` for ``hybrid``, None otherwise.
    reason : str
        Why this policy and grid were chosen; ``"requested"`` for explicit policies.
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

    def __post_init__(self) -> None:
        _check_plan(self)

    @property
    def label(self) -> str:
        """A short name of the decomposition: ``split_k(S=3)``, ``hybrid(one_tile)``, ..."""
        if self.policy == "split_k":
            return f"split_k(S={self.splits})"
        if self.policy == "hybrid":
            return f"hybrid({self.variant})"
        return self.policy

    @property
    def iterations(self) -> int:
        """``TOTAL = tiles * panels``, the flattened iteration count."""
        return self.tiles * self.panels

    def runtime_grid_bound(self) -> int:
        """The most blocks a grid read at run time launches: ``MAX_RUNTIME_SMS`` SMs' worth,
        never more blocks than iterations."""
        return min(MAX_RUNTIME_SMS * self.blocks_per_sm, self.iterations)

    @property
    def counter_tiles(self) -> int:
        """Tiles the workspace fix-up keeps an arrival counter for: every tile that can be split,
        which for a hybrid are its Stream-K tiles ``[0, SK)`` (its data-parallel tiles are
        always whole)."""
        return self.stream_k_tiles() if self.policy == "hybrid" else self.tiles

    @property
    def slots_per_block(self) -> int:
        """Partial-tile slots of the workspace fix-up per block: two, as only a block's first
        and last segment can be partial; one for split-K, whose blocks run one segment."""
        return 1 if self.policy == "split_k" else 2

    @property
    def workspace_slots(self) -> int:
        """Partial-tile slots of the workspace fix-up in all (0 when no tile is split)."""
        return self.grid * self.slots_per_block if self.split_tiles else 0

    def largest_intermediate(self, grid: int | None = None) -> int:
        """An upper bound of every value the closed forms compute, intermediates included.

        The kernel evaluates them in an integer type that must hold this bound: the even split
        multiplies a block index by the iteration count (``b * TOTAL``) and the block of an
        iteration multiplies it by the grid (``(it + 1) * G``); split-K and data-parallel stay
        within ``TOTAL`` plus a panel row. ``grid`` bounds a grid only known at run time
        (defaults to :attr:`grid`).
        """
        total, panels = self.iterations, self.panels
        if self.policy in ("data_parallel", "split_k"):
            return 2 * (total + panels * self.splits)
        g = self.grid if grid is None else grid
        return (g + 1) * (total + panels + 1)

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
        if self.policy == "stream_k":
            return self.tiles
        if self.policy != "hybrid":
            return 0
        g = self.grid if grid is None else grid
        # A static grid folds to an int, so the lowering gets constants rather than Selects.
        return _hybrid_sk_tiles(self.tiles, g, self.variant, INT_OPS if _static(g) else ops)

    def units(self, ops: Ops = INT_OPS, grid: Any = None) -> Any:
        """Number ``U`` of work units every block walks.

        Parameters
        ----------
        ops : Ops
            Arithmetic to evaluate with.
        grid : int or expression, optional
            Blocks launched; defaults to ``self.grid``.

        Returns
        -------
        int or expression
            1 except for ``hybrid``: ``1 + (tiles - SK) // grid``, which divides exactly. An
            int whenever ``grid`` is.
        """
        if self.policy != "hybrid":
            return 1
        g = self.grid if grid is None else grid
        if _static(g):
            ops = INT_OPS
        return 1 + ops.floordiv(self.tiles - self.stream_k_tiles(ops, g), g)

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
        P = self.panels
        g = self.grid if grid is None else grid
        if self.policy == "data_parallel":
            return b * P, b * P + P
        if self.policy == "split_k":
            S = self.splits
            base = ops.floordiv(b, S) * P
            s = ops.floormod(b, S)
            return base + ops.floordiv(s * P, S), base + ops.floordiv((s + 1) * P, S)
        if self.policy == "stream_k":
            return _even_range(b, self.iterations, g, ops)
        sk = self.stream_k_tiles(ops, g)
        sk_lo, sk_hi = _even_range(b, sk * P, g, ops)
        dp_lo = (sk + b + (u - 1) * g) * P
        first = ops.eq(u, 0)
        return ops.select(first, sk_lo, dp_lo), ops.select(first, sk_hi, dp_lo + P)

    def locate(self, it: Any, ops: Ops = INT_OPS, grid: Any = None) -> tuple[Any, Any]:
        """Block and unit ``(b, u)`` whose range holds flattened iteration ``it``.

        Parameters
        ----------
        it : int or expression
            Flattened iteration in ``[0, TOTAL)``.
        ops : Ops
            Arithmetic to evaluate with.
        grid : int or expression, optional
            Blocks launched; defaults to ``self.grid``.

        Returns
        -------
        tuple
            ``(b, u)``.
        """
        P = self.panels
        g = self.grid if grid is None else grid
        if self.policy == "data_parallel":
            return ops.floordiv(it, P), 0
        if self.policy == "split_k":
            S = self.splits
            k = ops.floormod(it, P)
            # Largest split s with s*P//S <= k; unique because every split is non-empty.
            return ops.floordiv(it, P) * S + ops.floordiv((k + 1) * S - 1, P), 0
        if self.policy == "stream_k":
            return _even_block(it, self.iterations, g, ops), 0
        sk = self.stream_k_tiles(ops, g)
        # Guard the divisor: select may evaluate the Stream-K branch when there is no SK region.
        b_sk = _even_block(it, ops.max(sk * P, 1), g, ops)
        d = ops.floordiv(it, P) - sk
        in_sk = ops.lt(it, sk * P)
        return (
            ops.select(in_sk, b_sk, ops.floormod(d, g)),
            ops.select(in_sk, 0, 1 + ops.floordiv(d, g)),
        )

    def tile_peers(self, tile: Any, ops: Ops = INT_OPS, grid: Any = None) -> Any:
        """Number of segments covering ``tile``, as a closed form (see :meth:`peers`).

        In a Stream-K region of ``n`` iterations over ``g`` blocks the blocks holding a tile's
        first and last iteration span ``last - first + 1`` blocks. When ``n >= g`` all of them
        are non-empty and hold at most ``P`` segments; when ``n < g`` every non-empty block holds
        one iteration, so the tile has exactly ``P`` peers. Hence ``min(last - first + 1, P)``.

        Parameters
        ----------
        tile : int or expression
            Tile index in ``[0, tiles)``.
        ops : Ops
            Arithmetic to evaluate with.
        grid : int or expression, optional
            Blocks launched; defaults to ``self.grid``.

        Returns
        -------
        int or expression
        """
        if self.policy == "data_parallel":
            return 1
        if self.policy == "split_k":
            return self.splits
        first, last = self._span(tile, ops, grid)
        peers = ops.min(last - first + 1, self.panels)
        if self.policy == "stream_k":
            return peers
        return ops.select(ops.lt(tile, self.stream_k_tiles(ops, grid)), peers, 1)

    def peer_index(
        self, b: Any, tile: Any, k_begin: Any, ops: Ops = INT_OPS, grid: Any = None
    ) -> Any:
        """Position, in ``k`` order, of block ``b``'s segment of ``tile`` starting at ``k_begin``.

        The owner (``k_begin == 0``) is peer 0. By the argument of :meth:`tile_peers` the
        position is ``b - first`` when every block is non-empty and ``k_begin`` otherwise, and
        the smaller of the two is always right.

        Parameters
        ----------
        b : int or expression
            Block running the segment.
        tile, k_begin : int or expression
            The segment's tile and first panel.
        ops : Ops
            Arithmetic to evaluate with.
        grid : int or expression, optional
            Blocks launched; defaults to ``self.grid``.

        Returns
        -------
        int or expression
        """
        if self.policy == "data_parallel":
            return 0
        if self.policy == "split_k":
            return ops.floormod(b, self.splits)
        first, _ = self._span(tile, ops, grid)
        index = ops.min(b - first, k_begin)
        if self.policy == "stream_k":
            return index
        return ops.select(ops.lt(tile, self.stream_k_tiles(ops, grid)), index, 0)

    def peer_block(self, tile: Any, p: Any, ops: Ops = INT_OPS, grid: Any = None) -> Any:
        """The block running peer ``p`` (in ``k`` order) of ``tile``: the inverse of
        :meth:`peer_index`.

        In a Stream-K region of ``n`` iterations over ``g`` blocks, when ``n >= g`` every block
        is non-empty, so the peers are the consecutive blocks from the one holding the tile's
        first iteration; when ``n < g`` every non-empty block holds one iteration, so peer ``p``
        is the block holding iteration ``tile * P + p``.

        Examples
        --------
        >>> p = plan(3, 4, num_sms=2, policy="stream_k")
        >>> [p.peer_block(1, i) for i in range(p.tile_peers(1))]
        [0, 1]
        """
        P = self.panels
        if self.policy == "data_parallel":
            return tile
        if self.policy == "split_k":
            return tile * self.splits + p
        g = self.grid if grid is None else grid
        n = ops.max(self.stream_k_tiles(ops, g) * P, 1)
        first, _ = self._span(tile, ops, grid)
        return ops.select(ops.ge(n, g), first + p, _even_block(tile * P + p, n, g, ops))

    def _span(self, tile: Any, ops: Ops, grid: Any) -> tuple[Any, Any]:
        """Blocks holding the first and last iteration of ``tile`` in the Stream-K region."""
        g = self.grid if grid is None else grid
        n = ops.max(self.stream_k_tiles(ops, g) * self.panels, 1)
        start = tile * self.panels
        first = _even_block(start, n, g, ops)
        last = _even_block(start + self.panels - 1, n, g, ops)
        return first, last

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
    """Raise DecompositionError unless the fields of ``p`` agree with the closed forms."""
    if p.policy not in CONCRETE_POLICIES:
        raise DecompositionError(
            f"Plan.policy must be one of {CONCRETE_POLICIES}, found {p.policy!r}; "
            "use plan() to resolve 'heuristic'"
        )
    _positive_int("tiles", p.tiles, "the number of output tiles")
    _positive_int("panels", p.panels, "the number of K-panels per tile")
    _positive_int("grid", p.grid, "the number of blocks")
    _positive_int("blocks_per_sm", p.blocks_per_sm, "the resident blocks per SM")
    if p.num_sms is not None:
        _positive_int("num_sms", p.num_sms, "the SM count of the GPU")
    expected: dict[str, Any] = {"splits": 1, "sk_tiles": 0, "variant": None}
    if p.policy == "data_parallel":
        expected["grid"] = p.tiles
    elif p.policy == "split_k":
        if not 1 <= p.splits <= p.panels:
            raise DecompositionError(
                f"split_k needs 1 <= splits <= panels = {p.panels}, found splits={p.splits}; "
                "use fewer splits (every split must own at least one K-panel)"
            )
        expected.update(splits=p.splits, grid=p.tiles * p.splits)
    elif p.policy == "stream_k":
        if p.grid > p.iterations:
            raise DecompositionError(
                f"stream_k needs grid <= tiles*panels = {p.iterations}, found grid={p.grid}; "
                "launch fewer blocks (every block must own at least one iteration)"
            )
        expected["sk_tiles"] = p.tiles
    else:
        if p.variant not in HYBRID_VARIANTS:
            raise DecompositionError(
                f"hybrid needs variant in {HYBRID_VARIANTS}, found {p.variant!r}"
            )
        if p.grid > p.tiles:
            raise DecompositionError(
                f"hybrid needs grid <= tiles = {p.tiles}, found grid={p.grid}; "
                "use stream_k when there are fewer tiles than blocks"
            )
        expected.update(
            variant=p.variant, sk_tiles=_hybrid_sk_tiles(p.tiles, p.grid, p.variant, INT_OPS)
        )
    slots = None if p.num_sms is None else p.num_sms * p.blocks_per_sm
    if p.policy in ("stream_k", "hybrid") and slots is not None and p.grid > slots:
        raise DecompositionError(
            f"{p.policy} is a persistent grid of resident blocks: grid <= "
            f"num_sms*blocks_per_sm = {slots}, found grid={p.grid}; launch fewer blocks"
        )
    for name, value in expected.items():
        if getattr(p, name) != value:
            raise DecompositionError(
                f"{p.policy} plan needs {name}={value!r}, found {getattr(p, name)!r}; "
                "build plans with tvm_streamk.decomposition.plan()"
            )


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
        :func:`tvm_streamk.gpus.resolve_num_sms`).
    blocks_per_sm : int
        Blocks of the kernel resident per SM (its occupancy).
    policy : str
        One of :data:`POLICIES`; ``"heuristic"`` lets :func:`tvm_streamk.cost_model.choose`
        pick the policy and fills :attr:`Plan.reason`.
    splits : int, optional
        K splits per tile; required by, and only accepted with, ``split_k``.
    variant : str, optional
        ``"one_tile"`` or ``"two_tile"`` (default) for ``hybrid``; only accepted with it.
    cost : tvm_streamk.cost_model.CostParams, optional
        Constants of the model the heuristic uses; ignored by explicit policies.
    fixup : str
        The fixup the kernel will use (``"workspace"`` or ``"atomic"``), which the heuristic's
        model prices; ignored by explicit policies.

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
    tiles = _positive_int("tiles", tiles, "the number of output tiles")
    panels = _positive_int("panels", panels, "the number of K-panels per tile")
    blocks_per_sm = _positive_int("blocks_per_sm", blocks_per_sm, "the resident blocks per SM")
    if policy not in POLICIES:
        raise DecompositionError(f"policy must be one of {POLICIES}, found {policy!r}")
    if splits is not None and policy != "split_k":
        raise DecompositionError(
            f"splits={splits!r} only applies to policy='split_k', found policy={policy!r}; "
            "drop splits or ask for split_k"
        )
    if variant is not None and policy != "hybrid":
        raise DecompositionError(
            f"variant={variant!r} only applies to policy='hybrid', found policy={policy!r}; "
            "drop variant or ask for hybrid"
        )
    if num_sms is not None:
        num_sms = _positive_int("num_sms", num_sms, "the SM count of the GPU")
    elif policy in ("stream_k", "hybrid", "heuristic"):
        raise DecompositionError(
            f"policy={policy!r} sizes the grid from the SM count, found num_sms=None; pass "
            "num_sms= (tvm_streamk.gpus.resolve_num_sms looks it up from the target)"
        )
    if policy == "heuristic":
        from .cost_model import choose

        return choose(tiles, panels, num_sms, blocks_per_sm, cost=cost, fixup=fixup)
    common = {"tiles": tiles, "panels": panels, "num_sms": num_sms, "blocks_per_sm": blocks_per_sm}
    reason = "requested"
    if policy == "data_parallel":
        return Plan(policy, grid=tiles, reason=reason, **common)
    if policy == "split_k":
        if splits is None:
            raise DecompositionError(
                "policy='split_k' needs splits=S with 1 <= S <= panels, found splits=None"
            )
        splits = _positive_int("splits", splits, f"a split count in [1, {panels}]")
        return Plan(policy, grid=tiles * splits, splits=splits, reason=reason, **common)
    slots = num_sms * blocks_per_sm
    if policy == "stream_k":
        grid = min(slots, tiles * panels)
        return Plan(policy, grid=grid, sk_tiles=tiles, reason=reason, **common)
    variant = "two_tile" if variant is None else variant
    if variant not in HYBRID_VARIANTS:
        raise DecompositionError(f"variant must be one of {HYBRID_VARIANTS}, found {variant!r}")
    grid = min(slots, tiles)
    sk_tiles = _hybrid_sk_tiles(tiles, grid, variant, INT_OPS)
    return Plan(policy, grid=grid, sk_tiles=sk_tiles, variant=variant, reason=reason, **common)


@dataclass(frozen=True)
class FixupLayout:
    """Where the partial accumulators of split tiles live; plain data for the lowering.

    Slots are dense: split tile ``t`` owns slots ``slot_offset[t] .. slot_offset[t] + peers - 1``,
    one per segment in ``k`` order, the owner (``k_begin == 0``) taking the first. Treat the
    mappings as read-only.

    Attributes
    ----------
    split_tiles : tuple of int
        Tiles covered by more than one segment, sorted.
    split_tile_index : dict
        Tile -> dense index ``0 .. len(split_tiles) - 1``.
    peers : dict
        Tile -> ``((block, position in work[block]), ...)`` of its segments in ``k`` order.
    owner : dict
        Tile -> block running its ``k_begin == 0`` segment, which finishes the tile.
    max_peers : int
        Most segments covering one tile (1 when nothing is split).
    slots : int
        Partial slots in all: the sum of peers over split tiles.
    slot_offset : dict
        Tile -> first slot (prefix sums of peers in tile order).
    segment_slot : tuple of tuple of int
        ``segment_slot[b][i]`` is the slot of segment ``i`` of block ``b``, or -1 when its tile
        is not split.
    """

    split_tiles: tuple[int, ...]
    split_tile_index: dict[int, int]
    peers: dict[int, tuple[tuple[int, int], ...]]
    owner: dict[int, int]
    max_peers: int
    slots: int
    slot_offset: dict[int, int]
    segment_slot: tuple[tuple[int, ...], ...]


def fixup_layout(p: Plan) -> FixupLayout:
    """Lay out the workspace of partial accumulators for the split tiles of ``p``.

    Parameters
    ----------
    p : Plan

    Returns
    -------
    FixupLayout

    Examples
    --------
    >>> layout = fixup_layout(plan(3, 4, num_sms=2, policy="stream_k"))
    >>> layout.split_tiles, layout.slots, layout.segment_slot
    ((1,), 2, ((-1, 0), (1, -1)))
    """
    split = p.split_tiles
    by_tile: dict[int, list[tuple[int, int, int]]] = {t: [] for t in split}
    for b, segments in enumerate(p.work):
        for i, (tile, k0, _) in enumerate(segments):
            if tile in by_tile:
                by_tile[tile].append((k0, b, i))
    peers = {t: tuple((b, i) for _, b, i in sorted(by_tile[t])) for t in split}
    slot_offset: dict[int, int] = {}
    total = 0
    for t in split:
        slot_offset[t] = total
        total += len(peers[t])
    slot = [[-1] * len(segments) for segments in p.work]
    for t in split:
        for j, (b, i) in enumerate(peers[t]):
            slot[b][i] = slot_offset[t] + j
    return FixupLayout(
        split_tiles=split,
        split_tile_index={t: n for n, t in enumerate(split)},
        peers=peers,
        owner={t: peers[t][0][0] for t in split},
        max_peers=max((len(v) for v in peers.values()), default=1),
        slots=total,
        slot_offset=slot_offset,
        segment_slot=tuple(tuple(row) for row in slot),
    )


def tile_order(
    tile: Any,
    band_extents: tuple[int, ...],
    group: int | None = None,
    ops: Ops = INT_OPS,
) -> tuple[Any, ...]:
    """Decode a linear tile index into coordinates over ``band_extents``.

    Without ``group`` the order is row-major. With ``group = g`` the last two dimensions
    ``(tiles_m, tiles_n)`` are walked in groups of ``g`` tile rows, column-major inside a group
    (Triton's ``GROUP_M``), so consecutive tiles share operand panels in L2; the last group is
    shorter when ``g`` does not divide ``tiles_m``, which keeps the map a bijection. Leading
    (batch) dimensions stay outermost.

    Parameters
    ----------
    tile : int or expression
        Linear tile index in ``[0, prod(band_extents))``.
    band_extents : tuple of int
        Tiles along each band dimension, outermost first.
    group : int, optional
        Tile rows per group; needs at least two dimensions.
    ops : Ops
        Arithmetic to evaluate with.

    Returns
    -------
    tuple
        One coordinate per dimension.

    Examples
    --------
    >>> [tile_order(t, (3, 2), group=2) for t in range(6)]
    [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
    """
    extents = tuple(band_extents) if isinstance(band_extents, (tuple, list)) else None
    if not extents:
        raise DecompositionError(
            f"band_extents must be a non-empty tuple of positive ints, found {band_extents!r}"
        )
    extents = tuple(
        _positive_int(f"band_extents[{i}]", e, "a tile count") for i, e in enumerate(extents)
    )
    if group is not None:
        group = _positive_int("group", group, "the tile rows per group")
        if len(extents) < 2:
            raise DecompositionError(
                f"group needs at least two band dimensions, found band_extents={extents}; "
                "drop group for a one-dimensional band"
            )
    leading = extents if group is None else extents[:-2]
    rest = tile
    coords: list[Any] = []
    if group is not None:
        tm, tn = extents[-2:]
        plane = tm * tn
        local = ops.floormod(tile, plane) if leading else tile
        rest = ops.floordiv(tile, plane)
        per_group = group * tn
        first_m = ops.floordiv(local, per_group) * group
        # The last group is short when group does not divide tm; dividing by its real height
        # keeps the map a bijection.
        rows = ops.min(tm - first_m, group)
        within = ops.floormod(local, per_group)
        coords = [first_m + ops.floormod(within, rows), ops.floordiv(within, rows)]
    for i in range(len(leading) - 1, -1, -1):
        # The outermost coordinate needs no modulo for an in-range tile.
        coords.insert(0, ops.floormod(rest, leading[i]) if i else rest)
        rest = ops.floordiv(rest, leading[i])
    return tuple(coords)

"""The policy interface and its registry.

A *policy* is one way of spreading ``tiles x panels`` iterations over a grid of blocks. Each is
one :class:`Policy` subclass in its own module, registered with :func:`register`; it owns

* how its grid and derived fields follow from the GEMM and the SM count (:meth:`Policy.grid_for`,
  :meth:`Policy.derived`) and the checks of its domain (:meth:`Policy.validate`);
* its closed forms (:meth:`Policy.block_range` and the rest), written against
  :class:`~tvm_streamk.decomposition.ops.Ops` so the lowering evaluates them on TIR;
* what the lowering and the fix-ups need to know of it (:attr:`Policy.is_original`,
  :attr:`Policy.runtime_tiles`, :attr:`Policy.runtime_grid`, :meth:`Policy.aligned_splits`,
  :meth:`Policy.counter_tiles`, :meth:`Policy.slots_per_block`,
  :meth:`Policy.largest_intermediate`);
* the candidates it offers the heuristic (:meth:`Policy.candidates`).

:class:`~tvm_streamk.decomposition.Plan` stores the fields and delegates every closed form to its
policy; nothing else in the package switches on a policy's name. A *chooser* (the cost model's
``"heuristic"``) is registered by name with :func:`register_chooser` and returns the plan of a
concrete policy, so the decomposition never imports the cost model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from .ops import DecompositionError, Ops

if TYPE_CHECKING:
    from .plans import Plan

__all__ = [
    "Policy",
    "by_code",
    "by_key",
    "chooser",
    "choosers",
    "codes",
    "concrete",
    "get",
    "names",
    "register",
    "register_chooser",
    "unregister",
    "variants",
]


class Policy:
    """One decomposition policy. Subclass, set the class attributes, implement the closed forms
    and decorate the class with :func:`register`.

    Closed forms take the plan ``p`` (its fields), the arithmetic ``ops`` and the grid ``g``
    already resolved (an int, or a TIR expression for a grid read at run time).

    Attributes
    ----------
    name : str
        What ``policy=`` is spelled as.
    variant : str or None
        The variant's name when one ``name`` has several (``hybrid``'s ``one_tile``/``two_tile``).
    default : bool
        Whether ``policy=name`` without a variant picks this one.
    code : int
        The policy's code in a block's annotations: stable, unique, never reused.
    rank : int
        Tie order in the heuristic (lower is simpler and wins ties).
    needs_num_sms : bool
        Whether the grid follows from the SM count.
    takes_splits : bool
        Whether the policy takes ``splits=``.
    persistent : bool
        Whether the grid is a persistent grid of resident blocks (at most ``num_sms *
        blocks_per_sm``), which the plan checks.
    runtime_tiles : bool
        Whether the closed forms hold for a tile count the host knows only at run time (a
        dynamic M): the host computes the grid from it.
    runtime_grid : bool
        Whether the closed forms hold for a grid read from the device at run time (an SM
        count read there, or a grouped GEMM's tile count, which only the device knows).
    is_original : bool
        Whether the tiled kernel as written already is this decomposition (nothing to lower).
    aligned_for_fragments : bool
        Whether, asked for a tensor-core fragment accumulator (which takes only aligned
        splits), the policy becomes the aligned split the cost model picks instead of being
        refused.
    """

    name: ClassVar[str] = ""
    variant: ClassVar[str | None] = None
    default: ClassVar[bool] = True
    code: ClassVar[int] = -1
    rank: ClassVar[int] = 100
    needs_num_sms: ClassVar[bool] = True
    takes_splits: ClassVar[bool] = False
    persistent: ClassVar[bool] = False
    runtime_tiles: ClassVar[bool] = False
    runtime_grid: ClassVar[bool] = False
    is_original: ClassVar[bool] = False
    aligned_for_fragments: ClassVar[bool] = False

    @property
    def key(self) -> str:
        """``name``, or ``name_variant`` for a variant: MetaSchedule's knob spelling."""
        return self.name if self.variant is None else f"{self.name}_{self.variant}"

    def label(self, p: Plan) -> str:
        """A short name of the plan: ``split_k(S=3)``, ``hybrid(one_tile)``, ..."""
        return self.name if self.variant is None else f"{self.name}({self.variant})"

    # --- Construction ---------------------------------------------------------------------------

    def grid_for(self, tiles: int, panels: int, slots: int | None, splits: int) -> int:
        """Blocks to launch; ``slots`` is ``num_sms * blocks_per_sm`` (None without an SM count)."""
        raise NotImplementedError

    def derived(self, tiles: int, panels: int, grid: int, splits: int) -> dict[str, Any]:
        """The fields a plan of this policy must hold for ``grid``: ``grid`` where the policy
        fixes it, ``splits`` and ``sk_tiles``."""
        return {"splits": 1, "sk_tiles": 0}

    def validate(self, p: Plan) -> None:
        """Raise DecompositionError when ``p``'s grid or splits are outside the policy's domain."""

    # --- Closed forms ---------------------------------------------------------------------------

    def stream_k_tiles(self, p: Plan, ops: Ops, g: Any) -> Any:
        """Leading tiles walked Stream-K style (0 when none)."""
        return 0

    def units(self, p: Plan, ops: Ops, g: Any) -> Any:
        """Work units every block walks."""
        return 1

    def block_range(self, p: Plan, b: Any, u: Any, ops: Ops, g: Any) -> tuple[Any, Any]:
        """Half-open iteration range ``[lo, hi)`` of unit ``u`` of block ``b``."""
        raise NotImplementedError

    def locate(self, p: Plan, it: Any, ops: Ops, g: Any) -> tuple[Any, Any]:
        """Block and unit ``(b, u)`` whose range holds iteration ``it``."""
        raise NotImplementedError

    def tile_peers(self, p: Plan, tile: Any, ops: Ops, g: Any) -> Any:
        """Segments covering ``tile``."""
        raise NotImplementedError

    def peer_index(self, p: Plan, b: Any, tile: Any, k_begin: Any, ops: Ops, g: Any) -> Any:
        """Position in ``k`` order of block ``b``'s segment of ``tile`` starting at ``k_begin``."""
        raise NotImplementedError

    def peer_block(self, p: Plan, tile: Any, peer: Any, ops: Ops, g: Any) -> Any:
        """The block running peer ``peer`` of ``tile``."""
        raise NotImplementedError

    def plan_at_count(
        self,
        tiles: int,
        panels: int,
        num_sms: int,
        blocks_per_sm: int,
        fixup: str,
        buckets: tuple | None = None,
    ) -> Plan | None:
        """The plan the kernel of a run-time tile count runs at ``tiles`` tiles, for a policy
        that decides it only then (None: :func:`~tvm_streamk.decomposition.plan` of this
        policy is that plan); ``buckets`` as decided (:attr:`Plan.buckets`)."""
        return None

    def run_time_grid(self, p: Plan, slots: Any, ops: Ops, fixup: str) -> Any:
        """The grid launched for a tile count known only at run time (``p.tiles``, an
        expression) on ``slots`` resident blocks: never more blocks than iterations."""
        return ops.min(slots, p.iterations)

    def run_time_persistent(self, p: Plan, ops: Ops, fixup: str) -> Any:
        """For a tile count known only at run time: the host condition under which the
        persistent kernel runs, as an expression of ``ops``; where it does not hold, the
        kernel as written runs (one block per tile, at its own registers and occupancy).
        ``True``: always; ``False``: never (the persistent kernel is then not built)."""
        return True

    def largest_intermediate(self, p: Plan, g: int) -> int:
        """An upper bound of every value the closed forms compute for ``g`` blocks."""
        raise NotImplementedError

    # --- What the lowering and the fix-ups need -------------------------------------------------

    def aligned_splits(self, p: Plan) -> int | None:
        """``S`` when every tile is cut into ``S`` equal panel ranges run by blocks
        ``tile * S + s`` (the aligned form the lowering and tensor-core fragments use)."""
        return None

    def counter_tiles(self, p: Plan) -> int:
        """Tiles that can be split, each of which the workspace fix-up gives a counter."""
        return p.tiles

    def slots_per_block(self, p: Plan) -> int:
        """Partial-tile slots per block of the workspace fix-up: a block's first and last
        segment can be partial."""
        return 2

    # --- What the heuristic needs ---------------------------------------------------------------

    def candidates(self, tiles: int, panels: int, slots: int) -> list[dict[str, Any]]:
        """Keyword arguments of the plans of this policy the heuristic should compare (none by
        default: a registered policy is only used when asked for)."""
        return []


_POLICIES: dict[tuple[str, str | None], Policy] = {}
_CHOOSERS: dict[str, Callable[..., Plan]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator adding a :class:`Policy` subclass to the registry.

    Raises
    ------
    DecompositionError
        When the name, variant or code is already taken, or the class sets none.
    """
    policy = cls()
    if not policy.name or policy.code < 0:
        raise DecompositionError(
            f"policy class {cls.__name__} must set name and a non-negative code, found "
            f"name={policy.name!r}, code={policy.code}"
        )
    key = (policy.name, policy.variant)
    if key in _POLICIES or policy.name in _CHOOSERS:
        raise DecompositionError(
            f"policy {policy.key!r} is already registered; pick another name or unregister it"
        )
    taken = {p.code: p.key for p in _POLICIES.values()}
    if policy.code in taken:
        raise DecompositionError(
            f"policy {policy.key!r} uses code {policy.code}, already the code of "
            f"{taken[policy.code]!r}; codes are recorded in annotations and must stay unique"
        )
    _POLICIES[key] = policy
    return cls


def unregister(cls: type[Policy]) -> None:
    """Remove a policy class registered with :func:`register` (for tests and plugins)."""
    _POLICIES.pop((cls.name, cls.variant), None)


def register_chooser(name: str, choose: Callable[..., Plan]) -> None:
    """Register ``choose(tiles, panels, num_sms, blocks_per_sm, cost=, fixup=,
    dp_blocks_per_sm=, saturation=)`` under ``name``: ``plan(policy=name)`` returns its plan of
    a concrete policy."""
    if any(p.name == name for p in _POLICIES.values()):
        raise DecompositionError(f"{name!r} is already the name of a policy")
    _CHOOSERS[name] = choose


def chooser(name: str) -> Callable[..., Plan] | None:
    """The chooser registered under ``name``, or None."""
    return _CHOOSERS.get(name)


def choosers() -> tuple[str, ...]:
    """The names of the registered choosers."""
    return tuple(_CHOOSERS)


def names() -> tuple[str, ...]:
    """Every value ``policy=`` accepts: the concrete policies by code, then the choosers."""
    return (*dict.fromkeys(p.name for p in concrete()), *_CHOOSERS)


def concrete() -> tuple[Policy, ...]:
    """The registered policies, variants separately, by code."""
    return tuple(sorted(_POLICIES.values(), key=lambda p: p.code))


def variants(name: str) -> tuple[str, ...]:
    """The variants of policy ``name`` (empty when it has none)."""
    return tuple(p.variant for p in concrete() if p.name == name and p.variant)


def get(name: str, variant: str | None = None) -> Policy:
    """The policy ``name`` (its default variant when ``variant`` is None).

    Raises
    ------
    DecompositionError
        When no such concrete policy or variant is registered.
    """
    found = [p for p in _POLICIES.values() if p.name == name]
    if not found:
        hint = "; resolve it with plan()" if name in _CHOOSERS else ""
        raise DecompositionError(f"policy must be one of {names()}, found {name!r}{hint}")
    if variant is None:
        defaults = [p for p in found if p.default] or found
        return defaults[0]
    for p in found:
        if p.variant == variant:
            return p
    known = variants(name)
    if not known:
        raise DecompositionError(
            f"variant={variant!r} only applies to a policy with variants, found policy={name!r}; "
            "drop variant"
        )
    raise DecompositionError(f"variant must be one of {known}, found {variant!r}")


def by_key(key: str) -> Policy:
    """The policy whose :attr:`Policy.key` is ``key`` (``"hybrid_one_tile"``, ``"split_k"``)."""
    for p in _POLICIES.values():
        if p.key == key:
            return p
    raise DecompositionError(
        f"policy key must be one of {tuple(p.key for p in concrete())}, found {key!r}"
    )


def by_code(code: int) -> Policy | None:
    """The policy recorded in annotations as ``code``, or None."""
    for p in _POLICIES.values():
        if p.code == code:
            return p
    return None


def codes() -> tuple[int, ...]:
    """The codes of the registered policies."""
    return tuple(p.code for p in concrete())

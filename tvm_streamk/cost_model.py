"""Analytical cost model of a work decomposition, and the heuristic that picks one.

Times are in *units*: one K-panel iteration of one tile (its MMA work and operand loads) costs
``c_iter = 1.0``. A block pays

* ``c_block`` once, when it starts (launch, index arithmetic, the first pipeline fill that the
  segment cost does not cover);
* ``c_iter`` per iteration;
* ``c_seg`` per segment, i.e. per (tile, K-range) it touches: pipeline prologue, accumulator
  initialisation and the epilogue store;
* ``c_fix`` per partial tile moved for a split tile (one covered by several segments), in one
  of two fixups:

  ``"workspace"``
      a peer writes its partial to the workspace after its segment; the owner (the
      ``k_begin == 0`` segment, see :mod:`tvm_streamk.decomposition`) waits until every peer's
      partial is written, then reads ``peers - 1`` of them before its epilogue. This is the
      Stream-K paper's fixup. The lowering's fixup lets the *last* peer to arrive read the
      partials instead, so no block stalls: the tile completes at the same modelled time, and
      the owner is free earlier, so the model is slightly pessimistic for the generated code.
  ``"atomic"``
      every segment of a split tile atomically adds its partial to the output, with no waiting;
      a prologue kernel first zeroes the split tiles, costing ``c_block + c_seg`` per tile in
      waves over the slots (its launch latency is not modelled).

Per SM. The unit is one K-panel iteration of one tile at the SM's full throughput. Blocks are
list-scheduled in launch order onto ``num_sms * blocks_per_sm`` resident slots (each block
starts on the slot that frees first), and the ``blocks_per_sm`` blocks resident on one SM share
it: a block runs an iteration in ``max(resident, saturation)`` units, where ``resident`` is the
number of blocks of its wave on its SM (the wave spread evenly over the SMs, at most
``blocks_per_sm``) and ``saturation`` the number of resident blocks that keeps an SM busy
(:func:`saturation`; by default the plan's own ``blocks_per_sm``). So an SM holding fewer blocks
than ``saturation`` runs at that fraction of its throughput (latency-bound), one holding more
shares its full throughput among them, and more resident blocks are no free work.
Segment and fix-up costs are latencies and are not shared. The predicted time is the makespan.
The owner waits make start times depend on finish times, so the schedule is iterated to a fixed
point (exact when every block is resident at once, which the Stream-K family guarantees).

Every predicted time is a sum of constants along one critical chain of blocks and segments, so it
is linear in the constants for a fixed schedule; :func:`calibrate` uses that to fit them to
measurements by least squares.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .decomposition import DecompositionError, Plan, plan
from .decomposition import policy as policies

__all__ = [
    "DEFAULT_COST",
    "FIXUPS",
    "CostModelError",
    "CostParams",
    "calibrate",
    "candidates",
    "choose",
    "critical_features",
    "predicted_time",
    "saturation",
]

# Fixed-point passes of the scheduler; two suffice when all blocks are resident at once.
_MAX_PASSES = 8

_FEATURES = ("c_iter", "c_seg", "c_fix", "c_block")
FIXUPS = ("workspace", "atomic")


class CostModelError(ValueError):
    """The cost model cannot evaluate or fit what it was given.

    The message says what was expected, what was found and what to do.
    """


@dataclass(frozen=True)
class CostParams:
    """Constants of the cost model, in units of one K-panel iteration of one tile.

    The defaults are uncalibrated order-of-magnitude estimates for a 128x128x32 fp16 tile on a
    recent datacenter GPU: an iteration is ~0.15 us of tensor-core work, a pipeline fill plus a
    128x128 epilogue ~1 us, a 64 KiB fp32 partial through L2 ~1 us, a block launch a fraction of
    that. Fit them to a GPU with :func:`calibrate`.

    Attributes
    ----------
    c_iter : float
        One K-panel iteration of one tile; 1.0 by definition of the unit.
    c_seg : float
        Per segment (tile touched): pipeline prologue, accumulator set-up and epilogue.
    c_fix : float
        Per partial accumulator tile written by a peer or read by an owner.
    c_block : float
        Per block launched.
    seconds_per_unit : float or None
        Seconds per unit, set by :func:`calibrate`; None for the uncalibrated defaults.
    min_gain : float
        Not a model constant but the heuristic's margin: a Stream-K-family plan must be predicted
        this fraction faster than data-parallel to be chosen, because it pays costs the model
        does not see (the persistent loop's index arithmetic, and the weaker L2 reuse of blocks
        that walk distant tiles at the same time). :func:`calibrate` keeps it.
    saturation_warps : int
        Resident warps that keep an SM busy: four per warp scheduler of the four an SM has, the
        usual minimum to hide arithmetic and shared-memory latency (uncalibrated).
        :func:`saturation` turns it into blocks of a kernel.
    """

    c_iter: float = 1.0
    c_seg: float = 6.0
    c_fix: float = 6.0
    c_block: float = 1.0
    seconds_per_unit: float | None = None
    min_gain: float = 0.03
    saturation_warps: int = 16

    def __post_init__(self) -> None:
        for name in _FEATURES:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise CostModelError(
                    f"CostParams.{name} must be a finite non-negative number, found {value!r}"
                )
        if self.c_iter <= 0:
            raise CostModelError(f"CostParams.c_iter must be positive, found {self.c_iter!r}")
        if not 0 <= self.min_gain < 1:
            raise CostModelError(f"CostParams.min_gain must be in [0, 1), found {self.min_gain!r}")
        if not isinstance(self.saturation_warps, int) or self.saturation_warps < 1:
            raise CostModelError(
                f"CostParams.saturation_warps must be a positive int, found "
                f"{self.saturation_warps!r}"
            )

    def vector(self) -> tuple[float, float, float, float]:
        """The constants ``(c_iter, c_seg, c_fix, c_block)`` in feature order."""
        return (self.c_iter, self.c_seg, self.c_fix, self.c_block)


DEFAULT_COST = CostParams()

# A point in time as feature counts (iterations, segments, partial transfers, blocks) along the
# chain that produced it; its value is the dot product with the constants.
_Time = tuple[float, float, float, float]
_ZERO: _Time = (0.0, 0.0, 0.0, 0.0)
_OWNER, _WRITER, _ATOMIC, _PLAIN = 0, 1, 2, 3


def _add(t: _Time, d: _Time) -> _Time:
    return (t[0] + d[0], t[1] + d[1], t[2] + d[2], t[3] + d[3])


def _value(t: _Time, c: _Time) -> float:
    return t[0] * c[0] + t[1] * c[1] + t[2] * c[2] + t[3] * c[3]


def _resident(p: Plan, num_sms: int | None, blocks_per_sm: int | None) -> tuple[int, int]:
    """``(num_sms, blocks_per_sm)`` to model ``p`` with: the arguments, else the plan's."""
    num_sms = p.num_sms if num_sms is None else num_sms
    blocks_per_sm = p.blocks_per_sm if blocks_per_sm is None else blocks_per_sm
    if num_sms is None:
        raise CostModelError(
            f"the {p.policy} plan carries no SM count and num_sms=None was passed; "
            "pass num_sms= to model its waves"
        )
    for name, value in (("num_sms", num_sms), ("blocks_per_sm", blocks_per_sm)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CostModelError(f"{name} must be a positive int, found {value!r}")
    return num_sms, blocks_per_sm


def _check_fixup(fixup: str) -> None:
    if fixup not in FIXUPS:
        raise CostModelError(f"fixup must be one of {FIXUPS}, found {fixup!r}")


def _block_steps(p: Plan, fixup: str) -> list[list[tuple[int, int, int]]]:
    """Per block, ``(role, tile, iterations)`` per segment: what each segment costs and does."""
    steps = []
    for segments in p.work:
        items = []
        for tile, k0, k1 in segments:
            if p.peers(tile) == 1:
                role = _PLAIN
            elif fixup == "atomic":
                role = _ATOMIC
            else:
                role = _OWNER if k0 == 0 else _WRITER
            items.append((role, tile, k1 - k0))
        steps.append(items)
    return steps


def saturation(warps_per_block: int, dp_blocks_per_sm: int, cost: CostParams = DEFAULT_COST) -> int:
    """Resident blocks of a kernel that keep an SM busy: enough for ``cost.saturation_warps``,
    never more than the data-parallel kernel's occupancy (which then is the best an SM does).

    Examples
    --------
    >>> saturation(warps_per_block=8, dp_blocks_per_sm=6), saturation(16, 1)
    (2, 1)
    """
    return max(1, min(dp_blocks_per_sm, -(-cost.saturation_warps // warps_per_block)))


def _shares(p: Plan, num_sms: int, blocks_per_sm: int, saturation: int | None) -> list[float]:
    """Units each block takes per iteration: its SM is shared by the blocks of its wave resident
    there (spread evenly over the SMs), and runs at full throughput from ``saturation`` on."""
    busy = blocks_per_sm if saturation is None else saturation
    if isinstance(busy, bool) or not isinstance(busy, int) or busy < 1:
        raise CostModelError(f"saturation must be a positive int, found {busy!r}")
    slots = num_sms * blocks_per_sm
    shares = []
    for b in range(p.grid):
        in_wave = min(slots, p.grid - b // slots * slots)
        resident = min(blocks_per_sm, -(-in_wave // num_sms))
        shares.append(float(max(resident, busy)))
    return shares


def _simulate(p: Plan, slots: int, cost: CostParams, fixup: str, shares: list[float]) -> _Time:
    """List-schedule the blocks of ``p`` onto ``slots`` slots, block ``b`` running an iteration
    in ``shares[b]`` units; return the makespan's features."""
    _check_fixup(fixup)
    c = cost.vector()
    steps = _block_steps(p, fixup)
    start = _ZERO
    if fixup == "atomic" and p.split_tiles:
        waves = float(-(-len(p.split_tiles) // slots))
        start = (0.0, waves, 0.0, waves)
    ready: dict[int, _Time] = {}
    makespan = start
    for _ in range(_MAX_PASSES):
        heap = [(_value(start, c), s, start) for s in range(min(slots, p.grid))]
        new_ready: dict[int, _Time] = {}
        makespan = start
        for items, share in zip(steps, shares):
            _, slot, t = heapq.heappop(heap)
            t = _add(t, (0.0, 0.0, 0.0, 1.0))
            for role, tile, length in items:
                t = _add(t, (float(length) * share, 1.0, 0.0, 0.0))
                if role == _ATOMIC:
                    t = _add(t, (0.0, 0.0, 1.0, 0.0))
                elif role == _OWNER:
                    # Peers' partial ready times come from the previous pass: a peer block may be
                    # launched after its owner.
                    peers_done = ready.get(tile)
                    if peers_done is not None and _value(peers_done, c) > _value(t, c):
                        t = peers_done
                    t = _add(t, (0.0, 0.0, float(p.peers(tile) - 1), 0.0))
                elif role == _WRITER:
                    t = _add(t, (0.0, 0.0, 1.0, 0.0))
                    seen = new_ready.get(tile)
                    if seen is None or _value(t, c) > _value(seen, c):
                        new_ready[tile] = t
            if _value(t, c) > _value(makespan, c):
                makespan = t
            heapq.heappush(heap, (_value(t, c), slot, t))
        if new_ready.keys() == ready.keys() and all(
            math.isclose(_value(new_ready[k], c), _value(ready[k], c)) for k in ready
        ):
            break
        ready = new_ready
    return makespan


def critical_features(
    p: Plan,
    num_sms: int | None = None,
    blocks_per_sm: int | None = None,
    cost: CostParams = DEFAULT_COST,
    fixup: str = "workspace",
    saturation: int | None = None,
) -> tuple[float, float, float, float]:
    """Iterations, segments, partial transfers and blocks on the critical chain of ``p``.

    ``predicted_time(p, ...) == dot(critical_features(p, ...), cost.vector())``.

    Parameters
    ----------
    p : Plan
    num_sms, blocks_per_sm : int, optional
        Override the plan's; ``num_sms`` is required when the plan has none.
    cost : CostParams
        Constants that decide which chain is critical.
    fixup : str
        One of :data:`FIXUPS`.
    saturation : int, optional
        Resident blocks per SM that keep an SM busy (module docstring); the plan's own
        ``blocks_per_sm`` by default.

    Returns
    -------
    tuple of float
    """
    num_sms, blocks_per_sm = _resident(p, num_sms, blocks_per_sm)
    shares = _shares(p, num_sms, blocks_per_sm, saturation)
    return _simulate(p, num_sms * blocks_per_sm, cost, fixup, shares)


def predicted_time(
    p: Plan,
    num_sms: int | None = None,
    blocks_per_sm: int | None = None,
    cost: CostParams = DEFAULT_COST,
    fixup: str = "workspace",
    saturation: int | None = None,
) -> float:
    """Predicted run time of ``p`` in units (one K-panel iteration of one tile).

    Parameters
    ----------
    p : Plan
    num_sms, blocks_per_sm : int, optional
        Override the plan's; ``num_sms`` is required when the plan has none.
    cost : CostParams
    fixup : str
        One of :data:`FIXUPS`: how split tiles are combined.
    saturation : int, optional
        Resident blocks per SM that keep an SM busy (module docstring); the plan's own
        ``blocks_per_sm`` by default.

    Returns
    -------
    float
        The makespan of list-scheduling the blocks onto ``num_sms * blocks_per_sm`` slots, the
        resident blocks of an SM sharing it.

    Examples
    --------
    Three tiles of four panels on two slots: data-parallel needs a second wave.

    >>> p = plan(3, 4, num_sms=2, policy="data_parallel")
    >>> predicted_time(p, cost=CostParams(c_seg=4.0, c_fix=3.0, c_block=1.0))
    18.0
    """
    features = critical_features(p, num_sms, blocks_per_sm, cost, fixup, saturation)
    return _value(features, cost.vector())


def calibrate(
    measurements: Iterable[tuple[Plan, float]],
    num_sms: int | None = None,
    blocks_per_sm: int | None = None,
    initial: CostParams = DEFAULT_COST,
    rounds: int = 20,
    fixup: str = "workspace",
) -> CostParams:
    """Fit the constants to measured run times by least squares.

    For fixed constants every prediction is ``features . constants``; the fit alternates between
    taking the critical-chain features under the current constants and a least-squares solve of
    ``seconds ~ features . q`` with rows weighted by ``1 / seconds`` (relative error), until the
    constants stop changing. ``q`` is normalised to ``c_iter = 1`` and its scale kept as
    ``seconds_per_unit``. Negative fitted constants are clipped to zero.

    Parameters
    ----------
    measurements : iterable of (Plan, float)
        Plans with their measured run times in seconds. The plans must separate the constants:
        include Stream-K plans with split tiles (``c_fix``) and blocks that run several segments
        (``c_seg`` versus ``c_block``).
    num_sms, blocks_per_sm : int, optional
        Override the plans' values.
    initial : CostParams
        Starting constants; they only decide the first critical chains.
    rounds : int
        Most alternations.
    fixup : str
        The fixup the measured kernels used, one of :data:`FIXUPS`.

    Returns
    -------
    CostParams
        The fit with the smallest relative residual seen.

    Raises
    ------
    CostModelError
        When a time is not positive or the measurements cannot separate the constants.
    """
    rows: Sequence[tuple[Plan, float]] = list(measurements)
    if len(rows) < len(_FEATURES):
        raise CostModelError(
            f"calibrate needs at least {len(_FEATURES)} measurements, found {len(rows)}; "
            "measure more plans"
        )
    seconds = np.array([float(s) for _, s in rows])
    if not np.all(np.isfinite(seconds) & (seconds > 0)):
        raise CostModelError(
            f"measured times must be positive finite seconds, found {seconds.min()!r}; "
            "drop failed measurements"
        )
    params = initial
    best: tuple[float, CostParams] | None = None
    for _ in range(rounds):
        feats = np.array(
            [critical_features(p, num_sms, blocks_per_sm, params, fixup) for p, _ in rows]
        )
        weighted = feats / seconds[:, None]
        if np.linalg.matrix_rank(weighted) < len(_FEATURES):
            absent = [n for n, col in zip(_FEATURES, feats.T, strict=True) if not col.any()]
            found = f"no measurement exercises {absent}" if absent else "collinear features"
            raise CostModelError(
                f"the measurements cannot separate {_FEATURES}: {found}; add plans of other "
                "policies (stream_k with split tiles, blocks with several segments, several waves)"
            )
        q, *_ = np.linalg.lstsq(weighted, np.ones(len(rows)), rcond=None)
        if q[0] <= 0:
            raise CostModelError(
                f"the fitted seconds per iteration is {q[0]!r}, not positive; check that the "
                "measurements belong to the plans"
            )
        q = np.maximum(q, 0.0)
        fitted = CostParams(
            1.0,
            float(q[1] / q[0]),
            float(q[2] / q[0]),
            float(q[3] / q[0]),
            seconds_per_unit=float(q[0]),
            min_gain=initial.min_gain,
        )
        predicted = np.array(
            [predicted_time(p, num_sms, blocks_per_sm, fitted, fixup) for p, _ in rows]
        ) * float(q[0])
        residual = float(np.sum((predicted / seconds - 1.0) ** 2))
        if best is None or residual < best[0]:
            best = (residual, fitted)
        if np.allclose(fitted.vector(), params.vector(), rtol=1e-10, atol=1e-12):
            break
        params = fitted
    assert best is not None
    return best[1]


def candidates(tiles: int, panels: int, num_sms: int, blocks_per_sm: int = 1) -> list[Plan]:
    """The plans :func:`choose` compares, most data-parallel first.

    Each registered policy offers its own (:meth:`Policy.candidates
    <tvm_streamk.decomposition.policy.Policy.candidates>`): data-parallel; split-K for
    ``2 <= S <= min(panels, 16)`` while ``tiles * S`` fits in two waves; the one-tile and
    two-tile hybrids where they differ from both data-parallel and Stream-K; Stream-K. They are
    ordered by the policies' rank, which breaks ties: the more of a plan is data-parallel, the
    more it keeps the wave-by-wave L2 reuse that the model does not see.

    Parameters
    ----------
    tiles, panels, num_sms, blocks_per_sm : int
        As for :func:`tvm_streamk.decomposition.plan`.

    Returns
    -------
    list of Plan
    """
    slots = num_sms * blocks_per_sm
    out = []
    for rule in sorted(policies.concrete(), key=lambda r: r.rank):
        for kwargs in rule.candidates(tiles, panels, slots):
            out.append(plan(tiles, panels, num_sms, blocks_per_sm, rule.name, **kwargs))
    return out


def choose(
    tiles: int,
    panels: int,
    num_sms: int,
    blocks_per_sm: int = 1,
    cost: CostParams | None = None,
    fixup: str = "workspace",
    dp_blocks_per_sm: int | None = None,
    saturation: int | None = None,
) -> Plan:
    """Pick the decomposition with the smallest predicted time; fill :attr:`Plan.reason`.

    When the tiles fill whole waves data-parallel is chosen outright: it has no quantisation
    loss, and the model's only credit to a persistent Stream-K loop there (fewer block launches)
    is paid back by costs the model does not see. Otherwise every plan of :func:`candidates` is
    predicted and the fastest wins, ties going to the simpler policy, unless it beats
    data-parallel by less than ``cost.min_gain``.

    Parameters
    ----------
    tiles, panels, num_sms, blocks_per_sm : int
        As for :func:`tvm_streamk.decomposition.plan`.
    cost : CostParams, optional
        Constants of the model; :data:`DEFAULT_COST` when None.
    fixup : str
        The fixup the kernel will use, one of :data:`FIXUPS`.
    dp_blocks_per_sm : int, optional
        Resident blocks per SM of the data-parallel kernel (its occupancy); ``blocks_per_sm`` by
        default.
    saturation : int, optional
        Resident blocks that keep an SM busy (:func:`saturation`); ``dp_blocks_per_sm`` by
        default.

    Returns
    -------
    Plan

    Examples
    --------
    >>> choose(264, 64, num_sms=132).policy
    'data_parallel'
    >>> choose(133, 64, num_sms=132).policy
    'stream_k'
    """
    cost = DEFAULT_COST if cost is None else cost
    if not isinstance(cost, CostParams):
        raise DecompositionError(
            f"cost must be a tvm_streamk.cost_model.CostParams, found {type(cost).__name__}"
        )
    _check_fixup(fixup)
    dp_bps = blocks_per_sm if dp_blocks_per_sm is None else dp_blocks_per_sm
    busy = dp_bps if saturation is None else saturation
    dp = plan(tiles, panels, num_sms, dp_bps, "data_parallel")
    slots = num_sms * dp_bps
    waves = -(-tiles // slots)
    if tiles % slots == 0:
        return dataclasses.replace(
            dp,
            reason=f"tiles {tiles} = {waves} full wave(s) of {slots} slots: data-parallel has "
            "no quantisation loss",
        )
    t_dp = predicted_time(dp, cost=cost, fixup=fixup, saturation=busy)
    scored = [(t_dp, dp)] + [
        (predicted_time(c, cost=cost, fixup=fixup, saturation=busy), c)
        for c in candidates(tiles, panels, num_sms, blocks_per_sm)
        if c.policy != dp.policy
    ]
    t_best = min(t for t, _ in scored)
    # The first candidate within rounding of the minimum is the simplest of the fastest.
    t_pick, pick = next((t, c) for t, c in scored if t <= t_best * (1 + 1e-9))
    if t_pick > t_dp * (1 - cost.min_gain):
        t_pick, pick = scored[0]
    last = tiles - (waves - 1) * slots
    quant = f"data-parallel runs {waves} wave(s) of {slots} slots, the last {last}/{slots} full"
    if pick is dp:
        t_alt, alt = min(scored[1:], key=lambda sc: sc[0])
        why = (
            f"less than the {cost.min_gain:.0%} margin faster"
            if t_alt < t_dp
            else "segment and fixup costs outweigh the quantisation loss"
        )
        reason = (
            f"data_parallel predicted {t_dp:.0f} units vs best alternative {alt.label} "
            f"{t_alt:.0f} ({why}; {quant})"
        )
    else:
        reason = (
            f"{pick.label} on grid {pick.grid} predicted {t_pick:.0f} units vs data_parallel "
            f"{t_dp:.0f} ({t_dp / t_pick:.2f}x): {quant}"
        )
    return dataclasses.replace(pick, reason=reason)


policies.register_chooser("heuristic", choose)

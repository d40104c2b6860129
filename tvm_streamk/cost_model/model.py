"""The analytical cost model of a work decomposition: what a plan costs on a GPU.

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
      partial is written, then reads ``peers - 1`` of them before its epilogue: the first at
      ``c_fix``, the others at ``read_fraction`` of it (their bytes, read back to back). This is the
      Stream-K paper's fixup. The lowering's fixup lets the *last* peer to arrive read the
      partials instead, so no block stalls: the tile completes at the same modelled time, and
      the owner is free earlier, so the model is slightly pessimistic for the generated code.
  ``"separate"``
      every segment of a split tile writes its partial, with no waiting; a second kernel then
      runs a block per split tile (in waves over the slots) that reads its ``peers`` partials
      and stores the tile.
  ``"atomic"``
      every segment of a split tile atomically adds its partial to the output, with no waiting;
      a prologue kernel first zeroes the split tiles, costing ``c_block + c_seg`` per tile in
      waves over the slots (its launch latency is not modelled).

Per SM. The unit is one K-panel iteration of one tile at the SM's full throughput. Blocks are
list-scheduled in launch order onto ``num_sms * blocks_per_sm`` resident slots (each block
starts on the slot that frees first), and the ``blocks_per_sm`` blocks resident on one SM share
it: ``resident`` blocks (those of its wave on its SM, the wave spread evenly over the SMs, at
most ``blocks_per_sm``) share it, and it runs at full throughput from ``saturation`` resident
blocks on (:func:`saturation`; by default the plan's own ``blocks_per_sm``). An SM holding fewer
runs at ``(resident / saturation) ** occupancy_exponent`` of its throughput
(:attr:`CostParams.occupancy_exponent`: 1, the latency-bound limit, in units); one holding more
shares its full throughput among them, and more resident blocks are no free work.
Segment and fix-up costs are latencies and are not shared. The predicted time is the makespan.
The owner waits make start times depend on finish times, so the schedule is iterated to a fixed
point (exact when every block is resident at once, which the Stream-K family guarantees).

Every predicted time is a sum of constants along one critical chain of blocks and segments, so it
is linear in the constants for a fixed schedule; :func:`~.calibration.calibrate` uses that to fit
them to measurements by least squares.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from .. import fixup_registry
from ..decomposition import Plan

# Fixed-point passes of the scheduler; two suffice when all blocks are resident at once.
_MAX_PASSES = 8

FEATURES = ("c_iter", "c_seg", "c_fix", "c_block")


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
    that. Fit them to a GPU with :func:`~tvm_streamk.cost_model.calibrate`.

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
        Seconds per unit, set by :func:`~tvm_streamk.cost_model.calibrate`; None for the
        uncalibrated defaults.
    min_gain : float
        Not a model constant but the heuristic's margin: a Stream-K-family plan must be predicted
        this fraction faster than data-parallel to be chosen, because it pays costs the model
        does not see (the persistent loop's index arithmetic, and the weaker L2 reuse of blocks
        that walk distant tiles at the same time). :func:`~tvm_streamk.cost_model.calibrate`
        keeps it.
    saturation_warps : int
        Resident warps that keep an SM busy: four per warp scheduler of the four an SM has, the
        usual minimum to hide arithmetic and shared-memory latency (uncalibrated).
        :func:`saturation` turns it into blocks of a kernel.
    occupancy_exponent : float
        How an SM's throughput falls below saturation: with ``r`` of ``saturation`` blocks
        resident it runs at ``(r / saturation) ** occupancy_exponent`` of its full rate. 1 (the
        default in units) is the latency-bound limit, where throughput is proportional to the
        resident warps; 0 would make one block as fast as a full SM. A priced kernel takes its
        price's (:data:`~tvm_streamk.cost_model.physical.OCCUPANCY_EXPONENT` of its
        instruction class).
    read_fraction : float
        What the owner of a split tile pays for each peer's partial after the first, as a
        fraction of ``c_fix``: the first pays the hand-off (the wait, the fence, the atomic),
        the rest only their bytes, read back to back. 1 (the default in units) prices every read
        as a whole hand-off; a priced kernel takes its price's bytes over its ``c_fix``.
    """

    c_iter: float = 1.0
    c_seg: float = 6.0
    c_fix: float = 6.0
    c_block: float = 1.0
    seconds_per_unit: float | None = None
    min_gain: float = 0.03
    saturation_warps: int = 16
    # The kernel's price on a named GPU (:func:`priced`): then an iteration's time comes from
    # its bytes and FLOPs, the other constants are microseconds, and predictions pay the
    # launches and never go below the roofline.
    price: object | None = None
    # A batch-invariant kernel's plan (:mod:`tvm_streamk.decomposition.chunks`): an iteration
    # is a chunk, and every chunk of every tile is its own segment whose partial is written
    # (``c_fix``), the tile's last chunk reading all of them back, split or not.
    chunk_merges: bool = False
    occupancy_exponent: float = 1.0
    read_fraction: float = 1.0

    def __post_init__(self) -> None:
        for name in FEATURES:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise CostModelError(
                    f"CostParams.{name} must be a finite non-negative number, found {value!r}"
                )
        if self.c_iter <= 0:
            raise CostModelError(f"CostParams.c_iter must be positive, found {self.c_iter!r}")
        if not 0 <= self.min_gain < 1:
            raise CostModelError(f"CostParams.min_gain must be in [0, 1), found {self.min_gain!r}")
        for name in ("occupancy_exponent", "read_fraction"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value <= 1):
                raise CostModelError(
                    f"CostParams.{name} must be a number in [0, 1], found {value!r}"
                )
        if not isinstance(self.saturation_warps, int) or self.saturation_warps < 1:
            raise CostModelError(
                f"CostParams.saturation_warps must be a positive int, found "
                f"{self.saturation_warps!r}"
            )

    def vector(self) -> tuple[float, float, float, float]:
        """The constants ``(c_iter, c_seg, c_fix, c_block)`` in feature order."""
        return (self.c_iter, self.c_seg, self.c_fix, self.c_block)

    @property
    def unit(self) -> str:
        """What a predicted time is counted in: ``"us"`` on a named GPU, else ``"units"``."""
        return "us" if self.price is not None else "units"


DEFAULT_COST = CostParams()


def priced(price, min_gain: float | None = None) -> CostParams:
    """The model's constants in microseconds for a priced kernel
    (:func:`tvm_streamk.cost_model.physical.price`)."""
    from .physical import MIN_GAIN

    return CostParams(
        c_iter=1.0,
        c_seg=price.segment_us,
        c_fix=price.fix_us,
        c_block=price.block_us,
        seconds_per_unit=1e-6,
        min_gain=MIN_GAIN if min_gain is None else min_gain,
        price=price,
        occupancy_exponent=price.occupancy_exponent,
        read_fraction=min(1.0, price.read_us / price.fix_us) if price.fix_us > 0 else 1.0,
    )


# A point in time as feature counts (iterations, segments, partial transfers, blocks) along the
# chain that produced it; its value is the dot product with the constants.
_Time = tuple[float, float, float, float]
_ZERO: _Time = (0.0, 0.0, 0.0, 0.0)
_OWNER, _WRITER, _ATOMIC, _PLAIN, _CHUNK, _LAST_CHUNK = 0, 1, 2, 3, 4, 5


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


def check_fixup(fixup: str) -> None:
    """Raise :class:`CostModelError` unless ``fixup`` is a registered fix-up
    (:mod:`tvm_streamk.fixup_registry`)."""
    if fixup not in fixup_registry.names():
        raise CostModelError(
            f"fixup must be one of {list(fixup_registry.names())}, found {fixup!r}"
        )


def _merge_kind(fixup: str) -> str:
    """How ``fixup`` merges, as the model prices it (the fix-up's ``merge_kind``)."""
    return fixup_registry.get(fixup).merge_kind


def _block_steps(
    p: Plan, fixup: str, chunk_merges: bool = False
) -> list[list[tuple[int, int, int]]]:
    """Per block, ``(role, tile, iterations)`` per segment: what each segment costs and does.
    With ``chunk_merges`` every iteration of a plan of several chunks is a segment of its own."""
    kind = _merge_kind(fixup)
    steps = []
    for segments in p.work:
        items = []
        for tile, k0, k1 in segments:
            if chunk_merges and p.panels > 1:
                items += [
                    (_LAST_CHUNK if k == p.panels - 1 else _CHUNK, tile, 1) for k in range(k0, k1)
                ]
                continue
            if p.peers(tile) == 1:
                role = _PLAIN
            elif kind == "atomic":
                role = _ATOMIC
            elif kind == "second_kernel":
                # Every peer writes its partial; a second kernel sums them (_simulate).
                role = _WRITER
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


def _shares(
    p: Plan, num_sms: int, blocks_per_sm: int, saturation: int | None, cost: CostParams
) -> list[float]:
    """Units (or, priced, microseconds) each block takes per iteration: its SM is shared by the
    blocks of its wave resident there (spread evenly over the SMs), and runs at full throughput
    from ``saturation`` on, below it at ``(resident / saturation) ** cost.occupancy_exponent``
    of it. Priced, an iteration at full throughput takes the longer of its math and its
    device-memory traffic, which depends on how many SMs are active."""
    price, exponent = cost.price, cost.occupancy_exponent
    busy = blocks_per_sm if saturation is None else saturation
    if isinstance(busy, bool) or not isinstance(busy, int) or busy < 1:
        raise CostModelError(f"saturation must be a positive int, found {busy!r}")
    slots = num_sms * blocks_per_sm
    shares = []
    # Every block of a wave shares alike: one value per wave.
    for first in range(0, p.grid, slots):
        in_wave = min(slots, p.grid - first)
        resident = min(blocks_per_sm, -(-in_wave // num_sms))
        # ``resident`` blocks share an SM running at (resident / busy) ** exponent of its rate.
        share = float(resident) if resident >= busy else resident ** (1 - exponent) * busy**exponent
        if price is not None:
            active = min(num_sms, in_wave)
            share *= price.iteration_us(active, in_wave, p.tiles, p.panels)
        shares += [share] * in_wave
    return shares


def _simulate(p: Plan, slots: int, cost: CostParams, fixup: str, shares: list[float]) -> _Time:
    """List-schedule the blocks of ``p`` onto ``slots`` slots, block ``b`` running an iteration
    in ``shares[b]`` units; return the makespan's features."""
    check_fixup(fixup)
    c = cost.vector()
    steps = _block_steps(p, fixup, cost.chunk_merges)
    start = _ZERO
    if _merge_kind(fixup) == "atomic" and p.split_tiles:
        waves = float(-(-len(p.split_tiles) // slots))
        start = (0.0, waves, 0.0, waves)
    ready: dict[int, _Time] = {}
    makespan = start
    for _ in range(_MAX_PASSES):
        heap = [(_value(start, c), s, start) for s in range(min(slots, p.grid))]
        new_ready: dict[int, _Time] = {}
        makespan, latest = start, _value(start, c)
        for items, share in zip(steps, shares):
            _, slot, t = heapq.heappop(heap)
            t = (t[0], t[1], t[2], t[3] + 1.0)
            for role, tile, length in items:
                t = (t[0] + float(length) * share, t[1] + 1.0, t[2], t[3])
                if role == _PLAIN:
                    continue
                if role in (_ATOMIC, _CHUNK):
                    t = _add(t, (0.0, 0.0, 1.0, 0.0))
                elif role == _LAST_CHUNK:
                    # Its own partial written, then every chunk's read back (the last arriver
                    # of the workspace fix-up; modelled as the tile's last chunk).
                    t = _add(t, (0.0, 0.0, 1.0 + p.panels, 0.0))
                elif role == _OWNER:
                    # Peers' partial ready times come from the previous pass: a peer block may be
                    # launched after its owner.
                    peers_done = ready.get(tile)
                    if peers_done is not None and _value(peers_done, c) > _value(t, c):
                        t = peers_done
                    # The first peer's partial costs a hand-off, the others their bytes.
                    reads = 1.0 + (p.peers(tile) - 2) * cost.read_fraction
                    t = _add(t, (0.0, 0.0, reads, 0.0))
                elif role == _WRITER:
                    t = _add(t, (0.0, 0.0, 1.0, 0.0))
                    seen = new_ready.get(tile)
                    if seen is None or _value(t, c) > _value(seen, c):
                        new_ready[tile] = t
            done = _value(t, c)
            if done > latest:
                makespan, latest = t, done
            heapq.heappush(heap, (done, slot, t))
        if new_ready.keys() == ready.keys() and all(
            math.isclose(_value(new_ready[k], c), _value(ready[k], c)) for k in ready
        ):
            break
        ready = new_ready
    if _merge_kind(fixup) == "second_kernel" and p.split_tiles:
        # The second kernel: a block per split tile in waves over the slots, each reading its
        # peers' partials and writing the tile.
        waves = float(-(-len(p.split_tiles) // slots))
        makespan = _add(makespan, (0.0, waves, waves * p.max_peers, waves))
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
        A registered fix-up (:mod:`tvm_streamk.fixup_registry`).
    saturation : int, optional
        Resident blocks per SM that keep an SM busy (module docstring); the plan's own
        ``blocks_per_sm`` by default.

    Returns
    -------
    tuple of float
    """
    num_sms, blocks_per_sm = _resident(p, num_sms, blocks_per_sm)
    shares = _shares(p, num_sms, blocks_per_sm, saturation, cost)
    return _simulate(p, num_sms * blocks_per_sm, cost, fixup, shares)


def predicted_time(
    p: Plan,
    num_sms: int | None = None,
    blocks_per_sm: int | None = None,
    cost: CostParams = DEFAULT_COST,
    fixup: str = "workspace",
    saturation: int | None = None,
) -> float:
    """Predicted run time of ``p``: in microseconds when ``cost`` prices the kernel on a named
    GPU (:func:`priced`), else in units (one K-panel iteration of one tile).

    Parameters
    ----------
    p : Plan
    num_sms, blocks_per_sm : int, optional
        Override the plan's; ``num_sms`` is required when the plan has none.
    cost : CostParams
    fixup : str
        A registered fix-up: how split tiles are combined.
    saturation : int, optional
        Resident blocks per SM that keep an SM busy (module docstring); the plan's own
        ``blocks_per_sm`` by default.

    Returns
    -------
    float
        The makespan of list-scheduling the blocks onto ``num_sms * blocks_per_sm`` slots, the
        resident blocks of an SM sharing it; priced, plus the launches (the kernel, and the
        fix-up's prologue where tiles are split), and never below the GEMM's roofline.

    Examples
    --------
    Three tiles of four panels on two slots: data-parallel needs a second wave.

    >>> p = plan(3, 4, num_sms=2, policy="data_parallel")
    >>> predicted_time(p, cost=CostParams(c_seg=4.0, c_fix=3.0, c_block=1.0))
    18.0
    """
    features = critical_features(p, num_sms, blocks_per_sm, cost, fixup, saturation)
    value = _value(features, cost.vector())
    if cost.price is None:
        return value
    merges = p.split_tiles or (cost.chunk_merges and p.panels > 1)
    launches = 1 + (1 if merges else 0)
    return max(value + launches * cost.price.launch_us, cost.price.floor_us(p.tiles))

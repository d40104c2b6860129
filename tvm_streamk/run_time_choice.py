"""The policy of a run-time tile count, chosen by the cost model when the kernel runs.

A dynamic-shape kernel (a symbolic token count) has one build for every M, so the heuristic
cannot pick data-parallel or Stream-K at compile time. The build holds two kernels, and the host
picks one from the run-time tile count ``T``:

* :func:`stream_k_buckets` asks the cost model (:func:`tvm_streamk.cost_model.predicted_time`,
  with the margin of :func:`tvm_streamk.cost_model.choose`) for each *bucket* of the tile count:
  ``W`` waves of ``slots`` blocks and a last wave filled to an eighth, a quarter, ... of the
  slots. A bucket is decided at its fullest count, where Stream-K gains least, so a bucket
  that takes Stream-K takes it for each of its counts with the same or a larger predicted gain.
  Every bucket of the first wave is asked; past it the buckets that take Stream-K are a wave's
  emptiest, found by bisection. Waves from the first where Stream-K wins no bucket (at most
  ``MAX_WAVES``) are data-parallel. Both are priced at the persistent kernel's resident
  blocks: the waves the buckets count are its slots.
* :class:`StreamKOrDataParallel` (``policy="stream_k", variant="or_data_parallel"``, what
  ``policy="heuristic"`` records for a run-time count) launches the persistent kernel on
  ``min(slots, T*P)`` blocks when ``T`` lies in a Stream-K bucket, and the kernel as written
  (one block per tile, its own registers and occupancy) otherwise
  (:meth:`StreamKOrDataParallel.run_time_persistent`; the branch is the host's,
  :mod:`tvm_streamk.transform.host_branches`). Its closed forms are Stream-K's; on ``T``
  blocks they give each block one whole tile, the grid :meth:`~StreamKOrDataParallel.run_time_grid`
  still names for a count outside the buckets.

On the H200 the persistent kernel of dlight's fp32 schedule took 72 registers and 7 blocks per
SM where the kernel as written takes 64 and 8, and at 512 or more rows it ran 0.84-0.88x as
fast as the kernel as written (docs/benchmarks-gpu.md): the reason data-parallel counts get
their own kernel. The SM count must be known at compile time (the buckets are sized by it):
``num_sms="device"`` is refused.
"""

from __future__ import annotations

import functools
from typing import Any

from . import cost_model
from .decomposition import plan
from .decomposition.ops import DecompositionError
from .decomposition.policy import register
from .decomposition.stream_k import StreamK

__all__ = [
    "MAX_WAVES",
    "StreamKOrDataParallel",
    "describe",
    "stream_k_buckets",
    "stream_k_wins",
]

# Fill levels of the last wave a bucket ends at: eighths of the slots.
FILL_STEPS = 8
# Waves after which the count is always data-parallel: the quantisation loss of W full waves
# and a tail is at most 1/W of the run time, 6% from here on, which the costs the model does
# not see (the persistent loop's index arithmetic, weaker L2 reuse) can take back.
MAX_WAVES = 16


def stream_k_wins(
    tiles: int,
    panels: int,
    num_sms: int,
    blocks_per_sm: int,
    fixup: str = "workspace",
    cost: cost_model.CostParams | None = None,
    saturation: int | None = None,
) -> bool:
    """Whether the cost model takes Stream-K over data-parallel for ``tiles`` tiles:
    :func:`tvm_streamk.cost_model.choose`'s rule between these two plans (whole waves are
    data-parallel; Stream-K must be ``cost.min_gain`` faster)."""
    cost = cost_model.DEFAULT_COST if cost is None else cost
    slots = num_sms * blocks_per_sm
    if tiles % slots == 0:
        return False
    dp = plan(tiles, panels, num_sms, blocks_per_sm, "data_parallel")
    sk = plan(tiles, panels, num_sms, blocks_per_sm, "stream_k")
    t_dp = cost_model.predicted_time(dp, cost=cost, fixup=fixup, saturation=saturation)
    t_sk = cost_model.predicted_time(sk, cost=cost, fixup=fixup, saturation=saturation)
    return t_sk < t_dp * (1 - cost.min_gain)


@functools.cache
def stream_k_buckets(
    panels: int,
    num_sms: int,
    blocks_per_sm: int,
    fixup: str = "workspace",
    cost: cost_model.CostParams | None = None,
    saturation: int | None = None,
) -> tuple[tuple[int, int], ...]:
    """The tile counts that take Stream-K, as merged inclusive ranges ``(first, last)``.

    Examples
    --------
    >>> stream_k_buckets(panels=64, num_sms=4, blocks_per_sm=1)[:3]
    ((1, 2), (5, 6), (9, 10))
    """
    slots = num_sms * blocks_per_sm
    ends = sorted({max(1, -(-q * slots // FILL_STEPS)) for q in range(1, FILL_STEPS + 1)})
    ranges: list[tuple[int, int]] = []
    for wave in range(MAX_WAVES):
        start = wave * slots

        def wins(i: int, start=start) -> bool:
            return stream_k_wins(
                start + ends[i], panels, num_sms, blocks_per_sm, fixup, cost, saturation
            )

        if wave == 0:
            # Fewer tiles than slots: a tile has up to slots/tiles peers, and the fix-up of
            # many peers can cost more than the idle slots, so every bucket is asked.
            for i, end in enumerate(ends):
                if wins(i):
                    low = 1 if i == 0 else ends[i - 1] + 1
                    if ranges and ranges[-1][1] == low - 1:
                        ranges[-1] = (ranges[-1][0], end)
                    else:
                        ranges.append((low, end))
            continue
        # Past a full wave a tile has at most two peers: the emptier the last wave, the more
        # Stream-K gains, so the buckets that take it are the wave's first, found by bisection.
        lo, hi = 0, len(ends)
        while lo < hi:
            mid = (lo + hi) // 2
            if wins(mid):
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            break
        ranges.append((start + 1, start + ends[lo - 1]))
    return tuple((lo, hi) for lo, hi in ranges)


def describe(buckets: tuple[tuple[int, int], ...]) -> str:
    """A plan's reason for ``buckets`` (:func:`stream_k_buckets`)."""
    where = ", ".join(f"{lo}..{hi}" for lo, hi in buckets[:4])
    where += ", ..." if len(buckets) > 4 else ""
    return (
        "the tile count is known only at run time: the kernel launches Stream-K for the counts "
        f"the cost model gives it ({where or 'none'} tiles) and data-parallel otherwise"
    )


def _in_buckets(tiles: Any, buckets, ops) -> Any:
    """Whether ``tiles`` lies in one of ``buckets``, as an expression of ``ops``."""
    found = None
    for lo, hi in buckets:
        inside = ops.and_(ops.ge(tiles, lo), ops.le(tiles, hi))
        found = inside if found is None else ops.or_(found, inside)
    return found


@register
class StreamKOrDataParallel(StreamK):
    """Stream-K when the cost model says so for the tile count, else data-parallel (module
    docstring); the grid is chosen when the kernel runs."""

    variant = "or_data_parallel"
    default = False
    code = 5
    rank = 45
    # The data-parallel grid is one block per tile, more than the resident blocks.
    persistent = False
    # The buckets are sized by the SM count: it must be known at compile time.
    runtime_grid = False

    def label(self, p):
        return "stream_k or data_parallel"

    def grid_for(self, tiles, panels, slots, splits):
        raise DecompositionError(
            "policy stream_k(or_data_parallel) chooses its grid from the tile count when the "
            "kernel runs; make its plan with plan_at_run_time"
        )

    def candidates(self, tiles, panels, slots):
        return []

    def plan_at_count(self, tiles, panels, num_sms, blocks_per_sm, fixup, buckets=None):
        if buckets is None:
            buckets = stream_k_buckets(panels, num_sms, blocks_per_sm, fixup)
        stream_k = any(lo <= tiles <= hi for lo, hi in buckets)
        chosen = plan(
            tiles, panels, num_sms, blocks_per_sm, "stream_k" if stream_k else "data_parallel"
        )
        which = "a Stream-K bucket" if stream_k else "no Stream-K bucket"
        return chosen.with_reason(f"{tiles} tiles lie in {which} of the run-time choice")

    def run_time_grid(self, p, slots, ops, fixup):
        stream_k = ops.min(slots, p.iterations)
        buckets = self._buckets(p, fixup)
        if not buckets:
            return p.tiles
        return ops.select(_in_buckets(p.tiles, buckets, ops), stream_k, p.tiles)

    def run_time_persistent(self, p, ops, fixup):
        # Outside the Stream-K buckets the kernel as written runs: the tiles the persistent
        # kernel would run on T blocks, at the data-parallel kernel's registers and occupancy.
        buckets = self._buckets(p, fixup)
        return _in_buckets(p.tiles, buckets, ops) if buckets else False

    @staticmethod
    def _buckets(p, fixup):
        if p.buckets is not None:
            return p.buckets
        return stream_k_buckets(p.panels, p.num_sms, p.blocks_per_sm, fixup)

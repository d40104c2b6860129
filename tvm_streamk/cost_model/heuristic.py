"""The heuristic on top of the cost model: the decomposition with the smallest predicted time.

Registered as the ``"heuristic"`` chooser of :mod:`tvm_streamk.decomposition.policy`, so
``plan(policy="heuristic")`` and the primitive's default choose with it.
"""

from __future__ import annotations

import dataclasses

from ..decomposition import DecompositionError, Plan, plan
from ..decomposition import policy as policies
from .model import DEFAULT_COST, CostParams, check_fixup, predicted_time


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
    is paid back by costs the model does not see. A plan that splits no tile is never a rival:
    it walks the same whole tiles in the same rounds. Otherwise every plan of
    :func:`candidates` that splits a tile is predicted and the fastest wins, ties going to the
    simpler policy, unless it beats data-parallel by less than ``cost.min_gain`` (the model's
    stated uncertainty).

    Parameters
    ----------
    tiles, panels, num_sms, blocks_per_sm : int
        As for :func:`tvm_streamk.decomposition.plan`.
    cost : CostParams, optional
        Constants of the model; :data:`DEFAULT_COST` when None.
    fixup : str
        The fixup the kernel will use, a registered fix-up (:mod:`tvm_streamk.fixup_registry`).
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
    check_fixup(fixup)
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
    last = tiles - (waves - 1) * slots
    quant = f"data-parallel runs {waves} wave(s) of {slots} slots, the last {last}/{slots} full"
    # A plan that splits no tile walks the same whole tiles in the same rounds as
    # data-parallel: whatever the model credits it with (fewer launches) is not a gain.
    rivals = [
        c
        for c in candidates(tiles, panels, num_sms, blocks_per_sm)
        if c.policy != dp.policy and c.split_tiles
    ]
    if not rivals:
        return dataclasses.replace(
            dp,
            reason=f"data_parallel: no decomposition splits a tile ({panels} K-panel(s) per "
            f"tile), so none gains; {quant}",
        )
    unit = cost.unit
    t_dp = predicted_time(dp, cost=cost, fixup=fixup, saturation=busy)
    scored = [(t_dp, dp)] + [
        (predicted_time(c, cost=cost, fixup=fixup, saturation=busy), c) for c in rivals
    ]
    t_best = min(t for t, _ in scored)
    # The first candidate within rounding of the minimum is the simplest of the fastest.
    t_pick, pick = next((t, c) for t, c in scored if t <= t_best * (1 + 1e-9))
    if t_pick > t_dp * (1 - cost.min_gain):
        t_pick, pick = scored[0]
    if pick is dp:
        t_alt, alt = min(scored[1:], key=lambda sc: sc[0])
        why = (
            f"less than the {cost.min_gain:.0%} margin faster"
            if t_alt < t_dp
            else "segment and fixup costs outweigh the quantisation loss"
        )
        reason = (
            f"data_parallel predicted {_fmt(t_dp)} {unit} vs best alternative {alt.label} "
            f"{_fmt(t_alt)} ({why}; {quant})"
        )
    else:
        reason = (
            f"{pick.label} on grid {pick.grid} predicted {_fmt(t_pick)} {unit} vs data_parallel "
            f"{_fmt(t_dp)} ({t_dp / t_pick:.2f}x): {quant}"
        )
    return dataclasses.replace(pick, reason=reason)


policies.register_chooser("heuristic", choose)


def _fmt(t: float) -> str:
    return f"{t:.0f}" if t >= 100 else f"{t:.3g}"

"""Preconditions of a Stream-K decision that involve more than the block itself.

Preconditions of the block alone (its loops, accumulator, write-back) are found by
:mod:`tvm_streamk.analysis`; the ones stated here combine the analysed site with the decision.
Each is stated once and called by the primitive (``stream_k``), by the lowering pass
(``LowerStreamK``, which sees decisions written by hand or by MetaSchedule) and by the
MetaSchedule annotation.
"""

from __future__ import annotations

from .analysis.ragged import COND_RAGGED
from .decomposition import policy as policies
from .errors import StreamKError

# Condition names of the rules below, as StreamKError.condition reports them.
COND_RUNTIME_GRID = "num-sms"
COND_GROUP = "group"
COND_FRAGMENT_SPLIT = "fragment-aligned-split"
COND_PANEL_CHAIN = "panel-loop"
COND_RUNTIME_TILES = "runtime-tiles"


def check_runtime_grid(policy: str, fragment_accumulator: bool, where: str = "") -> None:
    """Refuse a grid read from the device at run time (``num_sms="device"``) where it cannot work.

    Only a policy whose closed forms take a grid variable (``stream_k``) can; the others fix
    their grid from the SM count at compile time, and a chooser such as ``heuristic`` needs the
    count to choose. Tensor-core fragments take only the aligned
    split-K, whose grid is the tile count times the split. Both fix-ups work: the workspace
    fix-up is sized for the largest grid the run time launches
    (:meth:`~tvm_streamk.decomposition.Plan.runtime_grid_bound`).
    """
    on = f" on block {where!r}" if where else ""
    if fragment_accumulator:
        raise StreamKError(
            COND_RUNTIME_GRID,
            f"num_sms='device' for a tensor-core fragment accumulator{on}",
            "The aligned split of fragments fixes its grid at compile time; pass num_sms.",
        )
    capable = list(dict.fromkeys(p.name for p in policies.concrete() if p.runtime_grid))
    if policy not in capable:
        raise StreamKError(
            COND_RUNTIME_GRID,
            f"num_sms='device' with policy={policy!r}{on}",
            f"Only policy {' or '.join(map(repr, capable))} derives its work split from the "
            "run-time grid; pass num_sms for the other policies.",
        )


def check_runtime_tiles(site, policy: str, group: int | None, where: str = "") -> None:
    """Refuse a decision a tile count known only at run time (a dynamic M) cannot take.

    The persistent grid is then computed at run time, ``min(resident blocks, tiles * panels)``
    blocks, and the kernel evaluates the closed forms on the run-time count: only a policy
    whose closed forms take a run-time grid can (``stream_k``), or one that is the kernel as
    written (``data_parallel``); ``heuristic`` records Stream-K or data-parallel chosen by the
    cost model at run time (:mod:`tvm_streamk.run_time_choice`).
    Tensor-core fragments take only aligned splits, whose grid is fixed at compile time, and the
    grouped tile order divides by the band's extents.
    """
    if not site.runtime_tiles:
        return
    on = f" of block {where!r}" if where else ""
    found = f"the run-time tile count {site.tile_count}{on}"
    capable = list(
        dict.fromkeys(p.name for p in policies.concrete() if p.runtime_grid or p.is_original)
    )
    if policy not in capable and policy != "heuristic":
        raise StreamKError(
            COND_RUNTIME_TILES,
            f"policy={policy!r} for {found}",
            f"Pass policy={' or '.join(map(repr, [*capable, 'heuristic']))}, or specialise the "
            "shape (one kernel per M) for the other policies.",
        )
    chooser = policy == "heuristic"
    if not chooser and policies.get(policy).is_original:
        return
    # The heuristic keeps a fragment kernel data-parallel.
    if site.fragment_accumulator and not chooser:
        raise StreamKError(
            COND_RUNTIME_TILES,
            f"a tensor-core fragment accumulator with {found}",
            "Fragments take only aligned splits, fixed at compile time: specialise the shape, "
            "or use policy='data_parallel'.",
        )
    if group:
        raise StreamKError(
            COND_RUNTIME_TILES,
            f"group={group} with {found}",
            "Drop group: the grouped order needs compile-time tile extents.",
        )


def check_ragged(site, policy: str, where: str = "") -> None:
    """Refuse a decision a grouped GEMM cannot take.

    Its tile count is read on the device (:mod:`tvm_streamk.analysis.ragged`), so only a fixed
    persistent grid can walk it: ``stream_k`` (which ``heuristic`` becomes), or the kernel as
    written (``data_parallel``: a tile per group for the largest group's every row tile).
    """
    if site.ragged is None:
        return
    on = f" of block {where!r}" if where else ""
    if policy not in ("stream_k", "data_parallel", "heuristic"):
        raise StreamKError(
            COND_RAGGED,
            f"policy={policy!r} for the grouped GEMM{on}, whose tile count only the device knows",
            "Pass policy='stream_k' (or 'heuristic', which takes it), or 'data_parallel' for the "
            "padded kernel as written.",
        )
    if site.fragment_accumulator and policy != "data_parallel":
        raise StreamKError(
            COND_RAGGED,
            f"a tensor-core fragment accumulator in the grouped GEMM{on}",
            "Fragments take only aligned splits fixed at compile time: use policy="
            "'data_parallel', or accumulate in registers.",
        )


def check_group(group: int | None, band_extents: tuple, where: str = "") -> None:
    """Refuse a tile-row group (``group=g``) on a band of fewer than two dimensions.

    The grouped order walks ``g`` tile rows column-major, which needs a row and a column axis;
    MetaSchedule's MultiLevelTiling fuses its tiles into one ``blockIdx`` loop.
    """
    if group and len(band_extents) < 2:
        on = f" of block {where!r}" if where else ""
        raise StreamKError(
            COND_GROUP,
            f"group={group} for the one-dimensional tile band {tuple(band_extents)}{on}",
            "Drop group (the fused band has no tile rows to group), or keep the tile loops "
            "unfused (one blockIdx loop per axis).",
        )


def check_fragment_plan(plan, fragment_accumulator: bool, where: str = "") -> None:
    """Refuse a plan a tensor-core fragment accumulator cannot take.

    Fragments have no addressable elements and the software pipeline over K panels needs a
    constant trip count, so a fragment tile is only ever computed whole (a policy that is the
    kernel as written) or cut into ``S`` equal panel ranges with ``S`` dividing the panel count
    (:meth:`~tvm_streamk.decomposition.policy.Policy.aligned_splits`).
    """
    if not fragment_accumulator or plan.scheme.is_original or plan.aligned_splits is not None:
        return
    on = f" of block {where!r}" if where else ""
    divisors = [d for d in range(2, plan.panels + 1) if plan.panels % d == 0]
    raise StreamKError(
        COND_FRAGMENT_SPLIT,
        f"a {plan.label} decomposition of {plan.panels} panels for the tensor-core fragment "
        f"accumulator{on}",
        f"Fragments take only aligned splits: split_k with a split that divides the panel "
        f"count, one of {divisors}, or data_parallel (policy 'stream_k' or 'heuristic' picks "
        "one for you in tvm_streamk.stream_k).",
    )


def check_one_panel_loop(site, where: str = "") -> None:
    """Refuse a reduction whose K-panels are several nested loops (``rh, rw, rc_0``).

    Splitting the outermost alone would give Stream-K ``rh`` panels; the loops must be fused into
    one panel loop first, which :func:`tvm_streamk.stream_k` does (a ``fuse`` in the trace).
    """
    if len(site.panel_chain) <= 1:
        return
    names = [loop.loop_var.name for loop in site.panel_chain]
    on = f" of block {where!r}" if where else ""
    raise StreamKError(
        COND_PANEL_CHAIN,
        f"the reduction{on} runs over the nested loops {names}, "
        f"{' x '.join(str(int(loop.extent)) for loop in site.panel_chain)} panels",
        f"Fuse them into one K-panel loop first (sch.fuse over {names}); "
        "tvm_streamk.stream_k does so itself.",
    )

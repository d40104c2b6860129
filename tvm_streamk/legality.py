"""Preconditions of a Stream-K decision that involve more than the block itself.

Preconditions of the block alone (its loops, accumulator, write-back) are found by
:mod:`tvm_streamk.analysis`; the ones stated here combine the analysed site with the decision.
Each is stated once and called by the primitive (``stream_k``), by the lowering pass
(``LowerStreamK``, which sees decisions written by hand or by MetaSchedule) and by the
MetaSchedule annotation.
"""

from __future__ import annotations

from .errors import StreamKError

# Condition names of the rules below, as StreamKError.condition reports them.
COND_RUNTIME_GRID = "num-sms"
COND_GROUP = "group"


def check_runtime_grid(policy: str, fragment_accumulator: bool, where: str = "") -> None:
    """Refuse a grid read from the device at run time (``num_sms="device"``) where it cannot work.

    Only ``stream_k`` evaluates its closed forms on a grid variable; the other policies fix
    their grid from the SM count at compile time. Tensor-core fragments take only the aligned
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
    if policy != "stream_k":
        raise StreamKError(
            COND_RUNTIME_GRID,
            f"num_sms='device' with policy={policy!r}{on}",
            "Only policy='stream_k' derives its work split from the run-time grid; pass "
            "num_sms for the other policies.",
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

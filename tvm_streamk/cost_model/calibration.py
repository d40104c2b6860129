"""Fit the cost model's constants to measured run times (GPU measurements, the GPU pack's)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..decomposition import Plan
from .model import (
    DEFAULT_COST,
    FEATURES,
    CostModelError,
    CostParams,
    critical_features,
    predicted_time,
)


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
        The fix-up the measured kernels used (:mod:`tvm_streamk.fixup_registry`).

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
    if len(rows) < len(FEATURES):
        raise CostModelError(
            f"calibrate needs at least {len(FEATURES)} measurements, found {len(rows)}; "
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
        if np.linalg.matrix_rank(weighted) < len(FEATURES):
            absent = [n for n, col in zip(FEATURES, feats.T, strict=True) if not col.any()]
            found = f"no measurement exercises {absent}" if absent else "collinear features"
            raise CostModelError(
                f"the measurements cannot separate {FEATURES}: {found}; add plans of other "
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

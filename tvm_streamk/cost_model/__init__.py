"""The analytical cost model of a work decomposition, its calibration, and the heuristic.

- :mod:`.model`: what a plan costs on a GPU, in per-SM terms (:func:`predicted_time`);
- :mod:`.calibration`: the model's constants fitted to measured run times (:func:`calibrate`);
- :mod:`.heuristic`: the decomposition with the smallest predicted time (:func:`choose`),
  registered as the ``"heuristic"`` chooser of the decomposition's policies.

docs/heuristic.md describes the model, its constants and the policy it picks across shapes.
"""

from .calibration import calibrate
from .heuristic import candidates, choose
from .model import (
    DEFAULT_COST,
    CostModelError,
    CostParams,
    critical_features,
    predicted_time,
    saturation,
)

__all__ = [
    "DEFAULT_COST",
    "CostModelError",
    "CostParams",
    "calibrate",
    "candidates",
    "choose",
    "critical_features",
    "predicted_time",
    "saturation",
]

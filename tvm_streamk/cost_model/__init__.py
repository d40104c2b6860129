"""The analytical cost model of a work decomposition, its calibration, and the heuristic.

- :mod:`.model`: what a plan costs on a GPU, in per-SM terms (:func:`predicted_time`);
- :mod:`.calibration`: the model's constants fitted to measured run times (:func:`calibrate`);
- :mod:`.heuristic`: the decomposition with the smallest predicted time (:func:`choose`),
  registered as the ``"heuristic"`` chooser of the decomposition's policies;
- :mod:`.gpu_specs`: the published specifications of the GPUs it prices kernels on;
- :mod:`.physical`: a kernel's costs in microseconds on one of them (:func:`price`), and the
  roofline no prediction goes below;
- :mod:`.traits`: what a kernel's analysed site tells the model (:func:`traits_of`), and the
  constants a decision uses for a target (:func:`cost_for`).

docs/heuristic.md describes the model, its constants and the policy it picks across shapes.
"""

from .calibration import calibrate
from .gpu_specs import GPU_SPECS, GPUSpec, spec_for
from .heuristic import candidates, choose
from .model import (
    DEFAULT_COST,
    CostModelError,
    CostParams,
    critical_features,
    predicted_time,
    priced,
    saturation,
)
from .physical import KernelTraits, Price, UnpricedError, price, roofline_us
from .traits import cost_for, costing, not_a_gpu, traits_of, why_unpriced

__all__ = [
    "DEFAULT_COST",
    "GPU_SPECS",
    "CostModelError",
    "CostParams",
    "GPUSpec",
    "KernelTraits",
    "Price",
    "UnpricedError",
    "calibrate",
    "candidates",
    "choose",
    "cost_for",
    "costing",
    "critical_features",
    "not_a_gpu",
    "priced",
    "predicted_time",
    "price",
    "roofline_us",
    "saturation",
    "spec_for",
    "traits_of",
    "why_unpriced",
]

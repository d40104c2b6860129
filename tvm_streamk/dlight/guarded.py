"""One of dlight's own GPU rules, tried under a guard in the Relax pipeline.

TVM 0.27's ``gpu.GEMV`` stops with a bare ``AssertionError`` (or an ``AttributeError`` on a
symbolic extent) on a batched matmul of one output column with a fused epilogue
(``(2, 11, 16) @ (2, 16, 1)``, bias, fp16 cast: found by the model fuzz), and stock
``tvm.compile`` with it. Under :class:`Guarded` such a failure declines the kernel instead, with
a warning that names it, and the pipeline's next rule schedules it (dlight's ``Fallback`` at the
latest). The project's own rules are not guarded: their errors are the project's to report.
"""

from __future__ import annotations

import warnings

from tvm import tirx

from .._compat import dlight
from .decisions import kernel_key


class Guarded(dlight.gpu.base.GPUScheduleRule):
    """``rule``, declining (``None``) the kernels it fails on."""

    def __init__(self, rule: dlight.gpu.base.GPUScheduleRule):
        super().__init__()
        self.rule = rule

    def is_target_available(self, target) -> bool:
        return self.rule.is_target_available(target)

    def apply(self, func: tirx.PrimFunc, target, tunable: bool):
        try:
            return self.rule.apply(func, target, tunable)
        except Exception as err:  # noqa: BLE001 - TVM's rule, any failure: the next rule's turn
            name, why = type(self.rule).__name__, type(err).__name__
            why = f"{why}: {err}" if str(err) else why
            warnings.warn(
                f"tvm_streamk.relax_pipeline: dlight's {name} rule stopped on "
                f"{kernel_key(func)} ({why}); the next rule schedules it (stock TVM stops "
                "here)",
                RuntimeWarning,
                stacklevel=2,
            )
            return None

"""Stream-K work decomposition for Apache TVM TensorIR GPU kernels.

Importing the package registers the ``tvm_streamk`` TIR pipeline and adds ``stream_k`` as a
method of ``tvm.s_tir.Schedule``. The other subpackages load on first access
(``tvm_streamk.pocl``, ``tvm_streamk.workloads``, ...), so ``import tvm_streamk as sk`` is enough.
"""

import importlib

from . import dlight, gpus, meta_schedule, postproc
from .decomposition import Plan, plan
from .errors import StreamKError
from .explain import explain
from .meta_schedule import compile_tuned, tune
from .model_report import ModelReport, model_report
from .pipeline import lower
from .relax_pipeline import relax_pipeline
from .schedule import stream_k

# Loaded on first attribute access: the CPU backend opens OpenCL, the rest is rarely needed.
_LAZY = (
    "analysis",
    "cost_model",
    "decision",
    "decomposition",
    "device",
    "fixup_registry",
    "gpus",
    "memory_model",
    "moe",
    "pipeline",
    "pocl",
    "transform",
    "workloads",
)


# The OpenCL builds' SM count is the compute units of the CPU executor (loaded when asked).
gpus.register_compute_units(
    "opencl", lambda: importlib.import_module(f"{__name__}.pocl").compute_units()
)


def __getattr__(name: str):
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Plan",
    "StreamKError",
    "compile_tuned",
    "dlight",
    "explain",
    "lower",
    "meta_schedule",
    "plan",
    "postproc",
    "model_report",
    "ModelReport",
    "relax_pipeline",
    "stream_k",
    "tune",
]

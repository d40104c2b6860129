"""Stream-K work decomposition for Apache TVM TensorIR GPU kernels.

Importing the package registers the ``tvm_streamk`` TIR pipeline and adds ``stream_k`` as a
method of ``tvm.s_tir.Schedule``.
"""

from . import dlight, meta_schedule, postproc
from .decomposition import Plan, plan
from .errors import StreamKError
from .explain import explain
from .meta_schedule import compile_tuned, tune
from .pipeline import lower
from .relax_pipeline import relax_pipeline
from .schedule import stream_k

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
    "relax_pipeline",
    "stream_k",
    "tune",
]

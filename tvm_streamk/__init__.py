"""Stream-K work decomposition for Apache TVM TensorIR GPU kernels.

Importing the package registers the ``tvm_streamk`` TIR pipeline and adds ``stream_k`` as a
method of ``tvm.s_tir.Schedule``.
"""

from . import meta_schedule, postproc
from .decomposition import Plan, plan
from .errors import StreamKError
from .explain import explain
from .meta_schedule import compile_tuned, tune
from .pipeline import lower
from .schedule import stream_k

__all__ = [
    "Plan",
    "StreamKError",
    "compile_tuned",
    "explain",
    "lower",
    "meta_schedule",
    "plan",
    "postproc",
    "stream_k",
    "tune",
]

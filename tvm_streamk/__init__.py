"""Stream-K work decomposition for Apache TVM TensorIR GPU kernels.

Importing the package registers the ``tvm_streamk`` TIR pipeline and adds ``stream_k`` as a
method of ``tvm.s_tir.Schedule``.
"""

from .decomposition import Plan, plan
from .errors import StreamKError
from .pipeline import lower
from .schedule import stream_k

__all__ = ["Plan", "StreamKError", "lower", "plan", "stream_k"]

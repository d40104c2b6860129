"""dlight integration: schedule rules that add Stream-K to dlight's GPU schedules."""

from .decisions import Decisions
from .stream_k_depthwise import StreamKDepthwise
from .stream_k_gemv import StreamKGEMV
from .stream_k_implicit_gemm import StreamKImplicitGEMM
from .stream_k_matmul import StreamKMatmul

__all__ = ["Decisions", "StreamKDepthwise", "StreamKGEMV", "StreamKImplicitGEMM", "StreamKMatmul"]

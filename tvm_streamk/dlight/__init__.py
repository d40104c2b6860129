"""dlight integration: schedule rules that add Stream-K to dlight's GPU schedules."""

from .stream_k_matmul import StreamKMatmul

__all__ = ["StreamKMatmul"]

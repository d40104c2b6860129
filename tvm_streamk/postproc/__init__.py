"""MetaSchedule postprocs that finish and check Stream-K candidates."""

from .rechunk_stream_k import RechunkStreamK
from .rewrite_stream_k_init import RewriteStreamKInit
from .verify_stream_k import VerifyStreamK

__all__ = ["RechunkStreamK", "RewriteStreamKInit", "VerifyStreamK"]

"""The lowering passes of the package."""

from .lower_stream_k import LowerStreamK

__all__ = ["LowerStreamK"]

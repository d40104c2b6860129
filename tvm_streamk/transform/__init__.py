"""The lowering passes of the package, and the fix-ups they drive (:mod:`.fixup`).

``LowerStreamK`` loads on first access, so the fix-up registry imports without the lowering.
"""

import importlib

__all__ = ["LowerStreamK"]


def __getattr__(name: str):
    if name == "LowerStreamK":
        return importlib.import_module(f"{__name__}.lower_stream_k").LowerStreamK
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Recently built kernels, so that repeated ``run``/``time`` calls on one schedule build once.

Shared by the execution backends (:mod:`tvm_streamk.pocl`, :mod:`tvm_streamk.webgpu`): a kernel
is found again by its PrimFunc (structural hash, then structural equality), its name, the TIR
pipeline and whatever else the backend keys it by (the PoCL executor it was built for).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from .._compat import structural_equal, structural_hash
from .lowering import select_primfunc


class KernelCache:
    """The last ``size`` kernels ``build(func, pipeline, func_name=name)`` made."""

    def __init__(self, build: Callable, key: Callable[[], tuple] = tuple, size: int = 16):
        self._build, self._key, self._size = build, key, size
        self._entries: collections.OrderedDict = collections.OrderedDict()

    def get(self, mod, pipeline: str, func_name: str | None):
        name, func = select_primfunc(mod, func_name)
        key = (structural_hash(func), name, pipeline, *self._key())
        for cached_func, kernel in self._entries.get(key, ()):
            if structural_equal(cached_func, func):
                self._entries.move_to_end(key)
                return kernel
        kernel = self._build(func, pipeline, func_name=name)
        self._entries.setdefault(key, []).append((func, kernel))
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return kernel

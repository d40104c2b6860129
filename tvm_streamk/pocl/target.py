"""The OpenCL target PoCL runs: the one spelling lowering, tuning and device discovery use."""

from __future__ import annotations

import tvm

from .._compat import target as as_target


def opencl_target(**attrs) -> tvm.target.Target:
    """The OpenCL target whose kernels PoCL compiles and runs.

    TVM's OpenCL target already carries the limits MetaSchedule's GPU rules read
    (``max_threads_per_block`` 256, ``max_shared_memory_per_block`` 16 KiB, ``thread_warp_size``
    1); ``attrs`` overrides them or adds any other target key, such as ``host``.

    Examples
    --------
    >>> opencl_target().kind.name
    'opencl'
    >>> opencl_target(host="llvm").host.kind.name
    'llvm'
    """
    return as_target({"kind": "opencl", **attrs})

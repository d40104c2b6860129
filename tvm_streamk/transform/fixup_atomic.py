"""The atomic fix-up: partial tiles are merged by atomic adds into a pre-zeroed output."""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import SBlock
from ..analysis import COND_ATOMIC
from ..errors import StreamKError
from ._ir import replace_block

# Minimum CUDA compute capability of a native atomicAdd per dtype.
CUDA_ATOMIC_MIN_ARCH = {"int32": 0, "float32": 0, "float64": 60, "float16": 70, "bfloat16": 80}
OPENCL_ATOMIC_DTYPES = ("int32", "float32")


def _cuda_arch(target: tvm.target.Target) -> int | None:
    arch = str(target.attrs.get("arch", "")) if target.attrs is not None else ""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    return int(digits[:2] if len(digits) >= 2 else digits) if digits else None


def check_dtype(dtype: str, target: tvm.target.Target) -> None:
    """Refuse an accumulator dtype the target has no atomic add for."""
    kind = target.kind.name
    if kind == "cuda":
        need = CUDA_ATOMIC_MIN_ARCH.get(dtype)
        arch = _cuda_arch(target)
        if need is None or (need and arch is not None and arch < need):
            raise StreamKError(
                COND_ATOMIC,
                f"a {dtype} accumulator on CUDA arch {target.attrs.get('arch')}"
                + ("" if need is None else f" (atomicAdd for {dtype} needs sm_{need} or newer)"),
                "Use the workspace fix-up (fixup='workspace'), or accumulate in float32.",
            )
    elif kind == "opencl":
        if dtype not in OPENCL_ATOMIC_DTYPES:
            raise StreamKError(
                COND_ATOMIC,
                f"a {dtype} accumulator on OpenCL, which adds atomically only "
                f"{list(OPENCL_ATOMIC_DTYPES)}",
                "Use the workspace fix-up (fixup='workspace'), or accumulate in float32.",
            )
    else:
        raise StreamKError(
            COND_ATOMIC,
            f"target kind {kind!r}",
            "The atomic fix-up is emitted for CUDA and OpenCL targets only.",
        )


def atomic_add(target: tvm.target.Target, dtype: str, address, value) -> tirx.Expr:
    """The target's atomic ``*address += value`` as a TIR call."""
    if target.kind.name == "cuda":
        return tirx.call_extern(dtype, "atomicAdd", address, value)
    # TVM's OpenCL codegen turns a float ``atomic_add`` into a compare-and-swap helper of its own;
    # int32 maps to the native builtin.
    return tirx.call_extern(dtype, "atomic_add", address, value)


def merge_store(block: SBlock, full, target: tvm.target.Target) -> SBlock:
    """Turn the write-back ``out[i] = acc[i]`` into ``store if full else atomic add``."""
    store: tirx.BufferStore = block.body
    dtype = str(store.buffer.dtype)
    address = tirx.address_of(tirx.BufferLoad(store.buffer, store.indices))
    merge = tirx.Evaluate(atomic_add(target, dtype, address, store.value))
    return replace_block(block, body=tirx.IfThenElse(full, store, merge))

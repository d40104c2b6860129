"""CUDA's memory model for the fix-ups (the protocol of CUTLASS's ``barrier.h``).

``__threadfence`` is a device-scope ``fence.sc``, and PTX fences are cumulative: the stores
other threads made before ``__syncthreads`` are ordered by the leader's fence after it, as are
the reads they make after a second barrier by the leader's fence before it; so only a block's
leader fences. Values another block handed off are read with ``__ldcg``, which bypasses the
non-coherent L1 that could hold a stale line from an earlier call.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import target_arch
from .base import MemoryModel, register

# Minimum compute capability of a native atomicAdd per dtype.
ATOMIC_MIN_ARCH = {"int32": 0, "float32": 0, "float64": 60, "float16": 70, "bfloat16": 80}


def arch_number(target: tvm.target.Target) -> int | None:
    """``90`` for ``sm_90a``, or None without an arch."""
    arch = target_arch(target) or ""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    return int(digits[:2] if len(digits) >= 2 else digits) if digits else None


@register
class CudaMemoryModel(MemoryModel):
    kind = "cuda"
    cumulative_fences = True

    def fence(self) -> tirx.Stmt:
        return tirx.Evaluate(tirx.call_extern("int32", "__threadfence"))

    def atomic_add_error(self, dtype: str) -> str | None:
        need = ATOMIC_MIN_ARCH.get(dtype)
        if need is None:
            return f"a {dtype} accumulator on CUDA, which has no atomicAdd for {dtype}"
        arch = arch_number(self.target)
        if need and arch is not None and arch < need:
            return (
                f"a {dtype} accumulator on CUDA arch {self.target.attrs.get('arch')} "
                f"(atomicAdd for {dtype} needs sm_{need} or newer)"
            )
        return None

    def atomic_add(self, dtype: str, address, value) -> tirx.Expr:
        return tirx.call_extern(dtype, "atomicAdd", address, value)

    def handed_off(self, load, dtype: str) -> tirx.Expr:
        return tirx.call_extern(dtype, "__ldcg", tirx.address_of(load))

    def load_partial(self, load, dtype: str, across_kernels: bool = False) -> tirx.Expr:
        return load if across_kernels else self.handed_off(load, dtype)

    def lanes_in_one_access(self, lanes: int, dtype: str) -> bool:
        # One 32- or 64-bit __ldcg: TVM 0.27's CUDA codegen splits an extern call returning a
        # vector into one call per lane, all on one address, so no wider word can be read.
        return lanes * tvm.DataType(dtype).bits // 8 in (4, 8)

    def read_lanes(self, workspace, slot, group, lanes: int, dtype: str, across_kernels=False):
        # The slots as words of a thread's lanes, read through L2 and reinterpreted.
        view = tirx.decl_buffer(
            (workspace.shape[0], int(workspace.shape[1]) // lanes),
            f"int{lanes * tvm.DataType(dtype).bits}",
            name="sk_workspace_words",
            data=workspace.data,
        )
        word = tirx.BufferLoad(view, [slot, group])
        if not across_kernels:
            word = self.handed_off(word, view.dtype)
        return [tirx.DeclBuffer(view, data=workspace.data)], tirx.reinterpret(
            f"{dtype}x{lanes}", word
        )

"""OpenCL 1.2's memory model for the fix-ups.

OpenCL 1.2 has no device-scope release/acquire: ``mem_fence`` orders only the calling
work-item's own accesses, and atomics are the only synchronisation between work-groups it
defines. So every work-item fences its own accesses (not a leader for the block), the arrival
counter is an atomic, and 32-bit partials (float32, int32 accumulators) are kept as int32 bit
patterns (``as_int``) read back by ``atomic_or(p, 0)``: an atomic read is served by the memory
every work-group shares, never by a stale cache line. The partial stores stay plain stores
followed by ``mem_fence`` and the barrier before the arrival: atomic stores would give
Oclgrind's uninitialised-value checker false reports (it treats an atomic exchange on
never-written memory as a use of its old value) and cost every device an atomic per element.
Other accumulator dtypes (float16, float64) are read with plain loads. An OpenCL C 2.0
``atomic_work_item_fence(..., memory_scope_device)`` would make the store side a guarantee
too; it needs OpenCL C 2.0 and is not emitted.

Divisions by a grid read at run time truncate: ``LowerIntrin`` lowers a floor division by a
value it cannot sign into a ``Select`` over let-bound temporaries, and TVM 0.27's OpenCL printer
writes those temporaries inside a ``vstore`` address, which does not compile.
"""

from __future__ import annotations

from tvm import tirx

from .base import MemoryModel, register

ATOMIC_DTYPES = ("int32", "float32")
# Accumulator dtypes whose partials travel as int32 bit patterns through 32-bit atomics.
ATOMIC_SLOT_DTYPES = ("float32", "int32")
# CLK_GLOBAL_MEM_FENCE in every OpenCL C header.
CLK_GLOBAL_MEM_FENCE = 2


@register
class OpenCLMemoryModel(MemoryModel):
    kind = "opencl"
    truncating_divisions = True
    staged_partial_reads = True

    def fence(self) -> tirx.Stmt:
        flag = tirx.IntImm("uint32", CLK_GLOBAL_MEM_FENCE)
        return tirx.Evaluate(tirx.call_extern("int32", "mem_fence", flag))

    def atomic_add_error(self, dtype: str) -> str | None:
        if dtype in ATOMIC_DTYPES:
            return None
        return f"a {dtype} accumulator on OpenCL, which adds atomically only {list(ATOMIC_DTYPES)}"

    def atomic_add(self, dtype: str, address, value) -> tirx.Expr:
        # TVM's OpenCL codegen turns a float ``atomic_add`` into a compare-and-swap helper of
        # its own; int32 maps to the native builtin.
        return tirx.call_extern(dtype, "atomic_add", address, value)

    def handed_off(self, load, dtype: str) -> tirx.Expr:
        if dtype != "int32":
            raise ValueError(f"OpenCL hands off 32-bit integers only, found {dtype}")
        return tirx.call_extern(
            "int32", "atomic_or", tirx.address_of(load), tirx.IntImm("int32", 0)
        )

    def partial_dtype(self, dtype: str) -> str:
        return "int32" if dtype in ATOMIC_SLOT_DTYPES else dtype

    def store_partial(self, value, dtype: str) -> tirx.Expr:
        if dtype in ATOMIC_SLOT_DTYPES and dtype != "int32":
            return tirx.call_pure_extern("int32", "as_int", value)
        return value

    def load_partial(self, load, dtype: str, across_kernels: bool = False) -> tirx.Expr:
        if dtype not in ATOMIC_SLOT_DTYPES:
            return load
        bits = load if across_kernels else self.handed_off(load, "int32")
        return bits if dtype == "int32" else tirx.call_pure_extern(dtype, "as_float", bits)

    def lanes_in_one_access(self, lanes: int, dtype: str) -> bool:
        # Partials read through one 32-bit atomic per element keep the scalar layout.
        return dtype not in ATOMIC_SLOT_DTYPES

    def read_lanes(self, workspace, slot, group, lanes: int, dtype: str, across_kernels=False):
        return [], tirx.BufferLoad(workspace, [slot, tirx.Ramp(group * lanes, 1, lanes)])

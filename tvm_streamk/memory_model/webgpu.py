"""WebGPU's (WGSL's) memory model for the fix-ups: what it does not give.

WGSL has no 64-bit integers, atomics on ``atomic<i32>``/``atomic<u32>`` only (no float atomic
add), relaxed atomics only, and barriers (``storageBarrier``, ``workgroupBarrier``) that order
memory within one workgroup. So a value one workgroup stores and another reads inside the same
dispatch has no ordering guarantee at all, whatever the counter: the workspace fix-up's
hand-off (partials stored, a counter incremented, the last arriver reading) cannot be argued
from the WGSL memory model, and is refused (:attr:`orders_handoffs`). The atomic fix-up has no
instruction to use (TVM 0.27's WGSL code generator emits no atomics), and is refused
(:meth:`atomic_add_error`). The separate fix-up needs neither: its partials cross a dispatch
boundary, which orders storage accesses (:mod:`tvm_streamk.transform.fixup_separate`).
Closed forms must stay 32-bit (:attr:`index_bits`), and ``blockIdx.z`` is the runtime's
(:attr:`grid_z`: TVM's WGSL code generator refuses it, keeping it for wide grids). WebGPU
reports no compute-unit count: no grid is read from the device (:attr:`device_sms`).
"""

from __future__ import annotations

from tvm import tirx

from .base import MemoryModel, register

NO_HANDOFF = "WGSL orders no store of one workgroup before another's read in one dispatch"


@register
class WebGPUMemoryModel(MemoryModel):
    kind = "webgpu"
    orders_handoffs = False
    index_bits = 32
    grid_z = False
    device_sms = False

    def fence(self) -> tirx.Stmt:
        raise ValueError("WGSL has no device-scope fence (storageBarrier orders one workgroup)")

    def atomic_add_error(self, dtype: str) -> str | None:
        return (
            f"a {dtype} accumulator on WebGPU: WGSL adds atomically only atomic<i32>/atomic<u32> "
            "(no float atomics) and TVM's WGSL code generator emits no atomics"
        )

    def atomic_add(self, dtype: str, address, value) -> tirx.Expr:
        raise ValueError(self.atomic_add_error(dtype))

    def handed_off(self, load, dtype: str) -> tirx.Expr:
        raise ValueError(NO_HANDOFF)

    def load_partial(self, load, dtype: str, across_kernels: bool = False) -> tirx.Expr:
        if not across_kernels:
            raise ValueError(NO_HANDOFF)
        return load

    def read_lanes(self, workspace, slot, group, lanes: int, dtype: str, across_kernels=False):
        return [], tirx.BufferLoad(workspace, [slot, tirx.Ramp(group * lanes, 1, lanes)])

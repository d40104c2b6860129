"""``num_sms="device"``: the persistent grid sized from the GPU's multiprocessor count at run time.

``LowerStreamK`` binds the grid to an expression of a placeholder call; the placeholder cannot
be resolved before ``MakePackedAPI`` has defined the call's device, so ``ResolveDeviceSMs`` runs
after TVM's pipeline and turns it, in the host function, into
``runtime.GetDeviceAttr(device_type, device_id, kMultiProcessorCount)``. The kernels take the
grid as a scalar argument and derive their work split from it, so one build fits any GPU.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import structural_map, structural_walk

PLACEHOLDER = "tvm_streamk_device_sms"
# runtime::DeviceAttrKind::kMultiProcessorCount
MULTIPROCESSOR_COUNT = 7


def placeholder() -> tirx.Expr:
    """The multiprocessor count of the device the function runs on (resolved after lowering)."""
    return tirx.call_extern("int32", PLACEHOLDER)


def _is_placeholder(call) -> bool:
    op = getattr(call, "op", None)
    return (
        op is not None
        and op.name == "tirx.call_extern"
        and isinstance(call.args[0], tvm.ir.StringImm)
        and call.args[0].value == PLACEHOLDER
    )


def _device_attrs(func: tirx.PrimFunc) -> tuple | None:
    """``(device_type, device_id)`` the host function sets with its ``device_*`` attributes."""
    found: dict = {}

    def visit(attr) -> None:
        if attr.attr_key in ("device_type", "device_id"):
            found[attr.attr_key] = attr.value

    structural_walk(func.body, (tirx.AttrStmt, visit))
    if "device_type" in found and "device_id" in found:
        return found["device_type"], found["device_id"]
    return None


def _resolve(func: tirx.PrimFunc, mod, ctx) -> tirx.PrimFunc:
    uses = []
    structural_walk(
        func.body, (tvm.ir.Call, lambda c: uses.append(c) if _is_placeholder(c) else None)
    )
    if not uses:
        return func
    device = _device_attrs(func)
    if device is None:
        # A device function: the grid reaches it as an argument, never the placeholder itself.
        return func
    device_type, device_id = device

    def replace(call):
        if not _is_placeholder(call):
            return call
        return tirx.call_packed(
            "runtime.GetDeviceAttr", device_type, device_id, MULTIPROCESSOR_COUNT
        ).astype("int32")

    return func.with_body(structural_map(func.body, (tvm.ir.Call, replace)))


def ResolveDeviceSMs() -> tvm.transform.Pass:
    """Read the multiprocessor count from the device in host functions (after ``MakePackedAPI``)."""
    return tvm.tirx.transform.prim_func_pass(
        _resolve, opt_level=0, name="tvm_streamk.ResolveDeviceSMs"
    )


def bind_multiprocessors(func: tirx.PrimFunc, count: int) -> tirx.PrimFunc:
    """``func`` with every multiprocessor-count query replaced by ``count`` (for PoCL)."""

    def replace(call):
        op = getattr(call, "op", None)
        if op is None:
            return call
        if _is_placeholder(call):
            return tirx.IntImm("int32", count)
        if (
            op.name == "tirx.tvm_call_packed"
            and isinstance(call.args[0], tvm.ir.StringImm)
            and call.args[0].value == "runtime.GetDeviceAttr"
            and isinstance(call.args[-1], tirx.IntImm)
            and int(call.args[-1].value) == MULTIPROCESSOR_COUNT
        ):
            return tirx.IntImm(str(call.ty), count)
        return call

    return func.with_body(structural_map(func.body, (tvm.ir.Call, replace)))

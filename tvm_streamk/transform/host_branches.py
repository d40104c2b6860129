"""``HostBranches``: the host's choice between kernels, as a branch once the kernels are split.

A lowering that builds two kernels for one call, each for some run-time sizes (the persistent
kernel and the kernel as written,
:meth:`~tvm_streamk.decomposition.policy.Policy.run_time_persistent`), marks each with
:func:`~._ir.host_branch`'s attribute and its host condition. TVM's pipeline runs
``ThreadSync`` over the whole function before it splits host from device code, and
``ThreadSync`` refuses a barrier under any branch, even one around whole kernels; an attribute
it passes through. After the split each attribute is in the host function, around its kernel's
launch, and this pass makes it the branch it stands for: ``if condition: <launch>``.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import structural_map
from ..errors import StreamKError
from ._ir import HOST_BRANCH


def host_branches(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every :data:`~._ir.HOST_BRANCH` attribute made a branch."""

    def branch(stmt: tirx.AttrStmt):
        if stmt.attr_key != HOST_BRANCH:
            return stmt
        return tirx.IfThenElse(stmt.value, stmt.body, None)

    return func.with_body(structural_map(func.body, (tirx.AttrStmt, branch)))


@tvm.transform.module_pass(opt_level=0, name="tvm_streamk.HostBranches")
def HostBranches(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass
    """The module pass of :func:`host_branches` (module docstring); a device function that still
    holds such an attribute (a kernel inside the other's launch) is refused."""
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, tirx.PrimFunc):
            continue
        branched = host_branches(func)
        if branched.body.same_as(func.body):
            continue
        if (
            func.attrs is not None
            and "calling_conv" in func.attrs
            and int(func.attrs["calling_conv"]) == 2
        ):  # CallingConv.kDeviceKernelLaunch
            raise StreamKError(
                "host-branch",
                f"a host branch inside the device kernel {gv.name_hint}",
                "Report this: the kernels of one call must be launched side by side.",
            )
        mod[gv] = branched
    return mod

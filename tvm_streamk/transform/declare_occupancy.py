"""``DeclareOccupancy``: a persistent kernel tells ptxas the resident blocks its grid counts on.

The persistent grid is ``num_sms x blocks_per_sm`` (:mod:`tvm_streamk.occupancy`): every block
is meant to be resident at once, each walking its equal share. Left to itself, ptxas picks the
kernel's registers by its own heuristic, which the grid does not know: the ragged-K walk took
64-72 registers on sm_80 where the data-parallel kernel took 46, 4 blocks of 256 threads per
SM where data-parallel holds 5, so the grid shrank by a fifth.

``__launch_bounds__(threads, blocks)`` turns the count into a bound ptxas must meet: it caps
the registers at what ``blocks`` resident blocks of ``threads`` leave each thread. The walk
above then takes 44 and 48 registers, no spills, and keeps the 5 blocks. ptxas meets the bound
by spilling where it must, and not monotonically: the Stream-K workspace kernel of a strided
NWC Conv1d (dlight's schedule, 128 threads) on sm_90 took 64 registers and 8 bytes of spills
undeclared, 96 and none declaring 1, 2 or 4 blocks, 80 and 8 bytes declaring 6, 72 and none
declaring 7, 64 and 16 bytes declaring 8. So the decision declares only where the kernel
built so was read clean: ``Decision.declares_occupancy``, chosen by
:func:`tvm_streamk.schedule.stream_k` when it sizes the grid from the data-parallel kernel's
occupancy; an explicit ``blocks_per_sm`` is not declared.

``LowerStreamK`` records the count on the function (:data:`ATTR`); after TVM has split host and
device code, this pass copies it to the CUDA kernels the function launches, as TVM's own
``tirx.launch_bounds_min_blocks_per_sm``, which its CUDA code generator prints. One block per
SM is not declared: a launch always holds one, so the bound would only move ptxas off its
default.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ._ir import launched_by, map_prim_funcs

# On the function LowerStreamK rewrote: the resident blocks per SM its persistent grid counts on.
ATTR = "tvm_streamk.resident_blocks_per_sm"
# TVM's PrimFunc attribute for the second argument of __launch_bounds__ (codegen_cuda.cc).
MIN_BLOCKS_ATTR = "tirx.launch_bounds_min_blocks_per_sm"


def record(func: tirx.PrimFunc, blocks_per_sm: int) -> tirx.PrimFunc:
    """``func`` marked as holding a persistent grid of ``blocks_per_sm`` resident blocks per SM
    (the fewest, where several decisions of one function record different counts)."""
    if func.attrs is not None and ATTR in func.attrs:
        blocks_per_sm = min(blocks_per_sm, int(func.attrs[ATTR]))
    return func.with_attr(ATTR, int(blocks_per_sm))


def _is_cuda(func: tirx.PrimFunc) -> bool:
    target = func.attrs.get("target") if func.attrs is not None else None
    return target is not None and target.kind.name == "cuda"


def declare(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every CUDA kernel launched by a marked function declaring its count."""
    declared: dict[str, int] = {}
    for name, counts in launched_by(mod, ATTR).items():
        blocks = [int(c) for c in counts if int(c) >= 2]
        if blocks:
            declared[name] = min(blocks)
    if not declared:
        return mod

    def declared_on(name: str, func: tirx.PrimFunc) -> tirx.PrimFunc:
        if name not in declared or not _is_cuda(func):
            return func
        return func.with_attr(MIN_BLOCKS_ATTR, declared[name])

    return map_prim_funcs(mod.clone(), declared_on)


def DeclareOccupancy() -> tvm.transform.Pass:
    """Declare each persistent kernel's resident blocks per SM (after TVM's pipeline)."""
    return tvm.transform.module_pass(
        lambda mod, _ctx: declare(mod), opt_level=0, name="tvm_streamk.DeclareOccupancy"
    )

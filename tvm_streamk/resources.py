"""A CUDA build's per-kernel threads, registers and shared memory, and its resident blocks per SM.

Threads and dynamic shared memory come from the lowered device functions (their
``thread_extent`` attributes and ``shared.dyn`` allocation), registers, spills and static shared
memory from ptxas (:mod:`tvm_streamk.ptxas`, which needs ``nvcc``), the limits from
:mod:`tvm_streamk.occupancy`. No GPU is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from . import occupancy, ptxas, register_estimate
from ._compat import (
    codegen_source,
    get_tir_pipeline,
    split_host_device_mods,
    structural_walk,
    target_arch,
)

__all__ = ["KernelUse", "estimated_uses", "ir_uses", "kernel_uses", "resident_blocks"]


@dataclass(frozen=True)
class KernelUse:
    """What one kernel of a build asks of an SM.

    Attributes
    ----------
    threads : int
        Threads per block.
    registers : int
        Registers per thread (ptxas).
    shared : int
        Shared memory per block in bytes: ptxas's static count plus the dynamic allocation.
    spills : int
        Bytes of spill stores and loads (ptxas).
    stack : int
        Bytes of stack frame (ptxas).
    """

    threads: int
    registers: int
    shared: int
    spills: int
    stack: int = 0

    def occupancy(self, arch: str) -> occupancy.Occupancy:
        return occupancy.resident_blocks(arch, self.threads, self.registers, self.shared)


def _arch(target: tvm.target.Target) -> str:
    arch = target_arch(target)
    if target.kind.name != "cuda" or arch is None:
        raise ValueError(f"a CUDA target with an arch is needed, found {target}")
    return arch


def _dynamic_shared(func: tirx.PrimFunc) -> int:
    return _shared(func, "shared.dyn")


def _static_shared(func: tirx.PrimFunc) -> int:
    return _shared(func, "shared")


def _shared(func: tirx.PrimFunc, scope: str) -> int:
    found = [0]

    def on_alloc(node) -> None:
        if node.buffer.scope() == scope:
            found[0] += register_estimate.buffer_bytes(node.buffer)

    structural_walk(func.body, (tirx.AllocBuffer, on_alloc))
    return found[0]


def _lowered(mod: tvm.IRModule, target: tvm.target.Target, pipeline: str):
    """``(kernels, device_mods, finalize_device)``: the device functions of ``mod`` built
    through ``pipeline`` by name, and what code generation needs of them."""
    # A function fresh from dlight has no symbol yet; without one TVM builds no entry for it.
    mod = tvm.IRModule(
        {
            gv: f.with_attr("global_symbol", gv.name_hint)
            if isinstance(f, tirx.PrimFunc) and "global_symbol" not in (f.attrs or {})
            else f
            for gv, f in mod.functions.items()
        }
    )
    pipeline_pass, _, finalize_device = get_tir_pipeline(pipeline)
    lowered = pipeline_pass(tirx.transform.BindTarget(target.with_host("llvm"))(mod))
    _, device_mods = split_host_device_mods(lowered)
    kernels: dict[str, tirx.PrimFunc] = {}
    for device_mod in device_mods.values():
        for gv, func in device_mod.functions.items():
            kernels[str(func.attrs.get("global_symbol", gv.name_hint))] = func
    return kernels, device_mods, finalize_device


def kernel_uses(
    mod: tvm.IRModule, target: tvm.target.Target, pipeline: str = "default"
) -> dict[str, KernelUse]:
    """Per kernel of ``mod`` built for the CUDA ``target`` through the TIR ``pipeline``.

    Raises
    ------
    tvm_streamk.ptxas.PtxasError
        When nvcc is missing, or ptxas refuses a kernel.
    """
    arch = _arch(target)
    # The pipeline runs once: its device functions give threads and dynamic shared memory, and
    # their CUDA source (as tvm.tirx.build generates it) ptxas's registers.
    kernels, device_mods, finalize_device = _lowered(mod, target, pipeline)
    report: dict[str, ptxas.KernelResources] = {}
    for device_target, device_mod in device_mods.items():
        source = codegen_source(finalize_device()(device_mod), device_target)
        report.update(ptxas.resources(source, arch))
    uses = {}
    for name, func in kernels.items():
        found = report[name]
        uses[name] = KernelUse(
            threads=register_estimate.block_threads(func),
            registers=found.registers,
            shared=found.shared + _dynamic_shared(func),
            spills=found.spills,
            stack=found.stack,
        )
    return uses


def ir_uses(
    mod: tvm.IRModule, target: tvm.target.Target, registers: int, pipeline: str = "tvm_streamk"
) -> dict[str, KernelUse]:
    """Per kernel of ``mod``, what it asks of an SM with ``registers`` per thread: no nvcc.

    Threads and shared memory (static and dynamic) come from the lowered device functions;
    the registers are the caller's bound on what the kernel takes.
    """
    _arch(target)
    kernels, _, _ = _lowered(mod, target, pipeline)
    return {
        name: KernelUse(
            threads=register_estimate.block_threads(func),
            registers=registers,
            shared=_static_shared(func) + _dynamic_shared(func),
            spills=0,
        )
        for name, func in kernels.items()
    }


def estimated_uses(
    mod: tvm.IRModule, target: tvm.target.Target, group_walk: bool = False
) -> dict[str, KernelUse]:
    """Per function of the scheduled ``mod``, what its kernel asks of an SM, from its IR alone:
    threads and shared memory after buffer compaction and software pipelining, registers by
    :func:`tvm_streamk.register_estimate.estimate` (an upper bound; no nvcc, a few
    milliseconds a kernel), and :data:`~tvm_streamk.register_estimate.GROUP_WALK` more with
    ``group_walk`` (a kernel over ragged views, whose walk reads a table of its groups)."""
    limits = occupancy.arch_limits(_arch(target))
    extra = register_estimate.GROUP_WALK if group_walk else 0
    uses = _estimated(register_estimate.lowered_prefix(mod), extra)
    if any(use.shared > limits.shared_per_block for use in uses.values()):
        # A buffer sized by a run-time extent: read the symbolic sizes instead (a buffer of
        # symbolic size is left out; only the run time knows it).
        uses = _estimated(register_estimate.lowered_prefix(mod, concrete=False), extra)
    return uses


def _estimated(lowered: tvm.IRModule, extra: int) -> dict[str, KernelUse]:
    uses = {}
    for gv, func in lowered.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        use = register_estimate.ir_use(func)
        registers = min(register_estimate.MAX_REGISTERS, use.registers + extra)
        uses[gv.name_hint] = KernelUse(
            threads=use.threads, registers=registers, shared=use.shared, spills=0
        )
    return uses


def resident_blocks(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    pipeline: str = "default",
    registers: int | None = None,
) -> tuple[str, occupancy.Occupancy]:
    """The kernel of ``mod`` with the fewest resident blocks per SM (the persistent one, in a
    Stream-K build; a prologue kernel holds more) and its :class:`~tvm_streamk.occupancy.Occupancy`.

    With ``registers`` the kernels are held to that many registers per thread
    (:func:`ir_uses`, no nvcc); else ptxas counts them (:func:`kernel_uses`).
    """
    if registers is None:
        uses = kernel_uses(mod, target, pipeline)
    else:
        uses = ir_uses(mod, target, registers, pipeline)
    return fewest_blocks(uses, _arch(target))


def fewest_blocks(uses: dict, arch: str) -> tuple[str, occupancy.Occupancy]:
    """The kernel of ``uses`` (name to :class:`KernelUse`) with the fewest resident blocks per
    SM on ``arch``, the first by name among equals, and its occupancy: the kernel a persistent
    grid is sized by."""
    occupancies = {name: use.occupancy(arch) for name, use in uses.items()}
    name = min(occupancies, key=lambda n: (occupancies[n].blocks, n))
    return name, occupancies[name]

"""Registers per thread of a scheduled CUDA kernel, estimated from its IR: no nvcc.

Sizing a persistent grid needs the resident blocks of the kernel being built, and those
depend on its registers. ptxas counts them exactly (:mod:`tvm_streamk.ptxas`), at 0.2-1.2 s of
nvcc per kernel: six to eight times a model's stock compile. This module reads a bound from
the scheduled data-parallel kernel instead, in about a millisecond: TVM's lowering up to buffer
compaction and software pipelining (:func:`lowered_prefix`) gives each thread's register
buffers and tensor-core fragments, the block's threads and shared memory, and
:func:`estimate` adds the registers to a base for addresses, loop counters and the Stream-K
walk.

The estimate is an **upper bound** by design, for the Stream-K kernel of any decision, not the
data-parallel one: a grid sized for too many resident blocks runs its last blocks in a second
wave, which costs twice the time; one sized for too few loses some latency hiding. The
constants are fitted to ptxas's counts over every schedule source of the ptxas suite (dlight
SIMT and tensor-core, the reference schedule, MetaSchedule, implicit-GEMM convolutions,
contractions; sm_80 and sm_90, nvcc 12/13); ``tests/transform/test_register_estimate.py`` holds
the bound against ptxas for each and reports how many resident blocks it gives up. A user who
wants ptxas's exact count passes ``blocks_per_sm="ptxas"`` to :func:`tvm_streamk.stream_k`.

Terms, in 32-bit registers per thread:

* register buffers (``local``): their elements, 64-bit ones twice;
* tensor-core fragments: half a warp's fragment elements over its 32 threads, as 32-bit words
  (ptxas keeps the operand fragments of one step live, not all of them);
* index arithmetic: one register per :data:`DIVISIONS_PER_REGISTER` integer divisions or
  modulos in the kernel, up to :data:`MAX_DIVISIONS` (an implicit GEMM's gathers keep their
  quotients live: the reference schedule takes 40 registers with 9 of them, the same tiling
  as an implicit-GEMM convolution 80 with 50);
* :data:`BASE` for thread and block indices, pointers, loop counters, staging loads in flight
  and the Stream-K walk's unit range.

Fitted (``tests/transform/test_register_estimate.py``): every kernel of the suite gets at
least the blocks its data-parallel kernel + 8 registers would; the estimate gives up a quarter
of ptxas's resident blocks on average (the reference schedule half: 3 blocks of 256 threads
against 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from ._compat import structural_walk

__all__ = [
    "BASE",
    "DIVISIONS_PER_REGISTER",
    "MAX_DIVISIONS",
    "IRUse",
    "estimate",
    "ir_use",
    "lowered_prefix",
]

BASE = 56
"""Registers of every kernel beyond its buffers: indices, pointers, loop counters, the walk."""
DIVISIONS_PER_REGISTER = 4
MAX_DIVISIONS = 64
MAX_REGISTERS = 255


def _prefix_passes() -> list:
    """TVM's default S-TIR lowering up to the point where buffers have their compacted,
    pipelined sizes and thread bindings are launch attributes (``tvm.s_tir.pipeline``)."""
    t = s_tir.transform
    return [
        t.CanonicalizeLoop(),
        t.LowerCrossThreadReduction(),
        t.LowerInitBlock(),
        t.PlanAndUpdateBufferAllocationLocation(),
        t.ConvertBlocksToOpaque(),
        t.LiftThreadBinding(),
        t.ManifestSharedMemoryLocalStage(),
        t.CompactBufferAllocation(),
        t.LowerAutoCopy(),
        t.UnifyThreadBinding(),
        t.LowerMatchBuffer(),
        t.InjectSoftwarePipeline(),
        t.LowerOpaqueBlock(),
    ]


def lowered_prefix(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` through the first passes of TVM's lowering (about a millisecond a kernel)."""
    return tvm.transform.Sequential(_prefix_passes())(mod)


@dataclass(frozen=True)
class IRUse:
    """What one scheduled kernel asks of an SM, read from its IR.

    Attributes
    ----------
    threads : int
        Threads per block.
    shared : int
        Shared memory per block in bytes (static allocations with fixed sizes).
    local_words, fragment_words : float
        Per thread: register buffers and tensor-core fragments, in 32-bit words.
    divisions : int
        Integer divisions and modulos in the kernel.
    """

    threads: int
    shared: int
    local_words: float
    fragment_words: float
    divisions: int

    @property
    def registers(self) -> int:
        """:func:`estimate` of this kernel."""
        return estimate(self)


def _elements(buf) -> int:
    dims = [int(d) if isinstance(d, tirx.IntImm) else None for d in buf.shape]
    return math.prod(dims) if None not in dims else 0


def ir_use(func: tirx.PrimFunc) -> IRUse:
    """The :class:`IRUse` of one function of :func:`lowered_prefix`'s module."""
    extents: dict[str, int] = {}
    words = {"local": 0.0, "fragment": 0.0}
    shared = [0]
    divisions = [0]

    def on_attr(node) -> None:
        if node.attr_key == "thread_extent" and str(node.node.thread_tag).startswith("threadIdx"):
            if isinstance(node.value, tirx.IntImm):
                extents[str(node.node.thread_tag)] = int(node.value)

    allocs = []

    def on_alloc(node) -> None:
        allocs.append(node.buffer)

    def on_division(_node) -> None:
        divisions[0] += 1

    structural_walk(func.body, (tirx.AttrStmt, on_attr))
    structural_walk(func.body, (tirx.AllocBuffer, on_alloc))
    structural_walk(func.body, (tirx.FloorDiv, on_division))
    structural_walk(func.body, (tirx.FloorMod, on_division))
    threads = math.prod(extents.values()) if extents else 1
    for buf in allocs:
        dtype = tvm.DataType(str(buf.dtype))
        elements = _elements(buf) * dtype.lanes
        scope = buf.scope()
        if scope == "local":
            words["local"] += elements * max(1, dtype.bits // 32)
        elif scope.startswith("wmma.") or scope.startswith("m16n8k8."):
            words["fragment"] += elements * dtype.bits / 32 / 32
        elif scope.startswith("shared"):
            shared[0] += elements * dtype.bits // 8
    return IRUse(
        threads=threads,
        shared=shared[0],
        local_words=words["local"],
        fragment_words=words["fragment"],
        divisions=divisions[0],
    )


def estimate(use: IRUse) -> int:
    """Registers per thread the kernel of ``use`` takes at most, rounded up to ptxas's
    allocation unit of 8, within the 255 a thread may have."""
    total = (
        BASE
        + use.local_words
        + use.fragment_words / 2
        + min(use.divisions, MAX_DIVISIONS) / DIVISIONS_PER_REGISTER
    )
    return min(MAX_REGISTERS, -(-math.ceil(total) // 8) * 8)

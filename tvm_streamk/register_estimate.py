"""Registers per thread of a scheduled CUDA kernel, estimated from its IR: no nvcc.

Sizing a persistent grid needs the resident blocks of the kernel being built, and those
depend on its registers. ptxas counts them exactly (:mod:`tvm_streamk.ptxas`), at 0.2-1.2 s of
nvcc per kernel: six to eight times a model's stock compile. This module reads a bound from
the scheduled data-parallel kernel instead, in a few milliseconds: TVM's lowering up to buffer
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

* :data:`BASE` for thread and block indices, pointers, loop counters and the Stream-K walk's
  unit range;
* register buffers (``local``): their elements, 64-bit ones twice;
* tensor-core fragments: half a warp's fragment elements over its 32 threads, as 32-bit words
  (ptxas keeps the operand fragments of one step live, not all of them);
* the larger of two ways a kernel keeps values in flight: :data:`IN_FLIGHT` when any loop is
  vectorised or unrolled (its loads issue together), and :data:`PER_DIVISION` per distinct
  integer division or modulo by a constant that is not a power of two of a value that changes
  with a loop, up to :data:`MAX_DIVISIONS` (an implicit GEMM's gathers: a magic multiply each,
  quotient and remainder live from step to step). The reference schedule, neither, takes 40
  registers; the implicit-GEMM convolution of the same tiling, 12 such divisions (written 22
  times), 80; dlight's vectorised fp32 matmul 64-72. A division of the thread's indices alone
  is computed once and not counted: the depthwise rule's kernel, 2 such divisions of its 55,
  takes 30-32;
* :data:`GROUP_WALK` for a kernel over ragged views (added by
  :func:`tvm_streamk.resources.estimated_uses`, which the caller tells: the views are known to
  the analysis, a layer above this one).

Fitted (``tests/transform/test_register_estimate.py``): over every schedule source and dlight
site of the ptxas suite, the built Stream-K kernel holds the blocks planned for, and the grid
gives up at most two blocks per SM of ptxas's count for the data-parallel kernel (reference 5
blocks of 256 threads against 6, dlight's fp32 matmul 6 of 128 against 7-8, the convolution
sites 6 against 7-8, MetaSchedule's sample 5 against 5-6; implicit GEMM 3 and tensor-core 1,
as ptxas counts; the grouped GEMM and ragged-K walks 3 against 5).

:func:`block_threads` and :func:`buffer_bytes` read a lowered kernel's threads and buffer
sizes for :mod:`tvm_streamk.resources` too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from ._compat import structural_hash, structural_walk, with_concrete_shapes

__all__ = [
    "BASE",
    "GROUP_WALK",
    "IN_FLIGHT",
    "MAX_DIVISIONS",
    "PER_DIVISION",
    "RUN_TIME_EXTENT",
    "IRUse",
    "block_threads",
    "buffer_bytes",
    "estimate",
    "ir_use",
    "lowered_prefix",
]

BASE = 32
"""Registers of every kernel beyond its buffers: indices, pointers, loop counters, the walk."""
IN_FLIGHT = 32
"""Registers of loads in flight in a kernel with vectorised or unrolled loops."""
PER_DIVISION = 3
"""Registers per distinct integer division or modulo by a constant that is not a power of two,
of a value that changes with a loop. Fitted to the implicit-GEMM convolution: its 12 such
divisions, capped at :data:`MAX_DIVISIONS`, read as the 30 registers that with its buffers and
the base make ptxas's 80 (two per division, before they were counted once each, read 24)."""
MAX_DIVISIONS = 10
MAX_REGISTERS = 255
GROUP_WALK = 24
"""Registers a Stream-K kernel written over ragged views (a grouped GEMM, a ragged K) takes
beyond the estimate of its padded data-parallel kernel: its walk finds each unit's group in a
table of the groups' tiles and keeps the group, its rows and its tile offset live through the K
loop. Measured by ptxas (64x64 tiles, 256 threads, 8 groups, sm_80 and sm_90): the padded
kernel's estimate 48 registers; the grouped workspace walk 64, the ragged-K walk 64-72, where
the estimate alone planned 5 blocks per SM and the built kernels held 3-4."""


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


RUN_TIME_EXTENT = 4096
"""What a symbolic extent of a parameter's shape is taken to be before the prefix runs: a
tiled kernel's buffers have the tile's size whatever it is, and TVM's region analysis is
three times faster on constants (a dynamic-M tensor-core matmul: 7 ms against 23)."""


def lowered_prefix(mod: tvm.IRModule, concrete: bool = True) -> tvm.IRModule:
    """``mod`` through the first passes of TVM's lowering (a few milliseconds a kernel), with
    symbolic extents of parameter shapes taken as :data:`RUN_TIME_EXTENT` when ``concrete``."""
    if concrete:
        mod = tvm.IRModule(
            {
                gv: with_concrete_shapes(f, RUN_TIME_EXTENT) if isinstance(f, tirx.PrimFunc) else f
                for gv, f in mod.functions.items()
            }
        )
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
        Distinct integer divisions and modulos by constants that are not powers of two, of
        values that change with a loop.
    in_flight : bool
        Whether any loop is vectorised or unrolled.
    """

    threads: int
    shared: int
    local_words: float
    fragment_words: float
    divisions: int
    in_flight: bool

    @property
    def registers(self) -> int:
        """:func:`estimate` of this kernel."""
        return estimate(self)


def _elements(buf) -> int:
    """Elements of ``buf`` (vector lanes counted), 0 when its shape is symbolic."""
    dims = [int(d) if isinstance(d, tirx.IntImm) else None for d in buf.shape]
    return math.prod(dims) * tvm.DataType(str(buf.dtype)).lanes if None not in dims else 0


def buffer_bytes(buf) -> int:
    """Bytes of ``buf``, 0 when its shape is symbolic (only the run time knows them)."""
    return _elements(buf) * tvm.DataType(str(buf.dtype)).bits // 8


def block_threads(func: tirx.PrimFunc) -> int:
    """Threads per block of a kernel whose thread bindings are launch attributes."""
    extents: dict[str, int] = {}

    def on_attr(node) -> None:
        if node.attr_key == "thread_extent" and str(node.node.thread_tag).startswith("threadIdx"):
            if isinstance(node.value, tirx.IntImm):
                extents[str(node.node.thread_tag)] = int(node.value)

    structural_walk(func.body, (tirx.AttrStmt, on_attr))
    return math.prod(extents.values()) if extents else 1


def _loop_divisions(divisions: list, loop_vars: list) -> int:
    """The distinct ``divisions`` whose dividend changes with a loop of the kernel (thread
    bindings are launch attributes by then, so every loop is one a thread runs).

    The code generator computes an expression written many times once, and a division of the
    thread's indices alone once per thread: neither keeps values in flight from step to step
    as a gather does (a depthwise kernel writes its 6 distinct divisions 55 times, 2 of them
    by a loop variable)."""

    loops = {loop_var.__chandle__() for loop_var in loop_vars}
    distinct = {structural_hash(d): d for d in divisions}

    def in_loop(division) -> bool:
        found = [False]

        def on_var(var) -> None:
            found[0] = found[0] or var.__chandle__() in loops

        structural_walk(division.a, (tirx.Var, on_var))
        return found[0]

    return sum(1 for d in distinct.values() if in_loop(d))


def ir_use(func: tirx.PrimFunc) -> IRUse:
    """The :class:`IRUse` of one function of :func:`lowered_prefix`'s module."""
    allocs = []
    loop_vars = []
    divisions = []
    in_flight = [False]

    def on_division(node) -> None:
        divisor = node.b
        if isinstance(divisor, tirx.IntImm) and int(divisor.value) & (int(divisor.value) - 1):
            divisions.append(node)

    def on_loop(node) -> None:
        loop_vars.append(node.loop_var)
        if node.kind in (tirx.ForKind.VECTORIZED, tirx.ForKind.UNROLLED):
            in_flight[0] = True

    structural_walk(
        func.body,
        [
            (tirx.AllocBuffer, lambda node: allocs.append(node.buffer)),
            (tirx.FloorDiv, on_division),
            (tirx.FloorMod, on_division),
            (tirx.For, on_loop),
        ],
    )
    local = fragment = 0.0
    shared = 0
    for buf in allocs:
        bits = tvm.DataType(str(buf.dtype)).bits
        scope = buf.scope()
        if scope == "local":
            local += _elements(buf) * max(1, bits // 32)
        elif scope.startswith("wmma.") or scope.startswith("m16n8k8."):
            fragment += _elements(buf) * bits / 32 / 32
        elif scope.startswith("shared"):
            shared += buffer_bytes(buf)
    return IRUse(
        threads=block_threads(func),
        shared=shared,
        local_words=local,
        fragment_words=fragment,
        divisions=_loop_divisions(divisions, loop_vars),
        in_flight=in_flight[0],
    )


def estimate(use: IRUse) -> int:
    """Registers per thread the kernel of ``use`` takes at most, rounded up to ptxas's
    allocation unit of 8, within the 255 a thread may have."""
    in_flight = max(
        IN_FLIGHT if use.in_flight else 0, PER_DIVISION * min(use.divisions, MAX_DIVISIONS)
    )
    total = BASE + use.local_words + use.fragment_words / 2 + in_flight
    return min(MAX_REGISTERS, -(-math.ceil(total) // 8) * 8)

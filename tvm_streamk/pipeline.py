"""The ``tvm_streamk`` TIR pipeline: TVM's default ``s_tir`` pipeline behind ``LowerStreamK``.

``LowerStreamK`` runs first, while the IR still has blocks, ``T.init`` and iteration variables,
then ``LowerRaggedViews`` (a grouped GEMM's view accesses); everything after them (thread syncs,
storage planning, host/device split) is TVM's own, except
``BoundRunTimeAllocations`` (per-block buffers of a dynamic-shape kernel at their compile-time
bound), ``HostBranches`` (the host's choice between two kernels of one call, a branch only once
``ThreadSync`` has run), ``CancelStagingOffsets`` (a run-time walk's staging indices without
the tile offset buffer compaction wrote through a register copy), ``ResolveDeviceSMs``,
which needs the device ``MakePackedAPI`` defines, and ``DeclareOccupancy`` and
``MarkPersistent`` at the end (the resident blocks a decision declares, and which kernels are
persistent, on the kernels its function launches once host and device code are split).
``DropUnusedBinds`` runs first in the device finalization: it drops the walk's bindings a
persistent kernel never reads, which PoCL would keep live across barriers. A kernel kept as
written at a run-time tile count is built as written; where ``BoundRunTimeAllocations`` finds a
buffer TVM left unbounded (or the build fails otherwise), the module is lowered again with the
check made beforehand, which walks that kernel's tiles (``lower_stream_k.rewrite``).

Importing the package also wraps every other registered TIR pipeline (TVM's ``default``,
``s_tir``, ...) with :func:`refuse_unlowered`: a module that still carries a Stream-K decision
would otherwise build the data-parallel kernel without a word.
"""

from __future__ import annotations

import tvm

from ._compat import (
    SBlock,
    get_tir_pipeline,
    register_tir_pipeline,
    registered_tir_pipelines,
    structural_walk,
)
from ._compat import target as as_target
from .analysis.ragged import RAGGED_ATTR
from .errors import StreamKError
from .transform import LowerStreamK
from .transform.bound_allocations import BoundRunTimeAllocations
from .transform.cancel_staging_offsets import CancelStagingOffsets
from .transform.declare_occupancy import DeclareOccupancy
from .transform.device_sms import ResolveDeviceSMs
from .transform.drop_unused_binds import DropUnusedBinds, MarkPersistent
from .transform.host_branches import HostBranches
from .transform.lower_stream_k import annotated_blocks
from .transform.ragged_views import LowerRaggedViews

NAME = "tvm_streamk"
BASE = "s_tir"

# TVM 0.27's StorageRewrite lets a shared-memory buffer reuse the allocation of one of another
# dtype (the fp32 accumulator tile of a WMMA kernel reusing the fp16 operand tile) and rewrites
# ``tvm_access_ptr(float32, C_shared.data, ...)`` to take the winning allocation itself, the
# float16 buffer (StoragePlanRewriter::Mutate_(const CallNode*), tvm_access_ptr branch:
# args[1] = se->alloc_var). LowerIntrin's LowerAccessPtr then refuses it: "tvm_access_ptr element
# type must match the source buffer". With ``tirx.merge_static_smem`` StorageRewrite does not
# reuse; MergeSharedMemoryAllocations plans shared memory alone (the same footprint when every
# shared buffer is shared.dyn, as in MetaSchedule's cuda-tensorcore samples) and addresses each
# buffer through a view of its own dtype.
SAFE_REUSE_CONFIG = "tirx.merge_static_smem"


def needs_safe_reuse(mod: tvm.IRModule) -> bool:
    """Whether a function of ``mod`` allocates shared memory of two dtypes next to a WMMA
    fragment (whose loads and stores take ``tvm_access_ptr``s of the shared buffers)."""
    for func in mod.functions.values():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        shared, fragment = set(), []

        def on_block(block, shared=shared, fragment=fragment):
            for buf in block.alloc_buffers:
                scope = buf.scope()
                if scope in ("shared", "shared.dyn"):
                    shared.add(str(buf.dtype))
                elif scope.startswith("wmma."):
                    fragment.append(scope)

        structural_walk(func.body, (SBlock, on_block), order="pre")
        if fragment and len(shared) > 1:
            return True
    return False


def with_safe_reuse(mod: tvm.IRModule, run):
    """``run(mod)``, with StorageRewrite's reuse off where it would break the build."""
    ctx = tvm.transform.PassContext.current()
    if SAFE_REUSE_CONFIG in ctx.config or not needs_safe_reuse(mod):
        return run(mod)
    with tvm.transform.PassContext(
        opt_level=ctx.opt_level,
        required_pass=list(ctx.required_pass),
        disabled_pass=list(ctx.disabled_pass),
        config={**dict(ctx.config.items()), SAFE_REUSE_CONFIG: True},
    ):
        return run(mod)


COND_PIPELINE = "pipeline"
# TVM's own pipeline factories, before _guard_stock_pipelines wraps them.
_STOCK: dict = {}


def stream_k_pipeline():
    """The pipeline factory: ``(pipeline_pass, finalize_host, finalize_device)``."""
    base, finalize_host, finalize_device = _STOCK.get(BASE, lambda: get_tir_pipeline(BASE))()

    def built(mod: tvm.IRModule, lower_stream_k) -> tvm.IRModule:
        lowered = with_safe_reuse(LowerRaggedViews()(lower_stream_k(mod)), base)
        lowered = CancelStagingOffsets(HostBranches(BoundRunTimeAllocations(lowered)))
        return MarkPersistent(DeclareOccupancy()(ResolveDeviceSMs()(lowered)))

    @tvm.transform.module_pass(opt_level=0, name="tvm_streamk.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        # Kernels kept as written at a run-time tile count are built first as they are, and
        # BoundRunTimeAllocations checks TVM bounded their buffers; only when the build fails
        # is the module lowered again checking each beforehand (bounded_as_written: a second
        # buffer compaction of each: 0.06 s of a transformer block's 0.6 s compile), so
        # that one TVM cannot bound takes the persistent walk (lower_stream_k.rewrite).
        unchecked: list = []
        try:
            return built(mod, LowerStreamK(unchecked=unchecked))
        except Exception:  # noqa: BLE001 - any failure: the checked lowering says what it is
            if not unchecked:
                raise
        return built(mod, LowerStreamK())

    def _finalize_device():
        return tvm.transform.Sequential([DropUnusedBinds, finalize_device()])

    return _pipeline, finalize_host, _finalize_device


def refuse_unlowered(mod: tvm.IRModule, pipeline: str) -> None:
    """Raise if a function of ``mod`` still carries a Stream-K decision.

    A pipeline without ``LowerStreamK`` would ignore the decision and build the data-parallel
    kernel, silently.
    """
    for gvar, func in mod.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        if func.attrs is not None and RAGGED_ATTR in func.attrs:
            raise StreamKError(
                COND_PIPELINE,
                f"{gvar.name_hint!r} is a grouped GEMM written over ragged views, and the "
                f"{pipeline!r} TIR pipeline does not lower them",
                f"Build with tir_pipeline={NAME!r} (tvm.compile, relax.build).",
            )
        names = annotated_blocks(func)
        if names:
            raise StreamKError(
                COND_PIPELINE,
                f"block {names[0]!r} of {gvar.name_hint!r} carries a Stream-K decision and the "
                f"{pipeline!r} TIR pipeline does not lower it",
                f"Build with tir_pipeline={NAME!r} (tvm.compile, relax.build), or remove the "
                "decision with tvm_streamk.meta_schedule.annotate.without_stream_k for the "
                "data-parallel kernel.",
            )


def _guarded(name: str, factory):
    def make(**kwargs):
        base, finalize_host, finalize_device = factory(**kwargs)

        @tvm.transform.module_pass(opt_level=0, name=f"tvm_streamk.guarded_{name}")
        def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
            refuse_unlowered(mod, name)
            return with_safe_reuse(mod, base) if name in ("default", BASE) else base(mod)

        return _pipeline, finalize_host, finalize_device

    return make


def _guard_stock_pipelines() -> None:
    """Wrap every other registered TIR pipeline with :func:`refuse_unlowered` (once)."""
    registry = registered_tir_pipelines()
    for name, factory in list(registry.items()):
        if name != NAME and name not in _STOCK:
            _STOCK[name] = factory
            registry[name] = _guarded(name, factory)


register_tir_pipeline(NAME, stream_k_pipeline)
_guard_stock_pipelines()


def _as_module(mod) -> tvm.IRModule:
    if isinstance(mod, tvm.tirx.PrimFunc):
        return tvm.IRModule({"main": mod})
    if isinstance(mod, tvm.IRModule):
        return mod
    raise TypeError(f"expected a PrimFunc or an IRModule; found {type(mod).__name__}")


def lower(mod, target) -> tvm.IRModule:
    """The module after ``LowerStreamK``: Stream-K kernels rewritten, blocks still visible.

    ``mod`` is a PrimFunc, an IRModule or a ``tvm.s_tir.Schedule`` (its ``mod`` is taken).
    """
    if hasattr(mod, "mod") and hasattr(mod, "trace"):
        mod = mod.mod
    target = as_target(target)
    if target.host is None:
        target = target.with_host("llvm")
    mod = tvm.tirx.transform.BindTarget(target)(_as_module(mod))
    return LowerRaggedViews()(LowerStreamK()(mod))

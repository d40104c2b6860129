"""The ``tvm_streamk`` TIR pipeline: TVM's default ``s_tir`` pipeline behind ``LowerStreamK``.

``LowerStreamK`` runs first, while the IR still has blocks, ``T.init`` and iteration variables;
everything after it (thread syncs, storage planning, host/device split) is TVM's own, except
``ResolveDeviceSMs`` at the end, which needs the device ``MakePackedAPI`` defines.
"""

from __future__ import annotations

import tvm

from ._compat import get_tir_pipeline, register_tir_pipeline
from ._compat import target as as_target
from .transform import LowerStreamK
from .transform.device_sms import ResolveDeviceSMs

NAME = "tvm_streamk"
BASE = "s_tir"


def stream_k_pipeline():
    """The pipeline factory: ``(pipeline_pass, finalize_host, finalize_device)``."""
    base, finalize_host, finalize_device = get_tir_pipeline(BASE)

    @tvm.transform.module_pass(opt_level=0, name="tvm_streamk.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return ResolveDeviceSMs()(base(LowerStreamK()(mod)))

    return _pipeline, finalize_host, finalize_device


register_tir_pipeline(NAME, stream_k_pipeline)


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
    return LowerStreamK()(mod)

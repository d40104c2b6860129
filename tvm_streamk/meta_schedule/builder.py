"""Building MetaSchedule candidates through the ``tvm_streamk`` TIR pipeline.

``LocalBuilder`` runs a build function and an export function one after the other in a worker
process. :func:`build` compiles the candidate with ``tir_pipeline="tvm_streamk"`` (so Stream-K
decisions are lowered; other candidates build as with TVM's default pipeline) and returns the
runtime module together with the scheduled IRModule; :func:`export` writes the module as
TVM's default export does and saves the IRModule next to it as :data:`IR_FILE`, where
:class:`~tvm_streamk.meta_schedule.PoclRunner` reads it. Both are module-level functions, so the
worker receives them by reference: unpickling them there imports ``tvm_streamk``, which registers
the pipeline.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import tvm
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from .._compat import meta_schedule
from ..pipeline import NAME as PIPELINE

# The scheduled IRModule of a candidate, saved with ``tvm.ir.save_json`` beside its artifact.
IR_FILE = "mod.json"


@dataclass(frozen=True)
class Built:
    """A built candidate: its runtime module and the IRModule it was built from."""

    module: tvm.runtime.Module
    ir: tvm.IRModule


def build(mod: tvm.IRModule, target: tvm.target.Target, params=None) -> Built:
    """Compile one candidate with the ``tvm_streamk`` TIR pipeline (``f_build`` of the builder).

    Parameters
    ----------
    mod : IRModule
        The scheduled candidate, Stream-K decisions still recorded as block annotations.
    target : Target
        The target to build for.
    params : dict, optional
        Must be None, as for MetaSchedule's default build.

    Returns
    -------
    Built
        Only :func:`export` knows what to do with it.
    """
    if params:
        raise ValueError("the Stream-K builder takes no params; bind them into the module")
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return Built(tvm.compile(mod, target=target, tir_pipeline=PIPELINE), mod)


def export(built: Built) -> str:
    """Export a :class:`Built` candidate (``f_export`` of the builder); return the artifact path.

    The artifact is the tar MetaSchedule's default export writes (what ``LocalRunner`` loads);
    the IRModule goes to :data:`IR_FILE` in the same fresh directory, which MetaSchedule's
    ``RemoveBuildArtifact`` callback deletes as a whole after measurement.
    """
    from tvm.support.tar import tar

    directory = tempfile.mkdtemp(prefix="tvm_streamk_")
    artifact = os.path.join(directory, "tvm_tmp_mod." + tar.output_format)
    built.module.export_library(artifact, fcompile=tar)
    with open(os.path.join(directory, IR_FILE), "w") as f:
        f.write(tvm.ir.save_json(built.ir))
    return artifact


def ir_path(artifact_path: str) -> str:
    """Where :func:`export` saved the IRModule of the candidate built into ``artifact_path``."""
    return os.path.join(os.path.dirname(artifact_path), IR_FILE)


def stream_k_builder(**kwargs) -> meta_schedule.builder.LocalBuilder:
    """A ``LocalBuilder`` that builds with :func:`build` and exports with :func:`export`.

    Parameters
    ----------
    **kwargs
        Forwarded to ``ms.builder.LocalBuilder`` (``max_workers``, ``timeout_sec``, ...).

    Examples
    --------
    >>> builder = stream_k_builder(max_workers=2)
    >>> results = builder.build([ms.builder.BuilderInput(sch.mod, target)])
    >>> results[0].error_msg is None
    True
    """
    return meta_schedule.builder.LocalBuilder(f_build=build, f_export=export, **kwargs)

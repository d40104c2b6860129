"""Tensor-core accumulators: MMA update blocks, their zero fills and their shared staging.

A fragment accumulator (:data:`~.site.FRAGMENT_SCOPES`) has no addressable elements, so it is
recognised by the intrinsics that touch it rather than by its stores. An update block qualifies
in two states: tensorized (its body calls an MMA intrinsic), or marked for tensorization by
MetaSchedule's tensor-core tiling, which blockizes the update, annotates the block with the
intrinsic to use (:data:`AUTO_TENSORIZE`) and leaves ``tensorize`` to its ``RewriteTensorize``
postproc. The second state is what a schedule rule sees, so Stream-K twins can join the
``cuda-tensorcore`` design space; the postproc's ``tensorize`` keeps the block's annotations,
and with them the decision.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import SBlock, loaded_buffer, structural_walk
from ..errors import StreamKError
from .blocks import is_zero
from .site import COND_WRITEBACK, FRAGMENT_SCOPES

# Tensor-core intrinsics: an MMA accumulates (C += A * B) by definition; filling zero is its init.
MMA_INTRINSICS = ("tirx.tvm_mma_sync", "tirx.ptx_mma", "tirx.ptx_mma_sp", "tirx.mma_sync")
FILL_INTRINSICS = ("tirx.tvm_fill_fragment", "tirx.mma_fill")
# The block annotation by which MetaSchedule's tensor-core rules name the tensor intrinsic that
# its RewriteTensorize postproc will apply to the block.
AUTO_TENSORIZE = "meta_schedule.auto_tensorize"


def calls(stmt, names: tuple[str, ...]) -> list:
    """The calls of the operators ``names`` in ``stmt``."""
    found = []

    def visit(call) -> None:
        op = getattr(call, "op", None)
        if op is not None and getattr(op, "name", "") in names:
            found.append(call)

    structural_walk(stmt, (tvm.ir.Call, visit))
    return found


def _fragment_written(block: SBlock) -> tirx.Buffer | None:
    frag = [w for w in block.writes if loaded_buffer(w).scope() in FRAGMENT_SCOPES]
    return loaded_buffer(frag[0]) if len(block.writes) == 1 and frag else None


def _names_an_mma(intrinsic) -> bool:
    found = tvm.s_tir.TensorIntrin.get(str(intrinsic), allow_missing=True)
    return found is not None and bool(calls(found.impl.body, MMA_INTRINSICS))


def fragment_update(block: SBlock) -> tirx.Buffer | None:
    """The fragment accumulator of an MMA update block, tensorized or marked for
    tensorization with an MMA intrinsic (module docstring); None if it is neither."""
    acc = _fragment_written(block)
    if acc is None:
        return None
    if calls(block.body, MMA_INTRINSICS):
        return acc
    marked = block.annotations.get(AUTO_TENSORIZE)
    if marked is not None and _names_an_mma(marked):
        return acc
    return None


def zero_fill(stmt, acc: tirx.Buffer) -> bool:
    """Whether ``stmt`` fills the fragment accumulator ``acc`` with zeros and does nothing else:
    fill intrinsics of 0 (tensorized), or stores of 0 to ``acc`` (still to be tensorized)."""
    fills = calls(stmt, FILL_INTRINSICS)
    if fills:
        return all(is_zero(call.args[-1]) for call in fills)
    stores = []
    structural_walk(stmt, (tirx.BufferStore, stores.append))
    return bool(stores) and all(s.buffer.same_as(acc) and is_zero(s.value) for s in stores)


def staging(block: SBlock, acc: tirx.Buffer) -> tirx.Buffer:
    """The shared buffer a fragment accumulator is stored to by ``block``."""
    outs = [loaded_buffer(w) for w in block.writes]
    if len(outs) != 1 or not outs[0].scope().startswith("shared"):
        found = [f"{b.name} ({b.scope()})" for b in outs]
        raise StreamKError(
            COND_WRITEBACK,
            f"block {block.name_hint!r} stores the fragment accumulator {acc.name} to {found}",
            "Stage the fragments in one shared-memory buffer before the global write-back.",
        )
    return outs[0]

"""Queries over the blocks of a TensorIR function: where a block is, what it reads and writes.

Pure: never mutates IR. Shared by the analysis of a tiled reduction (:mod:`.tiled_reduction`),
its tensor-core part (:mod:`.tensor_core`), the lowering and the integrations.
"""

from __future__ import annotations

from tvm import tirx

from .._compat import (
    BufferLoadNode,
    SBlock,
    SBlockRealize,
    loaded_buffer,
    structural_walk,
)
from ..errors import StreamKError
from .site import COND_BLOCK


def find_block_path(func: tirx.PrimFunc, name: str) -> list:
    """The statements from the function body down to the realize of block ``name`` (inclusive)."""
    path: list = []

    def visit(stmt) -> bool:
        path.append(stmt)
        if isinstance(stmt, SBlockRealize):
            if stmt.block.name_hint == name:
                return True
            if visit(stmt.block.body):
                return True
        elif isinstance(stmt, tirx.SeqStmt):
            if any(visit(s) for s in stmt.seq):
                return True
        elif isinstance(stmt, tirx.For | tirx.While):
            if visit(stmt.body):
                return True
        elif isinstance(stmt, tirx.IfThenElse):
            if visit(stmt.then_case) or (stmt.else_case is not None and visit(stmt.else_case)):
                return True
        path.pop()
        return False

    if not visit(func.body):
        raise StreamKError(
            COND_BLOCK,
            f"no block named {name!r} in the function",
            "Pass the reduction block of the kernel (its update block).",
        )
    return path


def blocks_under(stmt) -> list[SBlock]:
    """Every block realized below ``stmt``, in program order."""
    found: list[SBlock] = []

    def on_block(block):
        found.append(block)

    structural_walk(stmt, (SBlock, on_block), order="pre")
    return found


def function_of(mod, block: SBlock) -> tirx.PrimFunc:
    """The PrimFunc of ``mod`` that holds ``block`` itself (the block an ``SBlockRV`` names):
    block names repeat across the functions of a module."""
    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc) and any(
            b.same_as(block) for b in blocks_under(func.body)
        ):
            return func
    raise StreamKError(
        COND_BLOCK,
        f"block {block.name_hint!r} in no PrimFunc of the module",
        "Pass a block of this schedule's module.",
    )


def blockized_parent(path) -> SBlock | None:
    """The reduction block that the last block of ``path`` (:func:`find_block_path`) is the
    inner block of -- ``blockize`` (tensorization) made it -- or None."""
    for outer in path[:-1]:
        if isinstance(outer, SBlockRealize) and is_reduction(outer.block):
            return outer.block
    return None


def uses_var(expr, var: tirx.Var) -> bool:
    """Whether ``var`` occurs in ``expr``."""
    hit = []
    structural_walk(expr, (tirx.Var, lambda v: hit.append(True) if v.same_as(var) else None))
    return bool(hit)


def reads(block: SBlock, buffer: tirx.Buffer) -> bool:
    """Whether ``block`` reads ``buffer`` (by its read regions or a load in its body)."""
    if any(loaded_buffer(r).same_as(buffer) for r in block.reads):
        return True
    hit = []
    structural_walk(
        block.body,
        (
            BufferLoadNode,
            lambda ld: hit.append(True) if loaded_buffer(ld).same_as(buffer) else None,
        ),
    )
    return bool(hit)


def writes(block: SBlock, buffer: tirx.Buffer) -> bool:
    """Whether ``buffer`` is among the regions ``block`` writes."""
    return any(loaded_buffer(w).same_as(buffer) for w in block.writes)


def is_zero(expr) -> bool:
    """Whether ``expr`` is the constant 0 (integer or float)."""
    return isinstance(expr, tirx.IntImm | tirx.FloatImm) and float(expr.value) == 0.0


def is_reduction(block: SBlock) -> bool:
    """Whether ``block`` has a reduction axis."""
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars)


def sblock_rv(sch, block):
    """``block`` (a name or an ``SBlockRV``) as an ``SBlockRV`` of ``sch``.

    A name no block has is refused in one line naming the reduction blocks there are (TVM's own
    error prints the whole module first).
    """
    if not isinstance(block, str):
        return block
    names, reductions = [], []
    for func in sch.mod.functions.values():
        if isinstance(func, tirx.PrimFunc):
            for b in blocks_under(func.body):
                names.append(b.name_hint)
                if is_reduction(b):
                    reductions.append(b.name_hint)
    if block not in names:
        raise StreamKError(
            COND_BLOCK,
            f"no block named {block!r} in the schedule (reduction blocks: {reductions})",
            "Pass the name of the reduction's update block, or its SBlockRV.",
        )
    return sch.get_sblock(block)

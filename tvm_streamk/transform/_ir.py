"""Constructors of s_tir statements shared by the rewrite and its fix-ups."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from .. import decomposition
from .._compat import SBlock, SBlockRealize, dtype_of, structural_map, structural_walk


class TirOps:
    """Arithmetic for :mod:`tvm_streamk.decomposition` closed forms on TIR expressions."""

    floordiv = staticmethod(tirx.floordiv)
    floormod = staticmethod(tirx.floormod)
    min = staticmethod(tirx.min)
    max = staticmethod(tirx.max)

    @staticmethod
    def select(cond, a, b):
        return tirx.Select(cond, a, b)

    @staticmethod
    def lt(a, b):
        return a < b

    @staticmethod
    def le(a, b):
        return a <= b

    @staticmethod
    def ge(a, b):
        return a >= b

    @staticmethod
    def gt(a, b):
        return a > b

    @staticmethod
    def eq(a, b):
        return a == b

    @staticmethod
    def ne(a, b):
        return a != b

    @staticmethod
    def and_(a, b):
        return tirx.And(a, b)

    @staticmethod
    def or_(a, b):
        return tirx.Or(a, b)


TIR_OPS = TirOps()


@dataclass(frozen=True)
class Segment:
    """The variables a segment of the persistent walk binds, as seen by the fix-ups."""

    block: tirx.Var  # the persistent block index
    index: tirx.Var  # position of this segment within the block's current unit
    tile: tirx.Var
    k_begin: tirx.Var
    k_end: tirx.Var
    full: tirx.Var  # the segment covers every panel of its tile


def int_imm(value, dtype: str = "int32") -> tirx.IntImm:
    return tirx.IntImm(dtype, int(value))


def var(name: str, dtype: str = "int32") -> tirx.Var:
    return tirx.Var(name, dtype)


def seq(stmts: list) -> tirx.Stmt:
    flat = [s for s in stmts if s is not None]
    return flat[0] if len(flat) == 1 else tirx.SeqStmt(flat)


def replace_block(block: SBlock, **changes) -> SBlock:
    """A copy of ``block`` with some fields replaced."""
    fields = {
        "iter_vars": block.iter_vars,
        "reads": block.reads,
        "writes": block.writes,
        "name_hint": block.name_hint,
        "body": block.body,
        "init": block.init,
        "alloc_buffers": block.alloc_buffers,
        "match_buffers": block.match_buffers,
        "annotations": block.annotations,
    }
    fields.update(changes)
    return SBlock(**fields)


def opaque_block(name: str, body, reads=(), writes=(), predicate=True) -> SBlockRealize:
    """A block without iteration variables around ``body``, guarded by ``predicate``."""
    block = SBlock([], list(reads), list(writes), name, body)
    return SBlockRealize([], predicate, block)


def whole(buffer: tirx.Buffer):
    """The region of all of ``buffer``."""
    return tvm.tirx.BufferRegion(
        buffer, [tvm.ir.Range.from_min_extent(0, extent) for extent in buffer.shape]
    )


def block_loop(loop_var: tirx.Var, extent, body) -> tirx.For:
    """``for loop_var in T.thread_binding(extent, "blockIdx.x")``."""
    dtype = dtype_of(loop_var)
    # As the TVMScript parser builds it: the binding's variable is the thread tag, not the loop's.
    binding = tirx.IterVar(None, var("blockIdx.x", dtype), tirx.IterVar.ThreadIndex, "blockIdx.x")
    return tirx.For(loop_var, int_imm(0, dtype), extent, tirx.ForKind.THREAD_BINDING, body, binding)


def over_units(plan: decomposition.Plan, b, make_body) -> tirx.Stmt:
    """``make_body(lo, hi)`` for every unit range of block ``b``; a loop when there are several."""
    units = plan.units(TIR_OPS)
    dtype = dtype_of(b)
    lo, hi = var("sk_lo", dtype), var("sk_hi", dtype)
    if isinstance(units, int) and units == 1:
        lo_e, hi_e = plan.block_range(b, 0, TIR_OPS)
        return seq([tirx.Bind(lo, lo_e), tirx.Bind(hi, hi_e), make_body(lo, hi)])
    u = var("sk_unit", dtype)
    lo_e, hi_e = plan.block_range(b, u, TIR_OPS)
    body = seq([tirx.Bind(lo, lo_e), tirx.Bind(hi, hi_e), make_body(lo, hi)])
    return tirx.For(u, int_imm(0, dtype), units, tirx.ForKind.SERIAL, body)


def coordinates(band: tuple[tirx.For, ...], tile, group: int | None) -> list[tirx.Bind]:
    """``Bind`` statements that define the band's loop variables from a linear tile index."""
    extents = tuple(int(loop.extent) for loop in band)
    coords = decomposition.tile_order(tile, extents, group=group, ops=TIR_OPS)
    return [tirx.Bind(loop.loop_var, c) for loop, c in zip(band, coords, strict=True)]


def prune_to(stmt, names: set[str], rewrite_realize):
    """The loops of ``stmt`` that lead to the blocks in ``names``; everything else is dropped.

    Each kept block realize is replaced by ``rewrite_realize(realize)``.
    """
    if isinstance(stmt, SBlockRealize):
        return rewrite_realize(stmt) if stmt.block.name_hint in names else None
    if isinstance(stmt, tirx.SeqStmt):
        kept = [k for k in (prune_to(s, names, rewrite_realize) for s in stmt.seq) if k]
        return seq(kept) if kept else None
    if isinstance(stmt, tirx.For):
        body = prune_to(stmt.body, names, rewrite_realize)
        if body is None:
            return None
        return tirx.For(
            stmt.loop_var,
            stmt.min,
            stmt.extent,
            stmt.kind,
            body,
            stmt.thread_binding,
            stmt.annotations,
        )
    if isinstance(stmt, tirx.IfThenElse):
        then = prune_to(stmt.then_case, names, rewrite_realize)
        return None if then is None else tirx.IfThenElse(stmt.condition, then, None)
    return None


def storage_sync() -> tirx.Stmt:
    """A barrier across the threads of a GPU block."""
    return tirx.Evaluate(tvm.tirx.op.tvm_storage_sync("shared"))


def fresh_definitions(stmt: tirx.Stmt) -> tirx.Stmt:
    """``stmt`` with a new variable for every loop, block iteration and ``Bind`` it defines.

    A statement built from pieces of another (a prologue from the tile body) would otherwise
    define the same variables twice in one function.
    """
    defined: dict = {}

    def define(v) -> None:
        defined.setdefault(v, tirx.Var(v.name, v.ty))

    def define_loop(loop) -> None:
        define(loop.loop_var)
        if loop.thread_binding is not None:
            define(loop.thread_binding.var)

    def define_block(block) -> None:
        for iv in block.iter_vars:
            define(iv.var)

    structural_walk(
        stmt,
        [
            (tirx.For, define_loop),
            (SBlock, define_block),
            (tirx.Bind, lambda bind: define(bind.var)),
        ],
    )
    return structural_map(stmt, (tirx.Var, lambda v: defined.get(v, v)))

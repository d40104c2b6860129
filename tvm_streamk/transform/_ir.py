"""Small constructors of s_tir statements shared by the rewrites."""

from __future__ import annotations

from tvm import tirx

from .._compat import SBlock, structural_map, structural_walk


def replace_block(block: SBlock, **changes) -> SBlock:
    """A copy of ``block`` with some fields replaced."""
    fields = dict(
        iter_vars=block.iter_vars,
        reads=block.reads,
        writes=block.writes,
        name_hint=block.name_hint,
        body=block.body,
        init=block.init,
        alloc_buffers=block.alloc_buffers,
        match_buffers=block.match_buffers,
        annotations=block.annotations,
    )
    fields.update(changes)
    return SBlock(**fields)


def fresh_definitions(stmt: tirx.Stmt) -> tirx.Stmt:
    """``stmt`` with a new variable for every loop, block iteration and ``Bind`` it defines.

    A statement built from pieces of another (the zeroing prologue from the tile body) would
    otherwise define the same variables twice in one function.
    """
    defined: dict = {}

    def define(var) -> None:
        defined.setdefault(var, tirx.Var(var.name, var.ty))

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

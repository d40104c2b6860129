"""Run-time rows: a matmul's static row count made a run-time extent, for batch invariance.

Under ``batch_invariant=True`` every kernel that multiplies by one weight must give a row the
same bits whatever the number of rows (docs/batch_invariance.md). dlight schedules a static M
by its value: at M = 1 its ``gpu.Matmul`` declines and a GEMV rule takes the kernel, reducing
K in its own order; an fp16 matmul gets tensor cores only when every static extent exceeds 64.
A run-time M is one kernel for every M. :func:`run_time_rows` makes a matmul's static M that
run-time extent: the function computes the same values for any row count, the Relax call keeps
its static shapes (the kernel reads M from its argument's shape, as any kernel with a symbolic
extent does), and a decode step at one token runs the kernel a model with a symbolic sequence
length runs for its prefill.

The rows are the output's innermost axis that the left operand indexes and the right one does
not (``x @ W``: the token axis of ``x``). That axis of every buffer the function's blocks reach
from it (the left operand, the accumulator, a fused epilogue's operands and output) takes the
run-time extent, and so does every loop over it.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import (
    SBlock,
    SBlockRealize,
    buffer_type_like,
    loaded_buffer,
    replace_block,
    structural_map,
    structural_walk,
)
from ..analysis import gemm_axes, is_reduction


def run_time_rows(func: tirx.PrimFunc, name: str = "m") -> tirx.PrimFunc | None:
    """``func`` with its matmul's static row count replaced by a run-time variable ``name``.

    The function qualifies when:

    1. exactly one block reduces, and it is a GEMM (:func:`~tvm_streamk.analysis.gemm_axes`,
       so every extent of it is static);
    2. an axis of its output of extent ``M`` is indexed by the left operand and not by the
       right one (the innermost such axis is the rows);
    3. wherever the rows reach (through any block's reads and writes), they are a whole index
       (``buf[..., v, ...]``, one element) of a buffer axis of extent ``M``, by a spatial
       iteration variable of extent ``M`` bound to a loop of its own from 0 to ``M``.

    Returns
    -------
    tirx.PrimFunc or None
        The function with those axes, iteration domains and loops of extent ``name``, or None
        when ``func`` does not qualify (a matmul whose rows are already a run-time extent
        included): the caller keeps ``func``.
    """
    realizes = _realizes(func)
    reducing = [r for r in realizes if is_reduction(r.block)]
    if len(reducing) != 1:
        return None
    main = reducing[0].block
    axes = gemm_axes(main)
    if axes is None:
        return None
    a_vars, b_vars = axes.used_by(0), axes.used_by(1)
    rows = [
        index
        for index in axes.indices[2]
        if isinstance(index, tirx.Var)
        and index in a_vars
        and index not in b_vars
        and any(index.same_as(v) for v in axes.i + axes.unit)
    ]
    if not rows:
        return None
    extent = axes.extents[rows[-1]]
    reach = _reach(func, realizes, rows[-1], extent)
    if reach is None:
        return None
    row_vars, row_dims, row_loops = reach
    m = tirx.Var(name, _extent_dtype(main, rows[-1]))
    renamed = {}
    for buf, dims in row_dims.items():
        shape = [m if d in dims else e for d, e in enumerate(buf.ty.shape)]
        renamed[buf.__chandle__()] = tvm.ir.Var(buf.name, buffer_type_like(buf.ty, shape=shape))

    def block(b: SBlock) -> SBlock:
        iter_vars = [
            tirx.IterVar(tvm.ir.Range(iv.dom.min, m), iv.var, iv.iter_type)
            if any(iv.var.same_as(v) for v in row_vars)
            else iv
            for iv in b.iter_vars
        ]
        return replace_block(b, iter_vars=iter_vars)

    def loop(f: tirx.For) -> tirx.For:
        if not any(f.loop_var.same_as(v) for v in row_loops):
            return f
        return tirx.For(f.loop_var, f.min, m, f.kind, f.body, f.thread_binding, f.annotations)

    def var(v):
        return renamed.get(v.__chandle__(), v)

    body = structural_map(func.body, [(SBlock, block), (tirx.For, loop), (tvm.ir.Var, var)])
    params = [var(p) for p in func.params]
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs)


def _realizes(func: tirx.PrimFunc) -> list:
    found: list = []
    structural_walk(func.body, (SBlockRealize, found.append))
    return found


def _extent_dtype(block: SBlock, row) -> str:
    iv = next(iv for iv in block.iter_vars if iv.var.same_as(row))
    return str(iv.dom.extent.ty)


def _reach(func: tirx.PrimFunc, realizes, row, extent: int):
    """``(row iteration variables, buffer -> row axes, loop variables over rows)`` reached
    from ``row`` through every block's accesses, or None where a use is not a whole index of
    an axis of ``extent`` or a row variable is bound otherwise (:func:`run_time_rows`,
    condition 3)."""
    row_vars = [row]
    row_dims: dict = {}

    def is_row(v) -> bool:
        return isinstance(v, tirx.Var) and any(v.same_as(r) for r in row_vars)

    changed = True
    while changed:
        changed = False
        for realize in realizes:
            for region in (*realize.block.reads, *realize.block.writes):
                buf = loaded_buffer(region)
                for d, r in enumerate(region.region):
                    uses = _uses_rows(r.min, row_vars)
                    known = d in row_dims.get(buf, set())
                    if not (uses or known):
                        continue
                    whole = is_row(r.min) or (known and _own_var(r.min, realize.block))
                    one = _is_const(r.extent, 1)
                    if not (whole and one and _is_const(buf.ty.shape[d], extent)):
                        return None
                    if not known:
                        row_dims.setdefault(buf, set()).add(d)
                        changed = True
                    if not is_row(r.min):
                        row_vars.append(r.min)
                        changed = True
    bindings = [
        (iv, value)
        for realize in realizes
        for iv, value in zip(realize.block.iter_vars, realize.iter_values)
    ]
    row_loops = []
    for iv, value in bindings:
        if is_row(iv.var):
            if (
                iv.iter_type != tirx.IterVar.DataPar
                or not _is_const(iv.dom.extent, extent)
                or not isinstance(value, tirx.Var)
            ):
                return None
            row_loops.append(value)
    # A loop over rows binds rows only, and runs from 0 to their extent.
    if any(_uses_rows(value, row_loops) for iv, value in bindings if not is_row(iv.var)):
        return None
    loops: list = []
    structural_walk(func.body, (tirx.For, loops.append))
    for f in loops:
        over_rows = any(f.loop_var.same_as(v) for v in row_loops)
        if over_rows and not (_is_const(f.min, 0) and _is_const(f.extent, extent)):
            return None
    return row_vars, row_dims, row_loops


def _own_var(index, block: SBlock) -> bool:
    return isinstance(index, tirx.Var) and any(index.same_as(iv.var) for iv in block.iter_vars)


def _uses_rows(expr, row_vars) -> bool:
    found = []
    structural_walk(
        expr, (tirx.Var, lambda v: found.append(v) if any(v.same_as(r) for r in row_vars) else None)
    )
    return bool(found)


def _is_const(expr, value: int) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr) == value

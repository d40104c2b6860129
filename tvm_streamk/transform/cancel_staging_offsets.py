"""Shared-memory indices of the persistent walk with the tile's offset cancelled.

The persistent walk reads a block's unit range back through a register
(:func:`tvm_streamk.transform._ir.opaque_bind`: ``sk_lo_local[0] = ...; sk_lo = sk_lo_local[0]``)
so that TVM's region analysis sizes the staging buffers for one tile. ``CompactBufferAllocation``
then offsets every access of a staging buffer by the region's start, written with the load
(``sk_lo_local[0]``), while the access itself is written with the variable (``sk_lo``): the
tile's coordinates appear twice, once through each, and no TVM pass knows they are equal.
nvcc cancels them in some kernels and not in others: dlight's fp32 kernel of a run-time M on
sm_90 keeps its K loop's shared-memory reads paired (``LDS.128``) at K = 3072 and loses the
pairing at K = 1024, 2048 and 4096, where the tile index is a shift (84 ``LDS`` against
data-parallel's 36; 1.45 instructions per FMA against 1.25).

``CancelStagingOffsets`` runs after TVM's pipeline. For each index of a shared-memory access it
substitutes the variables common-subexpression elimination bound (pure values) and each
register copy's load by the variable read from it (the copy is stored once, before it is read
back), and simplifies. Only the copies a kernel reads outside its loops are taken: a run-time
walk's single unit range (``over_units(..., opaque_range=True)``); a hybrid's unit ranges are
read inside its unit loop, where cancelling cost some kernels spills. The new index is used
only when it no longer involves a register copy at all: the tile's offset cancelled and what
is left is the data-parallel kernel's own index (threads, the panel's loops). Any other index
is left as it was.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import BufferLoadNode, arith, loaded_buffer, structural_map, structural_walk
from ._ir import map_prim_funcs

_STAGING = ("shared", "shared.dyn")


def _key(obj) -> int:
    return obj.__chandle__()


def _storage(buf) -> str:
    # A register copy is stored through its allocation and read through a view of it
    # (``DeclBuffer``): two buffer variables of one name, which TVM's pipeline keeps.
    return str(buf.name)


def _register_copies(func: tirx.PrimFunc) -> tuple[dict, dict, set]:
    """``(copies, pure, copy_vars)``: the variable each register copy (a one-element local
    buffer stored once and read back by a ``Bind`` outside every loop) is read into, by the
    buffer's name; the value of every other ``Bind`` without loads; and the variables the
    copies are read into."""
    stores: dict[str, int] = {}
    reads: dict[str, tvm.ir.Var] = {}
    pure: dict[int, tirx.Expr] = {}

    def on_store(store) -> None:
        name = _storage(store.buffer)
        stores[name] = stores.get(name, 0) + 1

    def on_bind(bind: tirx.Bind) -> None:
        value = bind.value
        if isinstance(value, BufferLoadNode):
            buf = loaded_buffer(value)
            one = [int(getattr(e, "value", -1)) for e in buf.shape] == [1]
            if one and str(buf.scope()) == "local":
                reads[_storage(buf)] = bind.var
            return
        loads = []
        structural_walk(value, (BufferLoadNode, loads.append))
        if not loads:
            pure[_key(bind.var)] = value

    structural_walk(func.body, [(tirx.BufferStore, on_store), (tirx.Bind, on_bind)])
    # Only the copies a kernel reads once, outside its loops: a run-time walk's single unit
    # range. A hybrid reads its units' ranges inside the unit loop, and there the cancelled
    # indices cost registers or spills where they had none (measured: 4 of the ptxas suite's
    # static hybrids on sm_80 and sm_90 spilled 16-36 bytes or took 96 registers).
    in_loops: set[str] = set()

    def on_loop(loop) -> None:
        def on_inner(bind: tirx.Bind) -> None:
            if isinstance(bind.value, BufferLoadNode):
                in_loops.add(_storage(loaded_buffer(bind.value)))

        structural_walk(loop.body, [(tirx.Bind, on_inner)])

    structural_walk(func.body, [(tirx.For, on_loop)])
    copies = {
        name: var for name, var in reads.items() if stores.get(name) == 1 and name not in in_loops
    }
    return copies, pure, {_key(v) for v in copies.values()}


def cancel_offsets(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the staging-buffer indices whose tile offset cancels simplified (see the
    module's docstring); unchanged when none does."""
    copies, pure, copy_vars = _register_copies(func)
    if not copies:
        return func
    analyzer = arith.Analyzer()

    def expand(expr):
        def on_var(v):
            value = pure.get(_key(v))
            return expand(value) if value is not None else v

        def on_load(load):
            var = copies.get(_storage(loaded_buffer(load)))
            return var if var is not None else load

        return structural_map(expr, [(tvm.ir.Var, on_var), (BufferLoadNode, on_load)])

    def involves_copy(expr) -> bool:
        hit = []

        def on_var(v):
            if _key(v) in copy_vars:
                hit.append(v)

        def on_load(load):
            if _storage(loaded_buffer(load)) in copies:
                hit.append(load)

        structural_walk(expr, [(tvm.ir.Var, on_var), (BufferLoadNode, on_load)])
        return bool(hit)

    def cancelled(index):
        if isinstance(index, tirx.Ramp):
            base = cancelled(index.base)
            if base.same_as(index.base):
                return index
            return tirx.Ramp(base, index.stride, index.lanes)
        if not involves_copy(index):
            return index
        simple = analyzer.simplify(expand(index))
        return index if involves_copy(simple) else simple

    changed = []

    def new_indices(node):
        indices = [cancelled(i) for i in node.indices]
        if all(a.same_as(b) for a, b in zip(indices, node.indices)):
            return None
        changed.append(node)
        return indices

    def on_load(load):
        if str(loaded_buffer(load).scope()) not in _STAGING:
            return load
        indices = new_indices(load)
        return load if indices is None else tirx.BufferLoad(loaded_buffer(load), indices)

    def on_store(store):
        if str(store.buffer.scope()) not in _STAGING:
            return store
        indices = new_indices(store)
        if indices is None:
            return store
        return tirx.BufferStore(store.buffer, store.value, indices)

    body = structural_map(func.body, [(BufferLoadNode, on_load), (tirx.BufferStore, on_store)])
    return func.with_body(body) if changed else func


@tvm.transform.module_pass(opt_level=0, name="tvm_streamk.CancelStagingOffsets")
def CancelStagingOffsets(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass
    """The module pass of :func:`cancel_offsets` (module docstring), for every PrimFunc."""
    return map_prim_funcs(mod, lambda _, func: cancel_offsets(func))

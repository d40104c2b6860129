"""Index the accumulator from its tile's origin, so that it compacts into registers.

The accumulator of a tiled kernel is declared over the whole output (``C_local[M, N]``) and TVM's
``CompactBufferAllocation`` shrinks it to one thread's register tile by cancelling the tile and
thread offsets in its indices. In the persistent kernel the tile coordinates are no longer loop
variables but functions of the tile index (``tile % tiles_n``), and TVM's region analysis expands
such a modulo into a form it cannot cancel: the compacted register tile gets a data-dependent,
clamped offset and the GPU compiler has to keep it in local memory. Subtracting the band's share
of every accumulator index up front (``C_local[v0 - i_0 * BM, v1 - j_0 * BN]``) leaves only
thread and loop terms, which compact exactly as in the data-parallel kernel. A band fused into
one ``blockIdx`` loop (MetaSchedule's MultiLevelTiling) has shares ``fused // 32 * 64`` and
``fused % 32 * 64``: without the shift its register tile lands in local memory (176 bytes of
stack per thread for a 64 x 64 tile of 128 threads, ptxas reports).

Every predicated access keeps ``0 <= v - origin <= v < shape``, so the shifted indices stay inside
the declared buffer.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import (
    BufferLoadNode,
    SBlock,
    SBlockRealize,
    arith,
    loaded_buffer,
    replace_block,
    structural_equal,
    structural_map,
    structural_walk,
)
from ..analysis import StreamKSite


class _NotAffine(Exception):
    """An accumulator index is not affine in the band variables."""


def _band_offset(expr, binding: dict, band: list):
    """The band variables' share of ``expr`` (None when there is none).

    The share is ``expr`` minus ``expr`` with the band variables at 0: an affine term
    (``i_0 * 32``) or, for a fused band (MetaSchedule binds one ``blockIdx`` loop), a division
    or modulo of it (``fused % 32 * 64``).

    Raises
    ------
    _NotAffine
        When ``expr`` does not split into a band part and a part free of the band.
    """
    in_loops = structural_map(expr, (tirx.Var, lambda v: binding.get(v, v)))
    zeros = {var: tirx.const(0, str(var.ty)) for var in band}
    rest = structural_map(in_loops, (tirx.Var, lambda v: zeros.get(v, v)))
    offset = arith.Analyzer().simplify(in_loops - rest)
    if isinstance(offset, tirx.IntImm) and int(offset.value) == 0:
        return None
    used: list = []
    structural_walk(offset, (tirx.Var, used.append))
    if any(not any(v.same_as(b) for b in band) for v in used):
        raise _NotAffine(str(expr))
    return offset


def _accesses(block: SBlock, acc) -> list[list]:
    """Index lists of every access to ``acc`` in ``block`` (body, init, regions)."""
    found: list[list] = []

    def on_load(load) -> None:
        if loaded_buffer(load).same_as(acc):
            found.append(list(load.indices))

    def on_store(store) -> None:
        if store.buffer.same_as(acc):
            found.append(list(store.indices))

    for stmt in (block.body, block.init):
        if stmt is not None:
            structural_walk(stmt, [(BufferLoadNode, on_load), (tirx.BufferStore, on_store)])
    for region in [*block.reads, *block.writes]:
        if loaded_buffer(region).same_as(acc):
            found.append([r.min for r in region.region])
    return found


def localize_accumulator(body: tirx.Stmt, site: StreamKSite) -> tirx.Stmt:
    """``body`` with every access to the accumulator shifted by its band offset.

    Returns ``body`` unchanged when some accumulator index is not affine in the band variables,
    or when blocks disagree on the offset: shifting only some accesses would make blocks address
    different elements.
    """
    acc = site.accumulator
    band = [loop.loop_var for loop in site.band]
    shifts: dict[str, list] = {}

    # Exceptions do not cross the FFI callbacks of structural_map: gather the blocks first.
    realizes: list[SBlockRealize] = []
    structural_walk(body, (SBlockRealize, realizes.append))
    try:
        for realize in realizes:
            block = realize.block
            binding = dict(zip((iv.var for iv in block.iter_vars), realize.iter_values))
            per_access = [
                [_band_offset(e, binding, band) for e in idx] for idx in _accesses(block, acc)
            ]
            if not per_access:
                continue
            first = per_access[0]
            for other in per_access[1:]:
                for a, b in zip(first, other):
                    if (a is None) != (b is None) or (a is not None and not structural_equal(a, b)):
                        raise _NotAffine("accesses of one block disagree")
            shifts[block.name_hint] = first
    except _NotAffine:
        return body
    if not shifts:
        return body

    def shift(block: SBlock) -> SBlock:
        if block.name_hint not in shifts:
            return block
        offsets = shifts[block.name_hint]

        def moved(indices):
            return [e if s is None else e - s for e, s in zip(indices, offsets)]

        def on_load(load):
            if loaded_buffer(load).same_as(acc):
                return tirx.BufferLoad(acc, moved(load.indices))
            return load

        def on_store(store):
            if store.buffer.same_as(acc):
                return tirx.BufferStore(acc, store.value, moved(store.indices))
            return store

        def remap(stmt):
            if stmt is None:
                return None
            return structural_map(stmt, [(BufferLoadNode, on_load), (tirx.BufferStore, on_store)])

        def regions(regs):
            out = []
            for region in regs:
                if loaded_buffer(region).same_as(acc):
                    ranges = [
                        r if s is None else tvm.ir.Range.from_min_extent(r.min - s, r.extent)
                        for r, s in zip(region.region, offsets)
                    ]
                    region = tirx.BufferRegion(acc, ranges)
                out.append(region)
            return out

        return replace_block(
            block,
            body=remap(block.body),
            init=remap(block.init),
            reads=regions(block.reads),
            writes=regions(block.writes),
        )

    return structural_map(body, (SBlock, shift))

"""Grouped reductions as batched GEMMs: the output-channel axis split into (group, channel).

A grouped convolution reads input channel ``f // (O/G) * (C/G) + c`` for output channel ``f``:
the one axis ``f`` indexes the output, the weight and the input, so dlight's ``gpu.Matmul``
normalisation (``C[S, I, J] += A[S, I, K] * B[S, J, K]``) takes it for a batch axis, finds no J
axis and declines. Splitting ``f`` into ``g = f // (O/G)`` and ``j = f % (O/G)`` makes ``g`` the
batch axis (it indexes all three buffers) and ``j`` the J axis (output and weight only): a
grouped convolution is a batched implicit GEMM over its groups, which dlight's matmul schedule
and Stream-K take as any batched GEMM.

:func:`split_group_axis` finds such an axis and returns the function with it split, or ``None``
when the function has none. A depthwise convolution (one or a few output channels per group) is
left to :class:`~tvm_streamk.dlight.StreamKDepthwise`: as a GEMM its J axis would be padding.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .._compat import (
    BufferLoadNode,
    SBlock,
    SBlockRealize,
    arith,
    dtype_of,
    loaded_buffer,
    param_buffers,
    replace_block,
    structural_map,
    structural_walk,
)
from ..analysis import is_reduction

# Fewer output channels per group than this (a depthwise convolution with a channel multiplier)
# would leave dlight's 64-wide J tile mostly padding: StreamKDepthwise takes those instead.
MIN_GROUP_COLUMNS = 16


class GroupAxisRefused(ValueError):
    """A grouped reduction :func:`split_group_axis` recognises but cannot hand to dlight."""


def split_group_axis(
    func: tirx.PrimFunc, min_columns: int = MIN_GROUP_COLUMNS
) -> tirx.PrimFunc | None:
    """``func`` with its grouped output-channel axis split into (group, channel in group).

    The function qualifies when:

    1. exactly one block reduces, and its loops are a perfect nest that binds each of its
       iteration variables to one loop, outermost first, as TE writes it;
    2. one spatial iteration variable ``f`` of extent ``O`` indexes the written buffer and is
       read as ``f // d`` with a constant ``d < O`` dividing ``O`` (``d = O/G``), and
       ``d >= min_columns`` (by default :data:`MIN_GROUP_COLUMNS`: for dlight's 64-wide J tile
       fewer columns per group would be a mostly padded GEMM).

    Returns
    -------
    tirx.PrimFunc or None
        The function computing the same values with ``f`` replaced by ``g * d + j`` (``g`` of
        extent ``O/d``, ``j`` of extent ``d``) and the indices simplified, or ``None``.

    A fused epilogue reading the output elementwise (bias, ReLU, residual add) has its channel
    axis split the same way.

    Raises
    ------
    GroupAxisRefused
        When the grouped reduction's output is indexed, or read by an epilogue, in a way the
        split cannot follow (the message names the block).
    """
    found = _reduction_nest(func)
    if found is None:
        return None
    loops, realize = found
    split = _group_axis(realize.block, min_columns)
    if split is None:
        return None
    axis, per_group = split
    channel = _written_dim(realize.block, axis.var)
    produced = loaded_buffer(realize.block.writes[0])
    consumers = _consumers(func, produced)
    func = _split_nest(func, loops, realize, axis, per_group)
    # A fused epilogue (bias, ReLU, residual) is split the same way: dlight inlines it into the
    # padded write-back, whose guard comes from the epilogue's own domain. Over the whole channel
    # axis that guard bounds g * d + j by O only, and a group's padded columns would overwrite
    # the next group's channels (PoCL: relative error 0.8 at every policy, data-parallel too).
    # The intermediate buffers between them get the split as two dimensions, so that the inline
    # maps (group, channel) to (group, channel) rather than through the flat channel index.
    for name, _ in consumers:
        nest = _nest_of(func, name)
        axis = _iter_var_at(nest[1].block, channel)
        func = _split_nest(func, *nest, axis, per_group)
    params = param_buffers(func)
    for buffer in [produced] + [written for _, written in consumers]:
        if not any(buffer.same_as(p) for p in params):
            func = _split_buffer_dim(func, buffer, channel, per_group)
    return func


def _split_buffer_dim(func: tirx.PrimFunc, buffer, dim: int, per_group: int) -> tirx.PrimFunc:
    """``func`` with dimension ``dim`` of the intermediate ``buffer`` split into ``(O/d, d)``:
    index ``c`` becomes ``(c // d, c % d)``, simplified within each block's iteration domain."""
    shape = list(buffer.shape)
    extent = shape[dim]
    dtype = dtype_of(extent)
    d = tirx.const(per_group, dtype)
    shape[dim : dim + 1] = [tirx.const(int(extent) // per_group, dtype), d]
    split = tirx.decl_buffer(shape, buffer.dtype, buffer.name, scope=buffer.scope())

    def rewrite_block(block: SBlock) -> SBlock:
        analyzer = arith.Analyzer()
        for iv in block.iter_vars:
            analyzer.bind(iv.var, iv.dom)

        def indices(old):
            old = list(old)
            c = old[dim]
            old[dim : dim + 1] = [analyzer.simplify(c // d), analyzer.simplify(c % d)]
            return old

        def load(ld):
            if not loaded_buffer(ld).same_as(buffer):
                return ld
            return tirx.BufferLoad(split, indices(ld.indices))

        def store(st):
            if not st.buffer.same_as(buffer):
                return st
            return tirx.BufferStore(split, st.value, indices(st.indices))

        def region(reg):
            if not loaded_buffer(reg).same_as(buffer):
                return reg
            ranges = list(reg.region)
            c = ranges[dim].min
            lo, hi = analyzer.simplify(c // d), analyzer.simplify(c % d)
            if not analyzer.can_prove_equal(ranges[dim].extent, 1):
                raise GroupAxisRefused(
                    f"block {block.name_hint!r} reads a range of channels of "
                    f"{buffer.name!r}; only elementwise epilogues can be split into groups"
                )
            one = tirx.const(1, dtype)
            ranges[dim : dim + 1] = [
                tvm.ir.Range.from_min_extent(lo, one),
                tvm.ir.Range.from_min_extent(hi, one),
            ]
            return tirx.BufferRegion(split, ranges)

        def access(stmt):
            return structural_map(stmt, [(BufferLoadNode, load), (tirx.BufferStore, store)])

        return replace_block(
            block,
            reads=[region(r) for r in block.reads],
            writes=[region(w) for w in block.writes],
            body=access(block.body),
            init=None if block.init is None else access(block.init),
            alloc_buffers=[split if a.same_as(buffer) else a for a in block.alloc_buffers],
        )

    return func.with_body(structural_map(func.body, (SBlock, rewrite_block)))


def _split_nest(func, loops, realize, axis, per_group: int) -> tirx.PrimFunc:
    """``func`` with ``axis`` of the block of ``realize`` (under ``loops``) split into
    ``(extent/d, d)``, its indices simplified under the new ranges."""
    index = list(realize.block.iter_vars).index(axis)
    loop = loops[index]
    groups = int(axis.dom.extent) // per_group
    dtype = dtype_of(axis.var)
    g, j = (tirx.Var(f"{axis.var.name}_{s}", dtype) for s in ("g", "j"))
    lg, lj = (tirx.Var(f"{loop.loop_var.name}_{s}", dtype) for s in ("g", "j"))
    analyzer = arith.Analyzer()
    for v, extent in ((g, groups), (j, per_group)):
        analyzer.bind(v, tvm.ir.Range(tirx.const(0, dtype), tirx.const(extent, dtype)))
    fused = g * tirx.const(per_group, dtype) + j

    def substituted(node):
        return structural_map(node, (tirx.Var, lambda v: fused if v.same_as(axis.var) else v))

    def rewrite(stmt):
        return _simplified(substituted(stmt), analyzer)

    def rewrite_region(region):
        ranges = [
            tvm.ir.Range.from_min_extent(
                analyzer.simplify(substituted(r.min)), analyzer.simplify(substituted(r.extent))
            )
            for r in region.region
        ]
        return tirx.BufferRegion(loaded_buffer(region), ranges)

    block = realize.block
    iter_vars = list(block.iter_vars)
    iter_vars[index : index + 1] = [
        tirx.IterVar(tvm.ir.Range(tirx.const(0, dtype), tirx.const(n, dtype)), v, 0)
        for v, n in ((g, groups), (j, per_group))
    ]
    new_block = SBlock(
        iter_vars,
        [rewrite_region(r) for r in block.reads],
        [rewrite_region(w) for w in block.writes],
        block.name_hint,
        rewrite(block.body),
        None if block.init is None else rewrite(block.init),
        block.alloc_buffers,
        block.match_buffers,
        block.annotations,
    )
    values = list(realize.iter_values)
    values[index : index + 1] = [lg, lj]
    body = SBlockRealize(values, realize.predicate, new_block)
    for position in range(len(loops) - 1, -1, -1):
        old = loops[position]
        if position == index:
            body = tirx.For(lj, tirx.const(0, dtype), tirx.const(per_group, dtype), old.kind, body)
            body = tirx.For(lg, tirx.const(0, dtype), tirx.const(groups, dtype), old.kind, body)
        else:
            body = tirx.For(old.loop_var, old.min, old.extent, old.kind, body)
    outer = loops[0]
    return func.with_body(
        structural_map(func.body, (tirx.For, lambda f: body if f.same_as(outer) else f))
    )


def _written_dim(block: SBlock, var) -> int:
    """The dimension of the block's written buffer that ``var`` indexes alone."""
    dims = [i for i, r in enumerate(block.writes[0].region) if r.min.same_as(var)]
    if len(dims) != 1:
        raise GroupAxisRefused(
            f"block {block.name_hint!r} writes its grouped channel axis {var.name!r} through "
            "an index expression; only a plain channel index can be split into groups"
        )
    return dims[0]


def _iter_var_at(block: SBlock, dim: int):
    """The iteration variable that indexes dimension ``dim`` of the block's write alone."""
    index = block.writes[0].region[dim].min
    for iv in block.iter_vars:
        if iv.var.same_as(index):
            return iv
    raise GroupAxisRefused(
        f"epilogue block {block.name_hint!r} writes channel index {index} rather than one "
        "iteration variable; only an elementwise epilogue can be split into groups"
    )


def _consumers(func: tirx.PrimFunc, produced) -> list[tuple[str, tirx.Buffer]]:
    """The blocks that read ``produced`` or a buffer they write, transitively, in program
    order, with the buffer each one writes; each must be elementwise over the convolution's
    output shape."""
    tainted = [produced]
    found = []

    def visit(block: SBlock) -> None:
        if not block.writes or block.name_hint == "root":
            return
        if not any(loaded_buffer(r).same_as(t) for r in block.reads for t in tainted):
            return
        out = loaded_buffer(block.writes[0])
        if len(block.writes) != 1 or list(map(str, out.shape)) != list(map(str, produced.shape)):
            raise GroupAxisRefused(
                f"epilogue block {block.name_hint!r} of the grouped convolution does not write "
                f"one buffer shaped like its output {list(produced.shape)}; only elementwise "
                "epilogues can be split into groups"
            )
        tainted.append(out)
        found.append((block.name_hint, out))

    blocks = []
    structural_walk(func.body, (SBlock, blocks.append))
    # structural_walk visits a block's children first; the producers of a TE function are
    # sibling blocks under root, visited in program order.
    for block in blocks:
        visit(block)
    return found


def _nest_of(func: tirx.PrimFunc, name: str):
    """The loops (outermost first) and realize of block ``name``, when TE-shaped."""
    found = _nests(func, lambda b: b.name_hint == name)
    if len(found) != 1:
        raise GroupAxisRefused(
            f"epilogue block {name!r} of the grouped convolution is not a perfect loop nest "
            "binding one loop to each iteration variable"
        )
    return found[0]


def _reduction_nest(func: tirx.PrimFunc):
    """The loops (outermost first) and realize of the one reducing block, when TE-shaped."""
    reducing = []
    structural_walk(func.body, (SBlock, lambda b: reducing.append(b) if is_reduction(b) else None))
    if len(reducing) != 1:
        return None
    found = _nests(func, lambda b: b.same_as(reducing[0]))
    return found[0] if len(found) == 1 else None


def _nests(func: tirx.PrimFunc, wanted) -> list:
    """``(loops, realize)`` of each block ``wanted`` accepts whose loops are a perfect nest
    binding one loop to each iteration variable, outermost first (as TE writes them)."""
    chains: dict = {}

    def visit(loop: tirx.For) -> None:
        chain, stmt = [loop], loop.body
        while isinstance(stmt, tirx.For):
            chain.append(stmt)
            stmt = stmt.body
        if isinstance(stmt, SBlockRealize) and wanted(stmt.block):
            # Every suffix of a nest is visited too; keep the longest.
            known = chains.get(stmt.block.name_hint)
            if known is None or len(known[0]) < len(chain):
                chains[stmt.block.name_hint] = (chain, stmt)

    structural_walk(func.body, (tirx.For, visit))
    return [
        (loops, realize)
        for loops, realize in chains.values()
        if len(loops) == len(realize.iter_values)
        and all(v.same_as(loop.loop_var) for v, loop in zip(realize.iter_values, loops))
    ]


def _group_axis(block: SBlock, min_columns: int):
    """The spatial iteration variable read as ``f // d``, and ``d``; ``None`` when none is."""
    spatial = {iv.var: iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    written = set()
    for region in block.writes:
        for r in region.region:
            structural_walk(r.min, (tirx.Var, lambda v: written.add(v)))
    divisors: dict = {}

    def visit(div: tirx.FloorDiv) -> None:
        if isinstance(div.a, tirx.Var) and isinstance(div.b, tirx.IntImm) and div.a in spatial:
            divisors.setdefault(div.a, set()).add(int(div.b.value))

    for region in block.reads:
        for r in region.region:
            structural_walk(r.min, (tirx.FloorDiv, visit))
    found = []
    for v, ds in divisors.items():
        extent = spatial[v].dom.extent
        if v not in written or len(ds) != 1 or not isinstance(extent, tirx.IntImm):
            continue
        (d,) = ds
        if min_columns <= d < int(extent) and int(extent) % d == 0:
            found.append((spatial[v], d))
    return found[0] if len(found) == 1 else None


def _simplified(stmt, analyzer):
    """``stmt`` with every buffer index simplified under the split's ranges."""

    def load(ld):
        return tirx.BufferLoad(loaded_buffer(ld), [analyzer.simplify(i) for i in ld.indices])

    def store(st):
        return tirx.BufferStore(st.buffer, st.value, [analyzer.simplify(i) for i in st.indices])

    return structural_map(stmt, [(BufferLoadNode, load), (tirx.BufferStore, store)])

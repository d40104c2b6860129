"""The analysis of a tiled GPU reduction: the parts of it that Stream-K rewrites.

A kernel qualifies when its reduction block sits under a band of ``blockIdx``-bound loops (one
output tile per block), reduces over a serial *panel loop* inside that band into an accumulator in
registers (or tensor-core fragments, :mod:`.tensor_core`), and a write-back after the panel loop
moves the accumulator to global memory. The analysis locates all of that from the IR itself
(bindings, scopes, data flow), never from names, and reports each unmet condition as a
:class:`~tvm_streamk.errors.StreamKError`. Pure: never mutates IR.
"""

from __future__ import annotations

from tvm import tirx

from .._compat import (
    BufferLoadNode,
    SBlock,
    SBlockRealize,
    loaded_buffer,
    structural_equal,
)
from ..errors import StreamKError
from .blocks import (
    blockized_parent,
    blocks_under,
    find_block_path,
    function_of,
    is_reduction,
    is_zero,
    reads,
    uses_var,
    writes,
)
from .ragged import RAGGED_SCOPE, ragged_reduction, ragged_space
from .site import (
    COND_ACCUMULATOR,
    COND_BAND,
    COND_BLOCK,
    COND_PANEL,
    COND_REDUCTION,
    COND_RUNTIME_TILES,
    COND_WRITEBACK,
    FRAGMENT_SCOPES,
    REGISTER_SCOPES,
    StreamKSite,
    WriteBack,
)
from .tensor_core import fragment_update, staging, zero_fill


def _is_zero_init(block: SBlock, acc: tirx.Buffer) -> bool:
    body = block.body
    if isinstance(body, tirx.BufferStore):
        return is_zero(body.value)
    if acc.scope() in FRAGMENT_SCOPES:
        return zero_fill(body, acc)
    return False


def _check_add_update(block: SBlock) -> tirx.Buffer:
    """The block must be ``acc[idx] = acc[idx] + rhs`` (either order) over one written buffer."""
    fragment = fragment_update(block)
    if fragment is not None:
        if block.init is not None and not zero_fill(block.init, fragment):
            raise StreamKError(
                COND_REDUCTION,
                f"block {block.name_hint!r} initialises {fragment.name} with `{block.init}`",
                "A split reduction needs the Add identity (0) as its initial value.",
            )
        return fragment
    body = block.body
    if len(block.writes) != 1 or not isinstance(body, tirx.BufferStore):
        raise StreamKError(
            COND_REDUCTION,
            f"block {block.name_hint!r} writes {len(block.writes)} buffers with a "
            f"{type(body).__name__} body",
            "Stream-K rewrites a block whose body is one store `acc[i] = acc[i] + x`.",
        )
    acc = body.buffer
    value = body.value

    def is_self_load(e) -> bool:
        return (
            isinstance(e, BufferLoadNode)
            and loaded_buffer(e).same_as(acc)
            and len(e.indices) == len(body.indices)
            and all(structural_equal(a, b) for a, b in zip(e.indices, body.indices))
        )

    if not (isinstance(value, tirx.Add) and (is_self_load(value.a) or is_self_load(value.b))):
        raise StreamKError(
            COND_REDUCTION,
            f"block {block.name_hint!r} updates {acc.name} with `{value}`",
            "Only associative Add reductions (acc = acc + x) can be split across blocks; "
            "schedule other reductions data-parallel.",
        )
    if block.init is not None and not (
        isinstance(block.init, tirx.BufferStore) and is_zero(block.init.value)
    ):
        raise StreamKError(
            COND_REDUCTION,
            f"block {block.name_hint!r} initialises {acc.name} with `{block.init}`",
            "A split reduction needs the Add identity (0) as its initial value.",
        )
    return acc


def analyze(func: tirx.PrimFunc, block_name: str) -> StreamKSite:
    """Locate the tile band, panel loop, accumulator, init and write-back of ``block_name``.

    Raises
    ------
    StreamKError
        Naming the first unmet precondition.
    """
    path = find_block_path(func, block_name)
    realize: SBlockRealize = path[-1]
    block = realize.block
    _check_not_inside_a_reduction(path)
    acc = _check_add_update(block)

    reduce_vars = [
        value
        for iv, value in zip(block.iter_vars, realize.iter_values)
        if iv.iter_type == tirx.IterVar.CommReduce
    ]
    if not reduce_vars:
        raise StreamKError(
            COND_BLOCK,
            f"block {block.name_hint!r} has no reduction axis",
            "Pass the reduction (update) block of the GEMM-like kernel.",
        )
    spatial_values = [
        value
        for iv, value in zip(block.iter_vars, realize.iter_values)
        if iv.iter_type != tirx.IterVar.CommReduce
    ]

    loops = [s for s in path if isinstance(s, tirx.For)]
    band = _tile_band(path, block, loops, reduce_vars)
    panel = _panel_loop(block, loops[len(band) :], reduce_vars, spatial_values)
    chain = _panel_chain(panel, loops[len(band) :], reduce_vars)

    scope = acc.scope()
    if scope not in REGISTER_SCOPES + FRAGMENT_SCOPES:
        raise StreamKError(
            COND_ACCUMULATOR,
            f"block {block.name_hint!r} accumulates into {acc.name} in scope {scope!r}",
            "Accumulate in registers: `sch.cache_write(block, 0, 'local')` and "
            "`sch.reverse_compute_at` it under the thread loops.",
        )

    band_body = band[-1].body
    in_panel = {b.name_hint for b in blocks_under(panel)}
    # Blocks inside the update, its T.init included (a blockized update's init is a block).
    nested = {
        b.name_hint
        for part in (block.body, block.init)
        if part is not None
        for b in blocks_under(part)
    }
    init_block = None
    stage = None
    readers = []
    for other in blocks_under(band_body):
        if other.same_as(block) or other.name_hint in nested:
            continue
        if writes(other, acc) and other.name_hint not in in_panel:
            if not _is_zero_init(other, acc):
                raise StreamKError(
                    COND_REDUCTION,
                    f"block {other.name_hint!r} initialises {acc.name} with `{other.body}`",
                    "A split reduction needs the Add identity (0) as its initial value.",
                )
            init_block = other
            nested |= {b.name_hint for b in blocks_under(other.body)}
        elif writes(other, acc):
            raise StreamKError(
                COND_REDUCTION,
                f"block {other.name_hint!r} also writes the accumulator {acc.name} inside the "
                "panel loop",
                "Keep a single update block per accumulator.",
            )
        elif reads(other, acc):
            if other.name_hint in in_panel:
                raise StreamKError(
                    COND_WRITEBACK,
                    f"block {other.name_hint!r} reads the accumulator inside the panel loop",
                    "Read the accumulator only after the reduction.",
                )
            if acc.scope() in FRAGMENT_SCOPES:
                stage = staging(other, acc)
                nested |= {b.name_hint for b in blocks_under(other.body)}
            else:
                readers.append(other)
        elif stage is not None and reads(other, stage):
            readers.append(other)
    if acc.scope() in FRAGMENT_SCOPES and stage is None:
        raise StreamKError(
            COND_WRITEBACK,
            f"no block stores the fragment accumulator {acc.name} to shared memory",
            "Stage the fragments in shared memory before the global write-back.",
        )
    writebacks = [_writeback(r, stage if stage is not None else acc) for r in readers]
    if block.init is None and init_block is None:
        raise StreamKError(
            COND_REDUCTION,
            f"no block initialises the accumulator {acc.name} inside the tile band",
            "Use a block with T.init, or decompose_reduction at the panel loop.",
        )
    if not writebacks:
        raise StreamKError(
            COND_WRITEBACK,
            f"no block inside the tile band reads the accumulator {acc.name}",
            "Stage the accumulator in registers and write it back per tile (cache_write + "
            "reverse_compute_at under the thread loops).",
        )
    _check_accumulator_private(func, band, acc)
    realize_of = lambda b: find_block_path(func, b.name_hint)[-1]  # noqa: E731
    ragged = ragged_space(func, tuple(band), writebacks, realize_of) or ragged_reduction(
        func, tuple(band), panel, writebacks, realize_of
    )
    if not isinstance(panel.extent, tirx.IntImm) and not (ragged is not None and ragged.reduction):
        _refuse_panel_range(panel)
    return StreamKSite(
        block=block,
        band=tuple(band),
        panel_loop=panel,
        accumulator=acc,
        init_block=init_block,
        writebacks=tuple(writebacks),
        has_init=block.init is not None,
        stage=stage,
        panel_chain=chain,
        ragged=ragged,
        func=func,
    )


def analyze_block(mod, block: SBlock) -> StreamKSite:
    """:func:`analyze` ``block`` (the block an ``SBlockRV`` names) in the PrimFunc of ``mod``
    that holds that very block: names repeat across the functions of a module."""
    return analyze(function_of(mod, block), block.name_hint)


def first_site(func: tirx.PrimFunc) -> StreamKSite | None:
    """The first block of ``func``, in program order, that Stream-K accepts (None if none does).

    For schedules written by others (dlight, MetaSchedule), whose block names are theirs.
    """
    for block in blocks_under(func.body):
        if not is_reduction(block):
            continue  # analyze refuses it (no reduction axis), after a walk to find it
        try:
            return analyze(func, block.name_hint)
        except StreamKError:
            continue
    return None


def refusals(func: tirx.PrimFunc) -> dict[str, str]:
    """Why each reduction block of ``func`` is not a Stream-K site, by block name (the
    :class:`~tvm_streamk.errors.StreamKError` text; empty when ``func`` has no reduction)."""
    found = {}
    for block in blocks_under(func.body):
        if not is_reduction(block):
            continue
        try:
            analyze(func, block.name_hint)
        except StreamKError as err:
            found[block.name_hint] = str(err)
    return found


def _tile_band(path, block, loops, reduce_vars) -> list[tirx.For]:
    band: list[tirx.For] = []
    for loop in loops:
        binding = loop.thread_binding
        if binding is not None and binding.thread_tag.startswith("blockIdx"):
            band.append(loop)
        else:
            break
    if not band:
        found = (
            "no blockIdx-bound loop above it"
            if not any(
                lp.thread_binding is not None
                and lp.thread_binding.thread_tag.startswith("blockIdx")
                for lp in loops
            )
            else f"loop {loops[0].loop_var.name} ({_kind(loops[0])}) outside the blockIdx loops"
        )
        raise StreamKError(
            COND_BAND,
            f"block {block.name_hint!r} has {found}",
            "Bind the output-tile loops to blockIdx as the outermost loops of the kernel.",
        )
    for outer, inner in zip(band, band[1:]):
        if not outer.body.same_as(inner):
            raise StreamKError(
                COND_BAND,
                f"blockIdx loops {outer.loop_var.name} and {inner.loop_var.name} are not "
                "perfectly nested",
                "Keep the blockIdx loops directly nested.",
            )
    dynamic = [loop for loop in band if not isinstance(loop.extent, tirx.IntImm)]
    if len(dynamic) > 1:
        raise StreamKError(
            COND_RUNTIME_TILES,
            f"blockIdx loops {[lp.loop_var.name for lp in dynamic]} all have run-time extents "
            f"({', '.join(str(lp.extent) for lp in dynamic)})",
            "Stream-K takes one run-time tile extent (a dynamic M, or batch); specialise the "
            "others first.",
        )
    for loop in band:
        if any(uses_var(v, loop.loop_var) for v in reduce_vars):
            raise StreamKError(
                COND_BAND,
                f"blockIdx loop {loop.loop_var.name} indexes the reduction axis",
                "The blockIdx band must tile only spatial (output) axes; a block-split "
                "reduction (rfactor) is already a split-K.",
            )
    nested = [
        lp
        for lp in loops[len(band) :]
        if lp.thread_binding is not None and lp.thread_binding.thread_tag.startswith("blockIdx")
    ]
    if nested:
        raise StreamKError(
            COND_BAND,
            f"blockIdx loop {nested[0].loop_var.name} sits below non-blockIdx loops",
            "Bind the output-tile loops to blockIdx as the outermost loops of the kernel.",
        )
    return band


def _kind(loop: tirx.For) -> str:
    if loop.thread_binding is not None:
        return f"bound to {loop.thread_binding.thread_tag}"
    return str(tirx.ForKind(int(loop.kind)).name.lower())


def _check_not_inside_a_reduction(path) -> None:
    """Refuse the inner block of a blockized (tensorized) reduction: its parent is the one."""
    outer = blockized_parent(path)
    if outer is not None:
        name = path[-1].block.name_hint
        raise StreamKError(
            COND_BLOCK,
            f"block {name!r} is the inner block of the blockized reduction "
            f"{outer.name_hint!r} (a tensorized schedule)",
            f"Pass its blockized parent {outer.name_hint!r}.",
        )


def _refuse_panel_range(loop: tirx.For):
    raise StreamKError(
        COND_PANEL,
        f"the panel loop {loop.loop_var.name} runs over [{loop.min}, {loop.min} + {loop.extent})",
        "Stream-K needs a compile-time panel count starting at 0 (a run-time one only where "
        "the reduction reads ragged views: a grouped weight gradient): specialise K.",
    )


def _panel_loop(block, inner_loops, reduce_vars, spatial_values) -> tirx.For:
    for loop in inner_loops:
        if any(uses_var(v, loop.loop_var) for v in reduce_vars):
            if loop.thread_binding is not None or int(loop.kind) != int(tirx.ForKind.SERIAL):
                raise StreamKError(
                    COND_PANEL,
                    f"the outermost reduction loop {loop.loop_var.name} is {_kind(loop)}",
                    "Stream-K splits a serial K-panel loop; keep the outer reduction loop serial.",
                )
            if any(uses_var(v, loop.loop_var) for v in spatial_values):
                raise StreamKError(
                    COND_PANEL,
                    f"the panel loop {loop.loop_var.name} also indexes output axes",
                    "Split K into its own loop.",
                )
            if not is_zero(loop.min):
                _refuse_panel_range(loop)
            return loop
    raise StreamKError(
        COND_PANEL,
        f"no serial loop inside the tile band iterates the reduction of {block.name_hint!r}",
        "Split K into panels inside the blockIdx band (sch.split on the reduction loop).",
    )


def _panel_chain(panel: tirx.For, inner_loops, reduce_vars) -> tuple[tirx.For, ...]:
    """The panel loop and the loops of further reduction axes perfectly nested in it.

    A loop joins while it is the whole body of the previous one, is serial, and iterates a
    reduction axis none of the loops before it does; a loop over an axis already covered (the
    inner part of a split K, the micro-kernel) ends the chain. One loop for a GEMM; ``rh, rw,
    rc_0`` for a convolution whose reduction loops stay unfused, which Stream-K must split as
    one ``rh * rw * rc_0`` panel loop, never over ``rh`` alone.
    """

    def axes(loop: tirx.For) -> set[int]:
        return {i for i, v in enumerate(reduce_vars) if uses_var(v, loop.loop_var)}

    chain, covered = [panel], axes(panel)
    position = next(i for i, loop in enumerate(inner_loops) if loop.same_as(panel))
    for loop in inner_loops[position + 1 :]:
        new = axes(loop) - covered
        serial = loop.thread_binding is None and int(loop.kind) == int(tirx.ForKind.SERIAL)
        if not chain[-1].body.same_as(loop) or not new or not serial:
            break
        chain.append(loop)
        covered |= new
    return tuple(chain)


def _writeback(block: SBlock, acc: tirx.Buffer) -> WriteBack:
    reduced = [
        iv.var.name for iv in block.iter_vars if int(iv.iter_type) == int(tirx.IterVar.CommReduce)
    ]
    if reduced or block.init is not None:
        # dlight's gpu.Reduction (rfactor) reduces per-thread accumulators across threads after
        # the panel loop: a partial tile is then spread over the threads, and the rewritten
        # write-back would no longer lower to the cross-thread reduction (a race).
        raise StreamKError(
            COND_WRITEBACK,
            f"write-back block {block.name_hint!r} is itself a reduction (over {reduced}) of "
            "the accumulator after the panel loop, such as a cross-thread reduction of rfactor "
            "partials",
            "Stream-K merges whole accumulator tiles: schedule the reduction with one "
            "accumulator per output element (dlight's gpu.Matmul), or leave it data-parallel.",
        )
    body = block.body
    if not isinstance(body, tirx.BufferStore) or len(block.writes) != 1:
        raise StreamKError(
            COND_WRITEBACK,
            f"write-back block {block.name_hint!r} has a {type(body).__name__} body",
            "The write-back must be one store of the tile to a global buffer.",
        )
    out = body.buffer
    if out.scope() not in ("global", RAGGED_SCOPE):
        raise StreamKError(
            COND_WRITEBACK,
            f"write-back block {block.name_hint!r} stores to {out.name} in scope {out.scope()!r}",
            "The accumulator must be written back to global memory.",
        )
    plain = (
        isinstance(body.value, BufferLoadNode)
        and loaded_buffer(body.value).same_as(acc)
        and str(out.dtype) == str(acc.dtype)
    )
    return WriteBack(block=block, output=out, plain_copy=plain)


def _check_accumulator_private(func, band, acc) -> None:
    """The accumulator must be used only inside the tile band (it is rebuilt per segment)."""
    outside = [
        b
        for b in blocks_under(func.body)
        if b.name_hint != "root"
        and (reads(b, acc) or writes(b, acc))
        and b.name_hint not in {x.name_hint for x in blocks_under(band[0])}
    ]
    if outside:
        raise StreamKError(
            COND_ACCUMULATOR,
            f"block {outside[0].name_hint!r} uses the accumulator {acc.name} outside the tile band",
            "Keep the accumulator private to the kernel's tile loop.",
        )

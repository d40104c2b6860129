"""The project's GPU schedules: the canonical data-parallel nest that Stream-K rewrites.

One output tile of ``bm x bn`` per ``blockIdx``, a ``tm x tn`` register tile per thread, the K loop
split into panels of ``bk`` whose A/B slices are cooperatively staged in shared memory, and the
reduction decomposed at the panel loop so the accumulator is zeroed once per tile:
:func:`reference_schedule` for a GEMM, :func:`implicit_gemm_schedule` for a convolution (or any
matmul-like reduction) normalised to one first.
"""

from __future__ import annotations

import tvm

from .._compat import Schedule, ScheduleError, dlight
from ..analysis import gemm_axes, is_reduction
from ..transform.group_axis import GroupAxisRefused, split_group_axis
from .errors import WorkloadError


def reference_schedule(
    func: tvm.tirx.PrimFunc,
    *,
    bm: int = 32,
    bn: int = 32,
    bk: int = 8,
    tm: int = 4,
    tn: int = 4,
    block: str = "C",
) -> Schedule:
    """Schedule a GEMM built by :func:`gemm` as the canonical data-parallel GPU kernel.

    The nest is ``blockIdx.y x blockIdx.x`` over (bm x bn) output tiles (a leading batch axis gets
    ``blockIdx.z``), ``threadIdx.y x threadIdx.x`` over a (bm/tm x bn/tn) thread grid holding a
    (tm x tn) accumulator in ``local`` memory, and a K loop of panels of ``bk`` with A and B panels
    staged in ``shared`` memory by all threads. A fused epilogue block (``"D"``) becomes the
    accumulator's write-back. Shapes that are not tile multiples are predicated.
    """
    _check_tiles(bm=bm, bn=bn, tm=tm, tn=tn)
    sch = Schedule(func)
    blk = sch.get_sblock(block)
    loops = sch.get_loops(blk)
    if len(loops) not in (3, 4):
        raise WorkloadError(
            f"reference_schedule expects a GEMM block with 3 or 4 loops (b, i, j, "
            f"k); found {len(loops)} loops on block {block!r}"
        )
    ko, tj, depth = _tile(sch, blk, loops, bm=bm, bn=bn, bk=bk, tm=tm, tn=tn)

    consumers = sch.get_consumers(blk)
    if consumers:
        # A fused epilogue block reads the accumulator: keep the accumulator in registers and make
        # the epilogue block itself each thread's write-back.
        (epi,) = consumers
        sch.set_scope(blk, 0, "local")
        sch.reverse_compute_at(epi, tj)
    else:
        acc = sch.cache_write(blk, 0, "local")
        sch.reverse_compute_at(acc, tj)

    _stage_panels(sch, blk, ko, depth, threads=(bm // tm, bn // tn))
    return sch


def implicit_gemm_schedule(
    func: tvm.tirx.PrimFunc,
    *,
    bm: int = 64,
    bn: int = 64,
    bk: int = 16,
    tm: int = 4,
    tn: int = 4,
) -> Schedule:
    """Schedule a convolution (or another matmul-like reduction) as an implicit GEMM.

    Step 0. A grouped convolution's output-channel axis is split into (group, channel in
    group) (:mod:`tvm_streamk.transform.group_axis`), so the groups are a batch axis.
    Step 1. Normalise the reduction block to ``C[S, I, J] += A[S, I, K] * B[S, J, K]``: its
    operands and output are reindexed (``reindex``) and its iteration space fused into the GEMM
    axes (``transform_block_layout``, with dlight's index maps). For a convolution ``I`` runs
    over the batch and the output positions (``N*P*Q``), ``J`` over the output channels and
    ``K`` over the input channels and the kernel window (``C*R*S``), one reduction axis.
    Step 2. Tile it as :func:`reference_schedule` tiles a GEMM.
    Step 3. Im2col on the fly: the gather of A (the reindex of the padded input) and the padding
    are inlined into the copy of each K-panel into shared memory, so no im2col matrix exists;
    the same for B (the weight reordered to ``J x K``).
    Step 4. The accumulator stays in registers; the reindex back to the output layout and any
    elementwise epilogue (bias, ReLU, a residual add) are inlined into its write-back.

    The schedule requires:

    1. one reduction block of the form ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` once a grouped
       convolution's output-channel axis is split into (group, channel in group)
       (:mod:`tvm_streamk.transform.group_axis`, for any number of channels per group): every
       axis of extent above 1 is a batch (in all three), I (in A and C), J (in B and C) or K
       (in A and B) axis; I, J or K may be absent (one output position, one output channel per
       group, a 1x1 kernel over one input channel), and is then one wide. A depthwise
       convolution is accepted too, as the batched GEMM over its channels whose J is the
       channel multiplier: correct, mostly padding (``relax_pipeline`` gives it to
       ``StreamKDepthwise``);
    2. every producer of the operands (the padding) and every consumer of the output to be
       elementwise or injective, so that they inline.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        The kernel, e.g. :func:`tvm_streamk.workloads.conv`.
    bm, bn, bk, tm, tn : int
        The tile (``bm x bn`` outputs, panels of ``bk``) and each thread's register tile.

    Returns
    -------
    tvm.s_tir.Schedule
        The data-parallel kernel. Its update block keeps the name of the reduction block
        followed by ``_update`` (:func:`tvm_streamk.analysis.first_site` finds it).

    Raises
    ------
    WorkloadError
        Naming the block that breaks a requirement.

    Examples
    --------
    >>> func = conv(data_shape=(2, 21, 19, 8), weight_shape=(3, 3, 8, 7), stride=2, padding=1)
    >>> sch = implicit_gemm_schedule(func)
    >>> sch.stream_k("conv2d_nhwc_update", num_sms=4, fixup="workspace")
    """
    _check_tiles(bm=bm, bn=bn, tm=tm, tn=tn)
    # A grouped convolution becomes the batched GEMM over its groups (None: not grouped).
    try:
        sch = Schedule(split_group_axis(func, min_columns=1) or func)
    except GroupAxisRefused as err:
        raise WorkloadError(f"a grouped convolution the group split refuses: {err}") from None
    blk = _the_reduction(sch)
    name = sch.get(blk).name_hint

    # Step 1. Normalise to C[S, I, J] += A[S, I, K] * B[S, J, K].
    block = sch.get(blk)
    if len(block.reads) != 2 or len(block.writes) != 1:
        raise WorkloadError(
            f"block {name!r} is not of the form C[S, I, J] += A[S, I, K] * B[S, J, K]: it reads "
            f"{len(block.reads)} buffer(s) and writes {len(block.writes)}, where a GEMM reads "
            "two and writes one; schedule it another way (dlight's rules, or the project's "
            "StreamKGEMV and StreamKDepthwise)"
        )
    operands = [sch.reindex(blk, ("read", 0)), sch.reindex(blk, ("read", 1))]
    output = sch.reindex(blk, ("write", 0))
    index_maps = gemm_index_maps(sch.get(blk))
    if index_maps is None:
        raise WorkloadError(
            f"block {name!r} is not of the form C[S, I, J] += A[S, I, K] * B[S, J, K]: an axis "
            "of it indexes neither two operands and the output (a batch), A and C (I), B and C "
            "(J), nor the two operands and not C (K); schedule it another way (dlight's rules, "
            "or the project's StreamKGEMV and StreamKDepthwise)"
        )
    block_map, a_map, b_map, c_map = index_maps
    sch.transform_layout(operands[0], ("write", 0), a_map)
    sch.transform_layout(operands[1], ("write", 0), b_map)
    sch.transform_layout(output, ("read", 0), c_map)
    sch.transform_block_layout(blk, block_map)

    # Step 2. Tile. An I or J one wide gets tiles one wide: with several threads along it, TVM
    # drops the axis from the write-back's guard, and threads holding no row would store too.
    _, i_extent, j_extent, _ = (int(iv.dom.extent) for iv in sch.get(blk).iter_vars[-4:])
    if i_extent == 1:
        bm = tm = 1
    if j_extent == 1:
        bn = tn = 1
    ko, tj, depth = _tile(sch, blk, sch.get_loops(blk), bm=bm, bn=bn, bk=bk, tm=tm, tn=tn)

    # Step 4 (before 3, which decomposes the reduction). Registers, then one write-back.
    write_back = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(write_back, tj)
    _inline_consumers(sch, write_back)

    # Step 3. Im2col on the fly.
    producers = [[op, *_producer_chain(sch, op)] for op in operands]
    _stage_panels(sch, blk, ko, depth, threads=(bm // tm, bn // tn), inline=producers)
    return sch


def gemm_index_maps(block) -> tuple | None:
    """The index maps normalising ``block`` to ``C[S, I, J] += A[S, I, K] * B[S, J, K]``
    (dlight's, in dlight's order: the block's, A's, B's, C's), or None.

    dlight's own :func:`get_index_map` requires an I, a J and a K axis of extent above 1;
    here an absent one becomes an axis of extent 1 (dlight's fusion maps give a missing kind
    the constant 0), so a convolution with one output position, one output channel per group
    or a one-element reduction is a GEMM too. The axes' roles are
    :func:`tvm_streamk.analysis.gemm_axes`'s.
    """
    found = dlight.gpu.matmul.get_index_map(block)
    if found is not None:
        return found
    axes = gemm_axes(block)
    if axes is None:
        return None
    matmul = dlight.gpu.matmul
    kind = matmul.IterKind
    s, i, j, k = kind.kIter_S, kind.kIter_I, kind.kIter_J, kind.kIter_K
    kinds = {"batch": s, "i": i, "j": j, "k": k, "unit": kind.kIter_T}
    order = [iv.var for iv in block.iter_vars]
    traits = {
        iv.var: matmul.IterTrait(kinds[axes.role(iv.var)], iv.dom.extent) for iv in block.iter_vars
    }

    def fused(used, into):
        return matmul.make_iter_fusion_index_map([traits[v] for v in order if v in used], into)

    return (
        fused(set(order), [s, i, j, k]),
        fused(axes.used_by(0), [s, i, k]),
        fused(axes.used_by(1), [s, j, k]),
        fused(axes.used_by(2), [s, i, j]),
    )


def _the_reduction(sch: Schedule):
    reductions = [
        b for b in sch.get_child_blocks(sch.get_sblock("root")) if is_reduction(sch.get(b))
    ]
    if len(reductions) != 1:
        names = [sch.get(b).name_hint for b in reductions]
        raise WorkloadError(
            f"implicit_gemm_schedule needs exactly one reduction block; found {names}"
        )
    return reductions[0]


def _producer_chain(sch: Schedule, block) -> list:
    """The producers feeding ``block`` one after the other (the padding before a gather),
    nearest first; stops where a block has several producers or none."""
    chain = []
    producers = sch.get_producers(block)
    while len(producers) == 1:
        chain.append(producers[0])
        producers = sch.get_producers(producers[0])
    return chain


def _inline_consumers(sch: Schedule, write_back) -> None:
    """Inline the chain of blocks after ``write_back`` into it (the reindex to the output
    layout, then elementwise epilogues), so that it stores the function's output."""
    consumers = sch.get_consumers(write_back)
    while consumers:
        if len(consumers) != 1:
            names = [sch.get(c).name_hint for c in consumers]
            raise WorkloadError(
                f"the accumulator's write-back feeds several blocks {names}: "
                "implicit_gemm_schedule fuses one elementwise epilogue chain"
            )
        name = sch.get(consumers[0]).name_hint
        try:
            sch.reverse_compute_inline(consumers[0])
        except ScheduleError as err:
            raise WorkloadError(
                f"block {name!r} after the reduction cannot be fused into its write-back "
                f"(reverse_compute_inline: {str(err).splitlines()[0]}): only elementwise "
                "epilogues fuse"
            ) from None
        consumers = sch.get_consumers(write_back)


def _check_tiles(*, bm: int, bn: int, tm: int, tn: int) -> None:
    if bm % tm or bn % tn:
        raise WorkloadError(
            f"bm must be a multiple of tm and bn of tn; found bm={bm} tm={tm} bn={bn} tn={tn}"
        )


def _tile(sch: Schedule, blk, loops, *, bm: int, bn: int, bk: int, tm: int, tn: int):
    """Tile the loops ``([b,] i, j, k)`` of ``blk``: (bm x bn) output tiles on ``blockIdx.y x
    blockIdx.x`` (a batch on ``blockIdx.z``), a (bm/tm x bn/tn) thread grid of (tm x tn)
    register tiles, and the K loop in panels of ``bk``. Returns the panel loop, the
    ``threadIdx.x`` loop and the depth of the panel loop (loops down to it, itself included)."""
    threads_y, threads_x = bm // tm, bn // tn
    batch_loop = loops[0] if len(loops) == 4 else None
    i, j, k = loops[-3:]
    bi, ti, ii = sch.split(i, [None, threads_y, tm])
    bj, tj, jj = sch.split(j, [None, threads_x, tn])
    ko, ki = sch.split(k, [None, bk])
    outer = ([batch_loop] if batch_loop is not None else []) + [bi, bj, ti, tj, ko]
    sch.reorder(*outer, ki, ii, jj)
    if batch_loop is not None:
        sch.bind(batch_loop, "blockIdx.z")
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")
    return ko, tj, len(outer)


def _stage_panels(sch: Schedule, blk, ko, depth: int, *, threads: tuple[int, int], inline=()):
    """Stage the A and B panels of each K-panel of ``blk`` in shared memory, copied by all the
    threads, and decompose the reduction at the panel loop. ``inline[i]`` lists the producers
    of operand ``i`` to inline into its copy, nearest first: the copy then computes them."""
    threads_y, threads_x = threads
    for idx in (0, 1):
        cr = sch.cache_read(blk, idx, "shared")
        sch.compute_at(cr, ko)
        for producer in inline[idx] if inline else ():
            sch.compute_inline(producer)
        # The copy's own loops are those below the panel loop it was computed at; a panel of
        # one element (M or N of 1 with K of 1) has none, and gets a unit loop to split.
        copy_loops = sch.get_loops(cr)[depth:] or [sch.add_unit_loop(cr)]
        fused = sch.fuse(*copy_loops)
        _, ty, tx = sch.split(fused, [None, threads_y, threads_x])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
    sch.decompose_reduction(blk, ko)

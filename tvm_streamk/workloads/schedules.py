"""The reference GPU schedule: the canonical data-parallel nest that Stream-K rewrites.

One output tile of ``bm x bn`` per ``blockIdx``, a ``tm x tn`` register tile per thread, the K loop
split into panels of ``bk`` whose A/B slices are cooperatively staged in shared memory, and the
reduction decomposed at the panel loop so the accumulator is zeroed once per tile.
"""

from __future__ import annotations

import tvm

from .._compat import Schedule
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
    if bm % tm or bn % tn:
        raise WorkloadError(
            f"bm must be a multiple of tm and bn of tn; found bm={bm} tm={tm} bn={bn} tn={tn}"
        )
    threads_y, threads_x = bm // tm, bn // tn
    sch = Schedule(func)
    blk = sch.get_sblock(block)
    loops = sch.get_loops(blk)
    if len(loops) not in (3, 4):
        raise WorkloadError(
            f"reference_schedule expects a GEMM block with 3 or 4 loops (b, i, j, "
            f"k); found {len(loops)} loops on block {block!r}"
        )
    batch_loop = loops[0] if len(loops) == 4 else None
    i, j, k = loops[-3:]
    bi, ti, ii = sch.split(i, [None, threads_y, tm])
    bj, tj, jj = sch.split(j, [None, threads_x, tn])
    ko, ki = sch.split(k, [None, bk])
    order = ([batch_loop] if batch_loop is not None else []) + [bi, bj, ti, tj, ko, ki, ii, jj]
    sch.reorder(*order)
    if batch_loop is not None:
        sch.bind(batch_loop, "blockIdx.z")
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(ti, "threadIdx.y")
    sch.bind(tj, "threadIdx.x")

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

    for idx in (0, 1):
        cr = sch.cache_read(blk, idx, "shared")
        sch.compute_at(cr, ko)
        # The copy's own loops are those below the panel loop it was computed at.
        copy_loops = sch.get_loops(cr)[len(order) - 3 :]
        fused = sch.fuse(*copy_loops)
        _, ty, tx = sch.split(fused, [None, threads_y, threads_x])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
    sch.decompose_reduction(blk, ko)
    return sch

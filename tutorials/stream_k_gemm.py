"""
Stream-K GEMM
=============

In this tutorial you turn an ordinary tiled TensorIR GEMM into a Stream-K kernel with one
schedule call, check it against NumPy, and time it against the kernel it replaces.

You will learn

* why a data-parallel GEMM wastes part of the GPU when its tiles do not fill whole waves;
* how ``tvm_streamk.stream_k`` records a decomposition on the reduction block, and how the
  ``tvm_streamk`` TIR pipeline rewrites the kernel;
* how to read the plan with ``tvm_streamk.explain``;
* how to check and time the kernel on whatever device this machine has: a CUDA GPU when TVM can
  use one, else PoCL, which runs the OpenCL build of the same kernel on the CPU.

Run it with ``python tutorials/stream_k_gemm.py``; ``main(fast=True)`` is what the test suite runs.
"""

# %%
# Motivation
# ----------
#
# A GEMM scheduled the usual way launches one GPU block per output tile. A GPU with ``num_sms``
# streaming multiprocessors runs ``num_sms`` such blocks at once (one per SM here), so ``tiles``
# tiles take ``ceil(tiles / num_sms)`` *waves*. With ``num_sms + 1`` tiles the second wave holds
# one tile: the whole kernel takes twice as long as one wave while the GPU is almost idle for
# half of it. This is *quantisation*, and no choice of tile size removes it for every shape.
#
# Stream-K (Osama et al., 2023) launches exactly ``num_sms`` persistent blocks and gives each an
# equal, contiguous share of the flattened ``tiles x K-panels`` iteration space. A block's share
# may start or end in the middle of a tile; the blocks that share a tile merge their partial sums
# (the *fix-up*). Every SM does the same amount of work, whatever the tile count.

import numpy as np

from tvm_streamk import device as devices
from tvm_streamk import workloads
from tvm_streamk.explain import explain

# Relative to the largest output: fp32 accumulation of K products of values in [-1, 1] stays
# within this of float64 for the K used below.
TOLERANCE = 1e-5


# %%
# Compute kernel
# --------------
#
# ``workloads.gemm`` writes ``C = A @ B`` as one TensorIR block with a reduction over K, and
# ``workloads.reference_schedule`` gives it the classic data-parallel GPU schedule: one
# ``bm x bn`` output tile per ``blockIdx``, a ``4 x 4`` register tile per thread, and the K loop
# split into panels of ``bk`` staged in shared memory. Nothing in that schedule knows about
# Stream-K; it is the kernel you would write anyway.
#
# ``sch.stream_k(block, num_sms=...)`` checks that the kernel has the shape Stream-K rewrites
# (a ``blockIdx`` band of output tiles around a serial K-panel loop accumulating in registers),
# picks the decomposition and records it as annotations on the reduction block. The returned
# ``Plan`` says exactly which block runs which (tile, K-range) segments. The rewrite itself
# happens when the module is built with ``tir_pipeline="tvm_streamk"``.


def build(m, n, k, num_sms, target, *, bm=32, bn=32, bk=8, **policy):
    """The data-parallel schedule, the Stream-K schedule and its plan, for ``C = A @ B``."""
    func = workloads.gemm(m, n, k)
    data_parallel = workloads.reference_schedule(func, bm=bm, bn=bn, bk=bk)
    stream_k = workloads.reference_schedule(func, bm=bm, bn=bn, bk=bk)
    plan = stream_k.stream_k("C_update", num_sms=num_sms, target=target, **policy)
    return func, data_parallel, stream_k, plan


# %%
# Correctness
# -----------
#
# Every check runs on fresh random inputs with the output filled with NaN first, so a tile that
# no block writes, or a partial sum that is lost, shows up as an error rather than as left-over
# correct values. The reference is float64 NumPy.


def check(func, kernel, rng):
    """Run ``kernel`` on fresh inputs and return its error relative to float64 NumPy."""
    args = workloads.random_args(func, rng)
    assert np.isnan(args[-1]).all(), "the output must start poisoned"
    out = kernel.run(*args)[-1]
    return workloads.relative_error(out, workloads.reference(func, args))


# %%
# Benchmark
# ---------
#
# The shapes are chosen relative to the device's SM count, so the sweep shows the same thing on
# any device: tile counts just under, at, and just over whole waves. On a GPU the Stream-K column
# should win where data-parallel has a nearly empty last wave. PoCL runs blocks as CPU threads,
# where a nearly empty wave costs little and Stream-K's extra bookkeeping shows instead; the
# ``predicted`` column is the cost model's GPU estimate (``tvm_streamk.cost_model``), which is
# what the ``heuristic`` policy decides by.


def sweep_tiles(num_sms, fast):
    """Tile counts around whole waves of ``num_sms`` blocks."""
    if fast:
        return [num_sms + 1]
    counts = {max(1, num_sms // 2), num_sms, num_sms + 1, 2 * num_sms, 2 * num_sms + 1}
    return sorted(counts)


def main(fast=False):
    """Check and time Stream-K against data-parallel GEMMs on the default device.

    Parameters
    ----------
    fast : bool
        One small shape and one timed run per kernel, as the test suite runs it.

    Returns
    -------
    list of dict
        One row per shape: tiles, measured seconds of both kernels, the predicted speed-up and
        both relative errors.
    """
    # %%
    # Discover the device instead of assuming one; plan for its SM count (the compute units of
    # the PoCL device on a CPU).
    device = devices.default_device()
    num_sms = devices.num_sms(device)
    target = devices.target(device)
    print(f"device: {device}, {num_sms} SMs, target {target.kind.name}")
    rng = np.random.default_rng()
    bm = bn = 32
    k = 256 if fast else 2048
    repeat = 1 if fast else 5

    rows = []
    for tiles in sweep_tiles(num_sms, fast):
        # One column of tiles: tiles x 1 output tiles of bm x bn.
        m, n = tiles * bm, bn
        func, dp_sch, sk_sch, plan = build(m, n, k, num_sms, target, bm=bm, bn=bn)
        if not rows:
            # %%
            # What Stream-K will do for the first shape, beside the data-parallel kernel: the
            # grid, how evenly the K-panel iterations spread, which tiles are split, and the
            # cost model's prediction.
            explain(sk_sch)
            if not fast:
                # %%
                # The decision lives in the schedule's trace as ordinary ``annotate``
                # instructions, so it prints, serialises and replays like any other schedule.
                trace = str(sk_sch.trace).splitlines()
                print("\n".join(line for line in trace if "tvm_streamk." in line))

        dp_kernel = devices.compile(dp_sch, device, pipeline="default")
        sk_kernel = devices.compile(sk_sch, device, pipeline="tvm_streamk")
        errors = (check(func, dp_kernel, rng), check(func, sk_kernel, rng))
        assert max(errors) <= TOLERANCE, (
            f"{m}x{n}x{k}: relative errors {errors} exceed {TOLERANCE} (data-parallel, Stream-K)"
        )

        args = workloads.random_args(func, rng)
        t_dp = dp_kernel.time(*args, repeat=repeat)
        t_sk = sk_kernel.time(*args, repeat=repeat)
        predicted = explain(plan, print_=False).speedup
        rows.append(
            {
                "tiles": tiles,
                "shape": (m, n, k),
                "data_parallel_s": t_dp,
                "stream_k_s": t_sk,
                "predicted_speedup": predicted,
                "errors": errors,
            }
        )

    print(f"\n{'tiles':>6} {'M x N x K':>16} {'data-par ms':>12} {'Stream-K ms':>12} "
          f"{'measured':>9} {'predicted':>9}")  # fmt: skip
    for r in rows:
        m, n, k = r["shape"]
        print(
            f"{r['tiles']:>6} {f'{m}x{n}x{k}':>16} {r['data_parallel_s'] * 1e3:>12.3f} "
            f"{r['stream_k_s'] * 1e3:>12.3f} {r['data_parallel_s'] / r['stream_k_s']:>8.2f}x "
            f"{r['predicted_speedup']:>8.2f}x"
        )
    return rows


if __name__ == "__main__":
    main()

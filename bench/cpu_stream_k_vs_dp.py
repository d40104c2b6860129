"""Stream-K versus data-parallel on the CPU: PoCL timings beside the cost model's prediction.

PoCL runs each OpenCL work-group on one of its compute units, so a grid of ``G`` work-groups on
``C`` compute units runs in ``ceil(G / C)`` waves, like thread blocks on SMs. The default problem is
the textbook quantisation case: a 96 x 32 x 8192 GEMM cut into three 32 x 32 tiles of 1024
K-panels, on a grid of ``C`` = (the device's compute units, 2 on a 2-core machine) blocks.
Data-parallel runs two waves of whole tiles, the second one half idle; Stream-K gives each of the
2 persistent blocks 1.5 tiles of K-panels; the hybrids and split-K sit in between.

Every kernel is checked against float64 numpy first (output poisoned with NaN, relative error
``max|out - ref| / max|ref|`` at most 1e-5), then timed: the median over ``--repeat`` calls of
the summed kernel times PoCL's profiling events report (the zero prologue included), the
decompositions taking turns call by call so that other load on the machine hits them alike; the
fastest call is printed too, as the estimate least disturbed by such load. The prediction is
:func:`tvm_streamk.cost_model.predicted_time` with the default, uncalibrated constants, as a
speed-up over data-parallel. On a CPU the wave model only holds while nothing else competes for
the cores: the header prints the load average, and a closing concurrency check times one tile
against one full wave of tiles to show how many work-groups really ran at once.

Run ``python bench/cpu_stream_k_vs_dp.py [--m 96 --n 32 --k 8192 --repeat 31]``; ``--policies``
picks the decompositions compared with data-parallel, ``--fixup`` the fix-up (``atomic`` or
``workspace``), ``--splits`` the split-K factor and ``--tile BM BN BK`` the tile.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys

import numpy as np
import tvm

import tvm_streamk
from tvm_streamk import pocl, workloads
from tvm_streamk.cost_model import FIXUPS, predicted_time
from tvm_streamk.pocl import device as pocl_device

OPENCL = tvm.target.Target({"kind": "opencl"})
TOLERANCE = 1e-5
# stream_k keyword arguments by the name --policies takes; data-parallel is always measured first,
# as the baseline.
POLICIES = {
    "data_parallel": {"policy": "data_parallel"},
    "stream_k": {"policy": "stream_k"},
    "hybrid_one_tile": {"policy": "hybrid", "variant": "one_tile"},
    "hybrid_two_tile": {"policy": "hybrid", "variant": "two_tile"},
    "split_k": {"policy": "split_k"},
}


def machine() -> str:
    """One line each: the CPU, its cores, the PoCL device and the load while measuring."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        pass
    dev = pocl_device.device()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return "\n".join(
        [
            f"- CPU: {cpu}, {os.cpu_count()} logical cores",
            f"- OpenCL device: {dev.name} ({dev.version}), {pocl.compute_units()} compute units, "
            f"max work-group size {dev.max_work_group_size}",
            f"- load average (1, 5, 15 min) when the timing started: {load}",
        ]
    )


def build(func, label: str, kwargs: dict, tile: dict, fixup: str) -> dict:
    """Schedule and compile one decomposition of ``func``, check its output; return its row."""
    sch = workloads.reference_schedule(func, **tile)
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=pocl.compute_units(), fixup=fixup, target=OPENCL, **kwargs
    )
    kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
    args = workloads.random_args(func, np.random.default_rng(0))
    out = kernel.run(*args)[-1]
    error = workloads.relative_error(out, workloads.reference(func, args))
    if not error <= TOLERANCE:
        raise SystemExit(f"{label}: relative error {error:.3g} > {TOLERANCE:g}; not timing it")
    return {
        "label": label,
        "plan": plan,
        "kernel": kernel,
        "args": args,
        "predicted": predicted_time(plan, fixup=fixup),
        "error": error,
    }


def time_interleaved(rows: list[dict], repeat: int) -> None:
    """Set each row's median seconds, timing the kernels in turn, one call each per round.

    Interleaving spreads whatever else the machine is doing evenly over the kernels.
    """
    samples: list[list[float]] = [[] for _ in rows]
    for row in rows:
        row["kernel"].time(*row["args"], repeat=1, warmup=1)
    for _ in range(repeat):
        for row, times in zip(rows, samples):
            times.append(row["kernel"].time(*row["args"], repeat=1, warmup=0))
    for row, times in zip(rows, samples):
        row["seconds"] = statistics.median(times)
        row["fastest"] = min(times)


def table(rows: list[dict], compute_units: int) -> str:
    """The rows as markdown, speed-ups relative to the first (data-parallel) row."""
    base = rows[0]
    head = (
        "| decomposition | grid | waves | split tiles | most K-panels per block | median ms | "
        "fastest ms | measured speed-up (median) | (fastest) | predicted speed-up | rel. error |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        p = row["plan"]
        lines.append(
            f"| {row['label']} | {p.grid} | {math.ceil(p.grid / compute_units)} | "
            f"{len(p.split_tiles)} | {max(p.iterations_per_block)} | "
            f"{row['seconds'] * 1e3:.2f} | {row['fastest'] * 1e3:.2f} | "
            f"{base['seconds'] / row['seconds']:.2f}x | {base['fastest'] / row['fastest']:.2f}x | "
            f"{base['predicted'] / row['predicted']:.2f}x | {row['error']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def concurrency(one: dict, wave: dict, compute_units: int) -> str:
    """How many work-groups ran at once: one full wave of tiles against a single tile."""
    median = compute_units * one["seconds"] / wave["seconds"]
    fastest = compute_units * one["fastest"] / wave["fastest"]
    return (
        f"Concurrency check: one tile alone took {one['seconds'] * 1e3:.2f} ms, a wave of "
        f"{compute_units} tiles {wave['seconds'] * 1e3:.2f} ms (medians), so {median:.2f} of "
        f"{compute_units} work-groups ran at once ({fastest:.2f} from the fastest calls). The wave "
        f"model, and with it the prediction, assumes {compute_units}; less means other load took "
        "cores away during the run.\n"
    )


def main(argv: list[str] | None = None) -> list[dict]:
    """Check, time and print every decomposition; return the table's rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=96, help="rows of A and C")
    parser.add_argument("--n", type=int, default=32, help="columns of B and C")
    parser.add_argument("--k", type=int, default=8192, help="the reduction extent")
    parser.add_argument("--repeat", type=int, default=31, help="timed calls per kernel (median)")
    parser.add_argument(
        "--policies",
        nargs="+",
        choices=list(POLICIES)[1:],
        default=list(POLICIES)[1:],
        help="decompositions to compare with data-parallel",
    )
    parser.add_argument("--splits", type=int, default=2, help="K splits of the split-K row")
    parser.add_argument(
        "--fixup", choices=FIXUPS, default="atomic", help="how split tiles are merged"
    )
    parser.add_argument(
        "--tile", type=int, nargs=3, default=(32, 32, 8), metavar=("BM", "BN", "BK")
    )
    opts = parser.parse_args(argv)
    if min(opts.m, opts.n, opts.k, opts.repeat, opts.splits, *opts.tile) < 1:
        parser.error("--m, --n, --k, --repeat, --splits and --tile must be positive")
    if not pocl.available():
        raise SystemExit("no PoCL device: install pyopencl and pocl-binary-distribution")

    bm, bn, bk = opts.tile
    tile = {"bm": bm, "bn": bn, "bk": bk, "tm": 4, "tn": 4}
    units = pocl.compute_units()
    policies = [("data_parallel", POLICIES["data_parallel"])]
    for name in dict.fromkeys(opts.policies):
        if name == "split_k":
            policies.append((f"split_k S={opts.splits}", {**POLICIES[name], "splits": opts.splits}))
        else:
            policies.append((name, POLICIES[name]))
    tiles = math.ceil(opts.m / bm) * math.ceil(opts.n / bn)
    panels = math.ceil(opts.k / bk)
    sys.stdout.write(
        f"GEMM {opts.m} x {opts.n} x {opts.k} fp32, {bm} x {bn} tiles with {bk}-wide K-panels: "
        f"{tiles} tiles x {panels} panels on {units} compute units; median of {opts.repeat} "
        f"calls; {opts.fixup} fix-up\n{machine()}\n\n"
    )

    func = workloads.gemm(opts.m, opts.n, opts.k)
    rows = [build(func, label, kw, tile, opts.fixup) for label, kw in policies]
    data_parallel = POLICIES["data_parallel"]
    controls = [
        build(workloads.gemm(bm, bn, opts.k), "one tile", data_parallel, tile, opts.fixup),
        build(workloads.gemm(bm * units, bn, opts.k), "one wave", data_parallel, tile, opts.fixup),
    ]
    time_interleaved(rows + controls, opts.repeat)
    sys.stdout.write(table(rows, units) + "\n" + concurrency(*controls, units))
    return rows


if __name__ == "__main__":
    main()

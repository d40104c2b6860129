"""Turn a GPU run's ``results.json`` and its pack's ``manifest.json`` into markdown tables.

Tables: correctness and sanitizers; the speed-up of each decomposition over the data-parallel
kernel of the same schedule and shape, by shape class (geometric mean, min, max); the fraction
of cuBLAS (torch.matmul) each reaches; the cost model's predicted speed-up against the measured
one. ``--calibrate`` also fits :func:`tvm_streamk.cost_model.calibrate` to the measured times,
per schedule source and fix-up (a unit of the model is one K-panel iteration of one tile, whose
cost depends on the schedule's tile).

Usage::

    python -m bench.gpu.report --results results.json --manifest pack/manifest.json \
        --out docs/benchmarks-gpu.md [--calibrate]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import defaultdict
from pathlib import Path


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _table(header: list[str], rows: list[list]) -> list[str]:
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if math.isfinite(value) else str(value)
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


def joined(results: dict, manifest: dict) -> list[dict]:
    """Each measured kernel's result with its manifest record (``entry``)."""
    by_name = {k["name"]: k for k in manifest["kernels"]}
    return [
        dict(r, entry=by_name[r["name"]])
        for r in results.get("kernels", [])
        if r["name"] in by_name
    ]


def _baselines(rows: list[dict]) -> dict:
    """(shape, schedule source) -> the data-parallel kernel's median time."""
    return {
        (tuple(r["entry"]["shape"].values()), r["entry"]["schedule_source"]): r["median_ms"]
        for r in rows
        if r["entry"]["variant"] == "data_parallel" and r.get("status") == "ok" and "median_ms" in r
    }


def _timed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok" and r.get("median_ms")]


def correctness(results: dict, rows: list[dict]) -> list[str]:
    counts = defaultdict(int)
    for r in rows:
        counts[r["status"]] += 1
    out = ["## Correctness", ""]
    device = results.get("device", {})
    if device:
        out += [
            f"Device: {device.get('name')} ({device.get('sms')} SMs), torch {device.get('torch')}, "
            f"CUDA {device.get('cuda')}; {results.get('elapsed_s')} s.",
            "",
        ]
    out += _table(["status", "kernels"], [[k, v] for k, v in sorted(counts.items())])
    if results.get("not_run"):
        out += [f"Not run (time budget): {len(results['not_run'])} kernels.", ""]
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        out += _table(
            ["kernel", "status", "max rel. error", "detail"],
            [
                [
                    r["name"],
                    r["status"],
                    r.get("max_err_rel", ""),
                    r.get("error", r.get("rule", "")),
                ]
                for r in bad
            ],
        )
    sanitizer = results.get("sanitizer")
    if sanitizer:
        out += ["### compute-sanitizer", ""]
        out += _table(
            ["tool", "kernels", "status", "errors"],
            [
                [
                    s.get("tool", ""),
                    ", ".join(s.get("kernels", [])),
                    s["status"],
                    s.get("errors", ""),
                ]
                for s in sanitizer
            ],
        )
    return out


def speedups(rows: list[dict]) -> list[str]:
    base = _baselines(rows)
    groups = defaultdict(list)
    for r in _timed(rows):
        e = r["entry"]
        dp = base.get((tuple(e["shape"].values()), e["schedule_source"]))
        if e["variant"] == "data_parallel" or dp is None:
            continue
        groups[(e["schedule_source"], e["variant"], e["shape_class"])].append(dp / r["median_ms"])
    out = [
        "## Speed-up over data-parallel",
        "",
        "Data-parallel time / kernel time, same schedule and shape (> 1: faster).",
        "",
    ]
    table = [
        [source, variant, cls, len(v), _geomean(v), min(v), max(v)]
        for (source, variant, cls), v in sorted(groups.items())
    ]
    return out + _table(
        ["schedule", "decomposition", "shape class", "n", "geomean", "min", "max"], table
    )


def cublas_fraction(rows: list[dict]) -> list[str]:
    groups = defaultdict(list)
    for r in _timed(rows):
        if r.get("cublas_ms"):
            e = r["entry"]
            groups[(e["schedule_source"], e["variant"], e["shape_class"])].append(
                r["cublas_ms"] / r["median_ms"]
            )
    out = [
        "## Fraction of cuBLAS",
        "",
        "torch.matmul time / kernel time (1: as fast as cuBLAS).",
        "",
    ]
    table = [
        [source, variant, cls, len(v), _geomean(v), min(v), max(v)]
        for (source, variant, cls), v in sorted(groups.items())
    ]
    return out + _table(
        ["schedule", "decomposition", "shape class", "n", "geomean", "min", "max"], table
    )


def predicted_vs_measured(rows: list[dict], worst: int = 10) -> list[str]:
    base = _baselines(rows)
    pairs = []
    for r in _timed(rows):
        e = r["entry"]
        dp = base.get((tuple(e["shape"].values()), e["schedule_source"]))
        if e["variant"] == "data_parallel" or dp is None:
            continue
        predicted = e["predicted_dp_units"] / e["predicted_units"]
        pairs.append((r["name"], e["plan"]["label"], predicted, dp / r["median_ms"]))
    out = ["## Predicted versus measured speed-up", ""]
    if not pairs:
        return out + ["No kernel with a measured data-parallel baseline.", ""]
    agree = sum((p > 1) == (m > 1) for _, _, p, m in pairs)
    logs = [(math.log(p), math.log(m)) for _, _, p, m in pairs]
    out += [
        f"{len(pairs)} kernels; the model and the GPU agree on faster or slower than "
        f"data-parallel for {agree} ({agree / len(pairs):.0%}); correlation of log speed-ups "
        f"{_correlation(logs):.2f}.",
        "",
    ]
    ranked = sorted(pairs, key=lambda t: -abs(math.log(t[2] / t[3])))[:worst]
    return out + _table(["kernel", "plan", "predicted", "measured"], [list(t) for t in ranked])


def _correlation(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return math.nan
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxy = sum((x - mx) * (y - my) for x, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    syy = sum((y - my) ** 2 for _, y in points)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else math.nan


def calibration(rows: list[dict]) -> list[str]:
    """Fitted cost-model constants per schedule source and fix-up (needs tvm_streamk)."""
    from tvm_streamk import cost_model
    from tvm_streamk.decomposition import Plan

    fields = {f.name for f in dataclasses.fields(Plan)}
    groups = defaultdict(list)
    for r in _timed(rows):
        e = r["entry"]
        if e["runtime_grid"]:
            continue
        plan = Plan(**{k: v for k, v in e["plan"].items() if k in fields})
        groups[(e["schedule_source"], e["fixup"] or "workspace")].append(
            (plan, r["median_ms"] / 1e3)
        )
    out = ["## Calibrated cost model", ""]
    table = []
    for (source, fixup), measurements in sorted(groups.items()):
        try:
            fit = cost_model.calibrate(measurements, fixup=fixup)
            table.append([source, fixup, len(measurements), *dataclasses.astuple(fit)])
        except cost_model.CostModelError as err:
            out.append(f"{source}/{fixup}: {err}")
    names = [f.name for f in dataclasses.fields(cost_model.CostParams)]
    return out + [""] + _table(["schedule", "fixup", "n", *names], table)


def render(results: dict, manifest: dict, calibrate: bool = False) -> str:
    rows = joined(results, manifest)
    lines = [f"# GPU results ({results.get('shapes', manifest.get('shapes'))} pack)", ""]
    lines += correctness(results, rows)
    lines += speedups(rows)
    lines += cublas_fraction(rows)
    lines += predicted_vs_measured(rows)
    if calibrate:
        lines += calibration(rows)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--out", type=Path, help="markdown file (default: stdout)")
    parser.add_argument("--calibrate", action="store_true")
    args = parser.parse_args(argv)
    text = render(
        json.loads(args.results.read_text()), json.loads(args.manifest.read_text()), args.calibrate
    )
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Turn a GPU run's journals and its pack's manifest into markdown tables.

Input: the folder ``device_run.sh`` filled (``--run OUT``: ``results.jsonl``,
``sanitizer.jsonl``, ``manifest.json``, ``env-before.json``), or the files one by one. The
headline, per shape class: each decomposition's speed-up over the data-parallel kernel of the
same schedule and shape (geometric mean), and the fraction of cuBLAS it reaches (torch.matmul:
fp32 with TF32 off; fp16 inputs with fp32 accumulation on tensor cores). Then correctness and
the sanitizers; resources (registers and resident blocks per SM against data-parallel's, so a
code-generation effect can be told from a decomposition's); the GPU's clocks over the run; the
cost model's predicted speed-up against the measured one. ``--calibrate`` also fits
:func:`tvm_streamk.cost_model.calibrate` to the measured times, per schedule source and fix-up.

Usage::

    python -m bench.gpu.report --run gpu-out --out docs/benchmarks-gpu.md [--calibrate]
    python -m bench.gpu.report --results results.jsonl --manifest pack/manifest.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from bench.gpu.runner import journal


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


@dataclasses.dataclass
class Run:
    """What one GPU run left: its journals' records, the manifest, the machine."""

    records: list[dict]
    sanitizer: list[dict]
    manifest: dict
    environment: dict = dataclasses.field(default_factory=dict)
    # Nsight Compute's records (``profile.jsonl``, device_run.sh's PROFILE_ONLY stage).
    profile: list[dict] = dataclasses.field(default_factory=list)

    @classmethod
    def load(cls, results: Path, manifest: Path, sanitizer: Path | None = None, env=None):
        environment = json.loads(env.read_text()) if env and env.is_file() else {}
        return cls(
            journal.read(results),
            journal.read(sanitizer) if sanitizer else [],
            json.loads(manifest.read_text()),
            environment,
        )

    @classmethod
    def from_folder(cls, folder: Path):
        run = cls.load(
            folder / "results.jsonl",
            folder / "manifest.json",
            folder / "sanitizer.jsonl",
            folder / "env-before.json",
        )
        # The named kernels' initcheck (device_run.sh's INITCHECK_ONLY stage), and ncu's.
        if (folder / "initcheck.jsonl").is_file():
            run.sanitizer += journal.read(folder / "initcheck.jsonl")
        if (folder / "profile.jsonl").is_file():
            run.profile = journal.read(folder / "profile.jsonl")
        return run


def joined(run: Run) -> list[dict]:
    """Each kernel's last record with its manifest record (``entry``)."""
    by_name = {k["name"]: k for k in run.manifest["kernels"]}
    return [
        dict(r, entry=by_name[r["name"]])
        for r in journal.kernel_records(run.records)
        if r["name"] in by_name
    ]


def _key(entry: dict) -> tuple:
    return (tuple(entry["shape"].values()), entry["schedule_source"])


def _baselines(rows: list[dict]) -> dict:
    """(shape, schedule source) -> the data-parallel kernel's row."""
    return {_key(r["entry"]): r for r in _timed(rows) if r["entry"]["variant"] == "data_parallel"}


def _timed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok" and r.get("median_ms")]


def _cublas_kind(entry: dict) -> str:
    if entry["dtypes"]["a"] == "float32":
        return "fp32, TF32 off"
    return f"{entry['dtypes']['a']} inputs, fp32 accumulation (tensor cores)"


def headline(rows: list[dict]) -> list[str]:
    """Per shape class and decomposition: speed-up over data-parallel, fraction of cuBLAS."""
    base = _baselines(rows)
    groups = defaultdict(lambda: {"speedup": [], "cublas": [], "kinds": set()})
    for r in _timed(rows):
        e = r["entry"]
        group = groups[(e["shape_class"], e["schedule_source"], e["variant"])]
        if r.get("cublas_ms"):
            group["cublas"].append(r["cublas_ms"] / r["median_ms"])
            group["kinds"].add(_cublas_kind(e))
        dp = base.get(_key(e))
        if dp is not None and e["variant"] != "data_parallel":
            group["speedup"].append(dp["median_ms"] / r["median_ms"])
    out = [
        "## Headline",
        "",
        "Per shape class: speed-up over the data-parallel kernel of the same schedule and shape "
        "(its time / the kernel's; > 1 is faster), and the fraction of cuBLAS "
        "(torch.matmul's time / the kernel's; 1 is as fast), geometric means over the shapes.",
        "",
    ]
    table = []
    for (cls, source, variant), g in sorted(groups.items()):
        speedup = _geomean(g["speedup"]) if g["speedup"] else "baseline"
        if variant != "data_parallel" and not g["speedup"]:
            speedup = "no baseline"
        cublas = _geomean(g["cublas"]) if g["cublas"] else math.nan
        table.append(
            [cls, source, variant, len(g["cublas"]), speedup, cublas, "; ".join(sorted(g["kinds"]))]
        )
    return out + _table(
        ["shape class", "schedule", "decomposition", "n", "speed-up vs DP", "of cuBLAS",
         "cuBLAS as"], table
    )  # fmt: skip


def correctness(run: Run, rows: list[dict]) -> list[str]:
    counts = defaultdict(int)
    for r in rows:
        counts[r["status"]] += 1
    out = ["## Correctness", ""]
    device = run.environment.get("device")
    if device:
        torch = run.environment.get("torch", {})
        out += [
            f"Device: {device.get('name')} ({device.get('sms')} SMs), torch "
            f"{torch.get('version')}, CUDA {torch.get('cuda')}, driver "
            f"{run.environment.get('driver')}.",
            "",
        ]
    out += [
        "Every kernel: an exact pass on integer-valued inputs (bit-equal to float64, over "
        "several calls), a float pass, and the float pass again after the timed calls "
        "(deterministic kernels: the same bits as the first call).",
        "",
    ]
    out += _table(["status", "kernels"], [[k, v] for k, v in sorted(counts.items())])
    not_run = [n for r in run.records if r.get("kind") == "not_run" for n in r["names"]]
    if not_run:
        out += [f"Not run (time budget): {len(not_run)} kernels.", ""]
    errors = [r for r in run.records if r.get("kind") == "error"]
    for r in errors:
        out += [f"Run error at {r.get('stage')}: {r.get('error')}", ""]
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        out += _table(
            ["kernel", "status", "stage", "exact mismatches", "detail"],
            [
                [
                    r["name"],
                    r["status"],
                    r.get("stage", ""),
                    r.get("exact_mismatches", ""),
                    _detail(r),
                ]
                for r in bad
            ],
        )
    reports = [s for s in run.sanitizer if s.get("kind") == "sanitizer"]
    if reports:
        out += ["### compute-sanitizer", ""]
        out += _table(
            ["tool", "kernels", "sanitizer", "errors", "child's own verdict"],
            [
                [
                    s.get("tool", ""),
                    _kernels_cell(s.get("kernels", [])),
                    s["status"],
                    s.get("errors", ""),
                    ", ".join(sorted(set((s.get("child") or {}).values()))),
                ]
                for s in reports
            ],
        )
    return out


def _kernels_cell(names: list[str]) -> str:
    """A sanitizer run's kernels: their names when few, else their count."""
    return ", ".join(f"`{n}`" for n in names) if len(names) <= 3 else str(len(names))


# Nsight Compute's metrics the report shows, with their column names.
PROFILE_COLUMNS = (
    ("Duration", "µs"),
    ("Registers Per Thread", "registers"),
    ("Grid Size", "grid"),
    ("Waves Per SM", "waves"),
    ("Achieved Occupancy", "achieved occupancy %"),
    ("Executed Instructions", "instructions (M)"),
    ("Compute (SM) Throughput", "SM throughput %"),
    ("L2 Hit Rate", "L2 hit %"),
)


def _metric(launch: dict, name: str):
    found = launch["metrics"].get(name)
    if found is None:
        return ""
    value = float(str(found["value"]).replace(",", ""))
    if name == "Duration":
        scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
        return f"{value * scale.get(found['unit'], 1.0):.1f}"
    if name == "Executed Instructions":
        return f"{value / 1e6:.1f}"
    return f"{value:g}"


def profile(run: Run) -> list[str]:
    """Nsight Compute on the named kernels: each kernel's launches of one call (the float
    pass), with the metrics of :data:`PROFILE_COLUMNS`."""
    records = [r for r in run.profile if r.get("kind") == "profile"]
    if not records:
        return []
    out = [
        "## Nsight Compute",
        "",
        "`ncu` on the kernels named in the call (`PROFILE_ONLY`), the first launches of one "
        "call: a Stream-K build's fix-up prologue (zeroing the output or the counters) is a "
        "launch of its own; a data-parallel kernel's two rows are the float and the exact pass.",
        "",
    ]
    rows = []
    for r in records:
        if r["status"] != "ok":
            rows.append([r["name"], r["status"], *[""] * len(PROFILE_COLUMNS)])
            continue
        for launch in r["launches"]:
            rows.append(
                [r["name"], launch["kernel"], *(_metric(launch, m) for m, _ in PROFILE_COLUMNS)]
            )
    return out + _table(["kernel", "launch", *(c for _, c in PROFILE_COLUMNS)], rows)


def _detail(record: dict) -> str:
    """One line on why a kernel is not ok."""
    if record.get("error"):
        text = record["error"]
    elif record.get("stderr_tail") is not None:
        lines = [line.strip() for line in record["stderr_tail"].splitlines() if line.strip()]
        first = next((x for x in lines if x.startswith(("Timeout", "Fatal Python error"))), None)
        text = f"exit {record.get('returncode')}: {first or (lines[-1] if lines else '')}"
    else:
        text = f"float pass {record.get('float', {}).get('max_err_rel')} (max rel. error)"
    return text[:200].replace("|", "/")


def _main_use(entry: dict) -> dict:
    used = entry.get("resources") or {}
    return (used.get("kernels") or {}).get(used.get("main"), {})


def resources(rows: list[dict]) -> list[str]:
    """Registers and resident blocks of each timed kernel against its data-parallel kernel's."""
    base = _baselines(rows)
    table = []
    for r in _timed(rows):
        e = r["entry"]
        dp = base.get(_key(e))
        if dp is None or e["variant"] == "data_parallel":
            continue
        mine, theirs = _main_use(e), _main_use(dp["entry"])
        if not mine or not theirs:
            continue
        table.append(
            [
                r["name"],
                dp["median_ms"] / r["median_ms"],
                f"{mine['registers']} / {theirs['registers']}",
                f"{mine.get('blocks_per_sm')} / {theirs.get('blocks_per_sm')}",
                mine["spill_bytes"],
                e["plan"]["label"],
            ]
        )
    out = [
        "## Resources beside the speed-ups",
        "",
        "Registers and resident blocks per SM of the kernel's persistent (main) kernel / of the "
        "data-parallel kernel (ptxas, from the pack's build): a speed-up that comes with fewer "
        "resident blocks or spills is partly a code-generation effect.",
        "",
    ]
    if not table:
        return out + ["No timed kernel with resources on both sides.", ""]
    return out + _table(
        ["kernel", "speed-up", "registers", "blocks/SM", "spills (B)", "plan"], table
    )


def clocks(rows: list[dict]) -> list[str]:
    """The SM clock before and after each group's timing, over the run."""
    seen = []
    for r in _timed(rows):
        for side in ("before", "after"):
            value = ((r.get("clocks") or {}).get(side) or {}).get("clocks.sm")
            if value not in (None, ""):
                try:
                    seen.append(float(value))
                except ValueError:
                    continue
    out = ["## Clocks", ""]
    if not seen:
        return out + ["No clock readings (nvidia-smi was not available).", ""]
    spread = (max(seen) - min(seen)) / max(seen)
    note = " (more than 5% apart: throttling during the run)" if spread > 0.05 else ""
    return out + [
        f"SM clock over {len(seen)} readings: {min(seen):.0f} to {max(seen):.0f} MHz{note}.",
        "",
    ]


def speedups(rows: list[dict]) -> list[str]:
    base = _baselines(rows)
    groups = defaultdict(list)
    for r in _timed(rows):
        e = r["entry"]
        dp = base.get(_key(e))
        if e["variant"] == "data_parallel" or dp is None:
            continue
        groups[(e["schedule_source"], e["variant"], e["shape_class"])].append(
            dp["median_ms"] / r["median_ms"]
        )
    out = [
        "## Speed-up over data-parallel, spread",
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


def predicted_vs_measured(rows: list[dict], worst: int = 10) -> list[str]:
    base = _baselines(rows)
    pairs = []
    for r in _timed(rows):
        e = r["entry"]
        dp = base.get(_key(e))
        if e["variant"] == "data_parallel" or dp is None:
            continue
        predicted = e["predicted_dp_units"] / e["predicted_units"]
        pairs.append((r["name"], e["plan"]["label"], predicted, dp["median_ms"] / r["median_ms"]))
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


def predicted_time(rows: list[dict], target: str | None) -> list[str]:
    """The model in microseconds (``predicted_us``, priced for the pack's target) beside the
    measured medians: per schedule source and decomposition, measured / predicted time, the
    TFLOP/s reached and cuBLAS's, and whether the speed-up the microsecond model predicts over
    data-parallel has the measured sign."""
    base = _baselines(rows)
    groups = defaultdict(lambda: {"ratio": [], "tflops": [], "cublas": [], "signs": []})
    for r in _timed(rows):
        e = r["entry"]
        if not e.get("predicted_us"):
            continue
        flops = 2.0 * e["shape"]["m"] * e["shape"]["n"] * e["shape"]["k"]
        g = groups[(e["schedule_source"], e["variant"])]
        g["ratio"].append(r["median_ms"] * 1e3 / e["predicted_us"])
        g["tflops"].append(flops / (r["median_ms"] * 1e9))
        if r.get("cublas_ms"):
            g["cublas"].append(flops / (r["cublas_ms"] * 1e9))
        dp = base.get(_key(e))
        if dp is not None and e["variant"] != "data_parallel" and e.get("predicted_dp_us"):
            predicted = e["predicted_dp_us"] / e["predicted_us"]
            measured = dp["median_ms"] / r["median_ms"]
            g["signs"].append((predicted > 1) == (measured > 1))
    out = [
        "## Predicted versus measured time",
        "",
        f"The cost model's time in microseconds, priced for the pack's target ({target}), "
        "beside the measured median: measured / predicted (geometric mean, min, max; > 1: the "
        "kernel is slower than predicted), the TFLOP/s the kernel and cuBLAS reach (geometric "
        "means), and for how many kernels the model's predicted speed-up over data-parallel "
        "has the measured sign.",
        "",
    ]
    if not groups:
        return out + ["No kernel with a predicted time.", ""]
    table = []
    for (source, variant), g in sorted(groups.items()):
        signs = g["signs"]
        table.append(
            [
                source,
                variant,
                len(g["ratio"]),
                _geomean(g["ratio"]),
                min(g["ratio"]),
                max(g["ratio"]),
                _geomean(g["tflops"]),
                _geomean(g["cublas"]) if g["cublas"] else "-",
                f"{sum(signs)} of {len(signs)}" if signs else "-",
            ]
        )
    header = ["schedule", "decomposition", "n", "measured / predicted", "min", "max",
              "TFLOP/s", "cuBLAS TFLOP/s", "speed-up sign right"]  # fmt: skip
    return out + _table(header, table)


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


def plan_of(record: dict):
    """The :class:`~tvm_streamk.decomposition.Plan` a manifest's plan record holds (needs
    tvm_streamk; the record's extra fields, such as ``label``, dropped)."""
    from tvm_streamk.decomposition import Plan

    fields = {f.name for f in dataclasses.fields(Plan)}
    return Plan(**{k: v for k, v in record.items() if k in fields})


def calibration(rows: list[dict]) -> list[str]:
    """Fitted cost-model constants per schedule source and fix-up (needs tvm_streamk)."""
    from tvm_streamk import cost_model

    groups = defaultdict(list)
    for r in _timed(rows):
        e = r["entry"]
        if e["runtime_grid"]:
            continue
        plan = plan_of(e["plan"])
        groups[(e["schedule_source"], e["fixup"] or "workspace")].append(
            (plan, r["median_ms"] / 1e3)
        )
    out = [
        "## Calibrated cost model",
        "",
        "The constants of the scheduler in units (`cost_model.calibrate`, `CostParams`: what "
        "decides where the target names no GPU of the table), fitted to the measured times per "
        "schedule source and fix-up. The microsecond model of a GPU the table holds is not "
        "fitted here; the section above sets it beside the clock.",
        "",
    ]
    table = []
    for (source, fixup), measurements in sorted(groups.items()):
        try:
            fit = cost_model.calibrate(measurements, fixup=fixup)
            table.append([source, fixup, len(measurements), *dataclasses.astuple(fit)])
        except cost_model.CostModelError as err:
            out.append(f"{source}/{fixup}: {err}")
    names = [f.name for f in dataclasses.fields(cost_model.CostParams)]
    return out + [""] + _table(["schedule", "fixup", "n", *names], table)


def render(run: Run, calibrate: bool = False) -> str:
    rows = joined(run)
    lines = [f"# GPU results ({run.manifest.get('shapes')} pack)", ""]
    lines += headline(rows)
    lines += correctness(run, rows)
    lines += profile(run)
    lines += speedups(rows)
    lines += resources(rows)
    lines += clocks(rows)
    lines += predicted_vs_measured(rows)
    lines += predicted_time(rows, run.manifest.get("target"))
    if calibrate:
        lines += calibration(rows)
    return "\n".join(lines)


def emit(text: str, out: Path | None) -> None:
    """``text`` into the file ``out``, or to stdout without one."""
    if out:
        out.write_text(text)
    else:
        sys.stdout.write(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="the folder device_run.sh wrote ($OUT)")
    parser.add_argument("--results", type=Path, help="results.jsonl (without --run)")
    parser.add_argument("--manifest", type=Path, help="the pack's manifest.json (without --run)")
    parser.add_argument("--sanitizer", type=Path, help="sanitizer.jsonl (without --run)")
    parser.add_argument("--out", type=Path, help="markdown file (default: stdout)")
    parser.add_argument("--calibrate", action="store_true")
    args = parser.parse_args(argv)
    if args.run:
        run = Run.from_folder(args.run)
    elif args.results and args.manifest:
        run = Run.load(args.results, args.manifest, args.sanitizer)
    else:
        parser.error("give --run OUT, or --results and --manifest")
    emit(render(run, args.calibrate), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

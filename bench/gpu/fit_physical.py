"""Fit the microsecond model's constants to a GPU run, and say what the fit would change.

The model (:mod:`tvm_streamk.cost_model.physical`) prices a kernel from its traits and a GPU's
published figures with a few constants: the share of the peak a main loop reaches
(``EFFICIENCY``), a segment's fill (``FILL_US``), a partial tile's hand-off (``HANDOFF_US``),
a launch (``LAUNCH_US``), and how an SM's throughput falls with fewer resident blocks than
saturate it (``OCCUPANCY_EXPONENT``). This script rebuilds the traits of every kernel of a run (the
schedule only, no compile), prices each measured kernel and its data-parallel baseline under
adjustments to those constants (greedy descent over a grid), and keeps the ones whose
predicted times, each kernel's and its data-parallel baseline's, are closest to the measured
ones (least squares on their logarithms), priced for the GPU the run measured. It prints the
fit and, of the heuristic's measured decisions, which the refit model would still take over
data-parallel beyond the margin (``MIN_GAIN``) and which it would drop, with their measured
speed-ups.
Nothing here changes the package's constants.

Usage::

    python -m bench.gpu.fit_physical --run gpu-out [--class mma] [--hold-out] [--start before]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import tvm

from bench.gpu import report
from bench.gpu.kernels import schedule
from tvm_streamk import cost_model, occupancy
from tvm_streamk.analysis import first_site
from tvm_streamk.cost_model import physical
from tvm_streamk.decomposition import Plan

# The adjustments tried, around the shipped constants: a factor on the main loop's time per
# iteration, and microseconds more (or fewer) per segment, per partial tile and per launch.
COMPUTE_SCALE = (0.5, 0.625, 0.8, 0.9, 1.0, 1.1, 1.25, 1.6, 2.0, 2.5)
FILL_EXTRA_US = (-2.0, -1.0, 0.0, 1.0, 2.0, 4.0, 8.0, 16.0)
HANDOFF_EXTRA_US = (-2.0, -1.0, 0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 16.0, 32.0)
LAUNCH_EXTRA_US = (-2.0, 0.0, 2.0, 4.0, 8.0, 16.0, 32.0)
# How an SM's throughput falls with fewer resident blocks than saturate it
# (``CostParams.occupancy_exponent``).
OCCUPANCY_EXPONENT = (1.0, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)
# The instruction class fitted (``--class``): its constants are the ones adjusted.
CLASS = "ffma"
# No adjustment: the constants as shipped, where the descent starts.
SHIPPED = (1.0, 0.0, 0.0, 0.0, physical.OCCUPANCY_EXPONENT[CLASS])


@dataclasses.dataclass
class Sample:
    name: str
    plan: Plan
    dp_plan: Plan
    fixup: str
    price: physical.Price
    measured_us: float
    measured_dp_us: float
    baseline: str  # the data-parallel kernel's name
    decided: bool  # a decomposition the heuristic chose over data-parallel
    # Resident blocks that keep an SM busy, as the decision counts them (cost_model.saturation
    # of the data-parallel kernel's warps and occupancy).
    saturation: int | None = None

    @property
    def measured(self) -> float:
        """The measured speed-up over data-parallel."""
        return self.measured_dp_us / self.measured_us


def measured_gpu(run: report.Run):
    """The specification of the GPU the run measured (``env-before.json``'s device name, as
    ``NVIDIA H200`` becomes ``nvidia/nvidia-h200``), else of the pack's target."""
    name = str(run.environment.get("device", {}).get("name", ""))
    tag = "nvidia/" + name.lower().replace(" ", "-")
    spec = cost_model.spec_for(tag) or cost_model.spec_for(run.manifest["target"])
    if spec is None:
        raise SystemExit(f"no GPU specification for {name!r} or {run.manifest['target']!r}")
    return spec


# The schedules fitted per instruction class: static SIMT GEMMs for FFMA, dlight's fp16
# tensor-core schedule for MMA. The dynamic-M builds (``dlight_dynamic``) are reported beside
# the FFMA fit, not fitted: a run built before the host's choice of kernel ran their
# data-parallel counts on the persistent kernel.
SOURCES = {"ffma": ("reference", "dlight"), "mma": ("dlight_wmma",)}
FITTED_SOURCES = SOURCES["ffma"]


def samples(run: report.Run, log=print, sources=FITTED_SOURCES) -> list[Sample]:
    """Every timed kernel of ``sources`` with a planned grid, a data-parallel baseline and a
    price."""
    rows = report.joined(run)
    base = report._baselines(rows)
    target = tvm.target.Target(run.manifest["target"])
    spec = measured_gpu(run)
    traits: dict = {}
    out = []
    for r in report._timed(rows):
        e = r["entry"]
        dp = base.get(report._key(e))
        wanted = e["schedule_source"] in sources
        if dp is None or e["variant"] == "data_parallel" or not wanted or e["runtime_grid"]:
            continue
        shape = (e["schedule_source"], *e["shape"].values())
        if shape not in traits:
            site = first_site(schedule(*shape, target).mod["main"])
            traits[shape] = cost_model.traits_of(site)
            log(f"traits of {shape}")
        fixup = e["fixup"] or "workspace"
        out.append(
            Sample(
                r["name"],
                report.plan_of(e["plan"]),
                report.plan_of(e["data_parallel_plan"]),
                fixup,
                physical.price(traits[shape], spec, fixup),
                r["median_ms"] * 1e3,
                dp["median_ms"] * 1e3,
                dp["name"],
                e["variant"] == "heuristic" and e["plan"]["policy"] != "data_parallel",
                _saturation(dp["entry"]),
            )
        )
    return out


def _saturation(dp_entry: dict) -> int:
    """What the decision takes for an SM's saturation: ``cost_model.saturation`` of the
    data-parallel kernel's warps per block and resident blocks per SM."""
    resources = dp_entry["resources"]
    threads = resources["kernels"][resources["main"]]["threads"]
    warps = occupancy.resident_blocks(dp_entry["arch"], threads, None).warps_per_block
    return cost_model.saturation(warps, dp_entry["data_parallel_plan"]["blocks_per_sm"])


def adjusted(price: physical.Price, scale, fill, handoff, launch, exponent) -> physical.Price:
    return dataclasses.replace(
        price,
        compute_us=price.compute_us * scale,
        segment_us=price.segment_us + fill,
        fix_us=price.fix_us + handoff,
        launch_us=price.launch_us + launch,
        occupancy_exponent=exponent,
    )


def times(sample: Sample, knobs) -> tuple[float, float]:
    """Predicted microseconds of ``sample``'s plan and of its data-parallel baseline."""
    cost = cost_model.priced(adjusted(sample.price, *knobs))
    busy = sample.saturation
    t = cost_model.predicted_time(sample.plan, cost=cost, fixup=sample.fixup, saturation=busy)
    t_dp = cost_model.predicted_time(sample.dp_plan, cost=cost, fixup="workspace", saturation=busy)
    return t, t_dp


def _squared_log_errors(data: list[Sample], predicted: list[tuple[float, float]]) -> list:
    """Per kernel and per baseline (each once), the squared log error of the predicted time."""
    kernels, baselines = [], {}
    for s, (t, t_dp) in zip(data, predicted):
        kernels.append((math.log(t) - math.log(s.measured_us)) ** 2)
        baselines[s.baseline] = (math.log(t_dp) - math.log(s.measured_dp_us)) ** 2
    return kernels + list(baselines.values())


def error(data: list[Sample], knobs) -> float:
    """Squared log errors of the predicted times, the kernels' and their baselines' (each
    baseline once); infinite where an adjustment makes a cost negative."""
    try:
        return sum(_squared_log_errors(data, [times(s, knobs) for s in data]))
    except cost_model.CostModelError:
        return math.inf


def fit_class(name: str) -> None:
    """Fit the constants of instruction class ``name`` (``ffma`` or ``mma``): the descent
    starts from that class's shipped occupancy exponent."""
    global CLASS, SHIPPED
    CLASS = name
    SHIPPED = (1.0, 0.0, 0.0, 0.0, physical.OCCUPANCY_EXPONENT[name])


def start_from(efficiency: float, fill_us: float, handoff_us: float, exponent: float) -> None:
    """Make ``efficiency``, ``fill_us``, ``handoff_us`` and ``exponent`` the constants of the
    fitted class the descent starts from, in place of the shipped ones (a fit from other
    constants, such as the ones before a fit, to check that it lands near the shipped ones)."""
    global SHIPPED
    physical.EFFICIENCY[CLASS] = efficiency
    physical.FILL_US[CLASS] = fill_us
    physical.HANDOFF_US[CLASS] = handoff_us
    physical.OCCUPANCY_EXPONENT[CLASS] = exponent
    SHIPPED = (1.0, 0.0, 0.0, 0.0, exponent)


def summary(data: list[Sample], knobs) -> dict:
    predicted = [times(s, knobs) for s in data]
    errors = _squared_log_errors(data, predicted)
    speedups = [t_dp / t for t, t_dp in predicted]
    decided = [(p, s) for p, s in zip(speedups, data) if s.decided]
    margin = 1.0 / (1.0 - physical.MIN_GAIN)
    return {
        "rms_log_error": math.sqrt(sum(errors) / len(errors)),
        "sign_right": sum((p > 1) == (s.measured > 1) for p, s in zip(speedups, data)),
        "kept": [(p, s) for p, s in decided if p >= margin],
        "dropped": [(p, s) for p, s in decided if p < margin],
    }


def _geomean_measured(items) -> str:
    return f"{report._geomean([s.measured for _, s in items]):.3g}" if items else "-"


def split_by_shape(data: list[Sample]) -> tuple[list[Sample], list[Sample]]:
    """Every other shape (by its data-parallel kernel's name, sorted) held out of the fit."""
    shapes = sorted({s.baseline for s in data})
    held = set(shapes[1::2])
    return [s for s in data if s.baseline not in held], [s for s in data if s.baseline in held]


def render(
    data: list[Sample], fitted, held_out: list[Sample] = (), others=(), start="as shipped"
) -> str:
    """The fit beside the shipped constants on ``data`` (what was fitted) and, where given, on
    ``held_out`` (shapes the fit did not see) and on each ``(label, samples)`` of ``others``
    (kernels of other kinds, not fitted)."""
    scale, fill, handoff, launch, exponent = fitted
    rows = [(start, data, SHIPPED), ("fitted", data, fitted)]
    for label, part in [("held-out shapes", held_out), *others]:
        if part:
            rows += [(f"{start}, {label}", part, SHIPPED), (f"fitted, {label}", part, fitted)]
    summaries = [(label, part, summary(part, knobs)) for label, part, knobs in rows]
    after = summaries[1][2]
    lines = [
        f"{len(data)} kernels fitted ({sum(s.decided for s in data)} decided by the heuristic)"
        + (f", {len(held_out)} held out" if held_out else "")
        + ".",
        "",
        f"Fit: main loop x{scale}, segment +{fill} us, partial tile +{handoff} us, "
        f"launch +{launch} us, occupancy exponent {exponent} ({CLASS.upper()}: EFFICIENCY "
        f"{physical.EFFICIENCY[CLASS] / scale:.3g}, FILL_US {physical.FILL_US[CLASS] + fill}, "
        f"HANDOFF_US {physical.HANDOFF_US[CLASS] + handoff}, "
        f"LAUNCH_US {physical.LAUNCH_US + launch}, OCCUPANCY_EXPONENT {exponent}).",
        "",
        "| model | rms log error of the predicted times | sign right | heuristic decisions kept "
        "(measured geomean) | dropped (measured geomean) |",
        "|---|---|---|---|---|",
    ]
    for label, part, s in summaries:
        kept, dropped = s["kept"], s["dropped"]
        lines.append(
            f"| {label} | {s['rms_log_error']:.3f} | {s['sign_right']} of {len(part)} | "
            f"{len(kept)} ({_geomean_measured(kept)}) | "
            f"{len(dropped)} ({_geomean_measured(dropped)}) |"
        )
    lost = [s for p, s in after["kept"] if s.measured < 0.97]
    dropped_wins = [s for p, s in after["dropped"] if s.measured > 1.03]
    lines += [
        "",
        f"Fitted, the heuristic would still take {len(lost)} decision(s) measured more than 3% "
        f"slower than data-parallel, and give up {len(dropped_wins)} measured more than 3% "
        "faster:",
        "",
    ]
    for s in sorted(lost, key=_measured) + sorted(dropped_wins, key=_measured):
        lines.append(f"* {s.name}: {s.plan.label}, measured {s.measured:.3g}x")
    return "\n".join(lines) + "\n"


def _measured(sample: Sample) -> float:
    return sample.measured


def fit(data: list[Sample], steps: int = 30, log=print):
    """Greedy descent over the grid (the model simulates every block of a plan, so the whole
    grid would take hours): each step makes the single change of one constant to a value of
    its axis that lowers the error most, until none does. It finds a local minimum: costs
    the plans cannot tell apart (a segment's fill, a hand-off and a launch, on plans of one
    segment per block) may trade places (tests/gpu_pack/test_fit_physical.py)."""
    axes = (COMPUTE_SCALE, FILL_EXTRA_US, HANDOFF_EXTRA_US, LAUNCH_EXTRA_US, OCCUPANCY_EXPONENT)
    knobs = list(SHIPPED)
    scores: dict = {}

    def score(candidate) -> float:
        key = tuple(candidate)
        if key not in scores:
            scores[key] = error(data, key)
            log(f"{key}: {scores[key]:.2f}")
        return scores[key]

    for _ in range(steps):
        moves = [
            (score(knobs[:axis] + [v] + knobs[axis + 1 :]), axis, v)
            for axis, values in enumerate(axes)
            for v in values
        ]
        best, axis, value = min(moves)
        if best >= score(knobs):
            break
        knobs[axis] = value
    return tuple(knobs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="the folder device_run.sh wrote")
    parser.add_argument("--out", type=Path, help="markdown file (default: stdout)")
    parser.add_argument(
        "--max-tiles",
        type=int,
        default=1200,
        help="fit on kernels of at most this many tiles (the model's time grows with them)",
    )
    parser.add_argument(
        "--hold-out",
        action="store_true",
        help="fit on every other shape and report the rest beside it (a check on the fit)",
    )
    parser.add_argument(
        "--class",
        dest="cls",
        choices=sorted(SOURCES),
        default="ffma",
        help="the instruction class whose constants are fitted, on its schedules' kernels",
    )
    parser.add_argument(
        "--start",
        metavar="EFFICIENCY,FILL_US,HANDOFF_US,EXPONENT",
        help="the FFMA constants to start from instead of the shipped ones; 'before' for those "
        "before the H200 fit (0.6,0.5,1.0,1.0)",
    )
    args = parser.parse_args(argv)
    fit_class(args.cls)
    if args.start:
        text = "0.6,0.5,1.0,1.0" if args.start == "before" else args.start
        try:
            efficiency, fill, handoff, exponent = (float(v) for v in text.split(","))
        except ValueError:
            parser.error(f"--start takes four numbers or 'before', found {args.start!r}")
        start_from(efficiency, fill, handoff, exponent)

    def log(message):
        print(message, file=sys.stderr)

    run = report.Run.from_folder(args.run)
    data = [
        s
        for s in samples(run, log=log, sources=SOURCES[args.cls])
        if s.plan.tiles <= args.max_tiles
    ]
    fitted, held_out = split_by_shape(data) if args.hold_out else (data, [])
    others = []
    if args.cls == "ffma":
        others = [
            ("dynamic-M builds (not fitted)", samples(run, log=log, sources=("dlight_dynamic",)))
        ]
    start = f"from --start {args.start}" if args.start else "as shipped"
    report.emit(render(fitted, fit(fitted, log=log), held_out, others, start), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

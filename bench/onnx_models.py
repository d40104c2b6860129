"""Where the FLOPs of the ONNX model zoo go under the Stream-K Relax pipeline, as markdown.

For each model the ``onnx`` package ships (``tvm_streamk.workloads.ONNX_MODELS``), imported
with TVM's ONNX frontend and reported by :func:`tvm_streamk.model_report` for the target
(default ``nvidia/nvidia-h100``): the share of its FLOPs in kernels the project decides on, the
kernels by rule, the decisions by policy, and the largest kernel left without one. With
``--kernels`` each model's full per-kernel table follows. Nothing runs: the predicted gains are
the cost model's, not measurements.

Run ``python bench/onnx_models.py --out docs/models.md`` (about 2 minutes on two cores).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import tvm_streamk
from tvm_streamk import workloads

BEGIN, END = "<!-- onnx-models:begin -->", "<!-- onnx-models:end -->"


def summary_row(name: str, report) -> str:
    rules = collections.Counter(k.rule for k in report.kernels if k.decided)
    policies = collections.Counter(k.plan.policy for k in report.kernels if k.decided)
    missed = max((k for k in report.kernels if not k.decided), key=lambda k: k.flops or 0)
    missed_text = (
        "-"
        if not missed.flops
        else f"{missed.name} ({100 * missed.flops / report.total_flops:.1f}%)"
    )
    return (
        f"| {name} | {report.total_flops / 1e9:.2f} | {100 * report.decided_share:.1f}% "
        f"| {', '.join(f'{r} {n}' for r, n in sorted(rules.items()))} "
        f"| {', '.join(f'{p} {n}' for p, n in sorted(policies.items()))} | {missed_text} |"
    )


def table(models, target: str, kernels: bool) -> str:
    lines = [
        f"Target `{target}`; FLOPs count two per multiply-accumulate and one per other reduction",
        "step, over all calls of a kernel (`tvm_streamk.analysis.flops`).",
        "",
        "| model | GFLOP | decided | decided kernels by rule | decisions by policy "
        "| largest kernel without a decision |",
        "|---|---:|---:|---|---|---|",
    ]
    details = []
    for name in models:
        report = tvm_streamk.model_report(workloads.onnx_model(name), target)
        lines.append(summary_row(name, report))
        print(f"{name}: {100 * report.decided_share:.1f}%", file=sys.stderr)
        if kernels:
            details += ["", f"### {name}", "", "```", str(report), "```"]
    return "\n".join(lines + details) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="nvidia/nvidia-h100")
    parser.add_argument("--models", nargs="*", default=list(workloads.ONNX_MODELS))
    parser.add_argument("--kernels", action="store_true", help="each model's per-kernel table")
    parser.add_argument("--out", type=Path, help="write between the markers of this file")
    args = parser.parse_args(argv)
    text = table(args.models, args.target, args.kernels)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    doc = args.out.read_text() if args.out.exists() else f"{BEGIN}\n{END}\n"
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    args.out.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

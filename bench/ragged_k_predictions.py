"""What the cost model predicts for a mixture-of-experts weight gradient on an H100 (ragged K).

For each case (experts, their weight shape, tokens and a routing), the kernel of
:func:`tvm_streamk.moe.grouped_weight_grad_kernel` is built for the H100 tag (the reference
SIMT schedule, 64x64 tiles of 16-token panels, fp32, the workspace fix-up) and
:func:`tvm_streamk.explain` prices it at that routing on the H100's published figures: the
Stream-K walk, the kernel as written (every tile over the panels of all the tokens), and a
data-parallel kernel over each tile's own panels (:mod:`tvm_streamk.cost_model.ragged`).
Predicted microseconds, not measurements; nothing runs.

Run ``python -m bench.ragged_k_predictions`` from the repository root; ``--out FILE`` writes
the markdown table docs/ragged-k.md holds.
"""

from __future__ import annotations

import argparse

import numpy as np

import tvm_streamk
from tvm_streamk import moe
from tvm_streamk.cost_model import ragged as ragged_cost

GPU = "nvidia/nvidia-h100"
SMS = 132
TILES = (64, 64, 16, 4, 4)


def _routing(tokens: int, groups: int, hot: float) -> list[int]:
    """``tokens`` routed with a share ``hot`` to expert 0 and the rest evenly."""
    first = int(tokens * hot)
    rest = np.full(groups - 1, (tokens - first) // (groups - 1))
    rest[: (tokens - first) - int(rest.sum())] += 1
    return [first, *map(int, rest)]


# (label, experts, N, K, tokens, share of the hottest expert)
CASES = [
    ("8 experts 256x256, 4096 tokens, even", 8, 256, 256, 4096, 1 / 8),
    ("8 experts 256x256, 4096 tokens, 50% to one", 8, 256, 256, 4096, 0.5),
    ("8 experts 256x256, 4096 tokens, 90% to one", 8, 256, 256, 4096, 0.9),
    ("8 experts 1024x1024, 4096 tokens, even", 8, 1024, 1024, 4096, 1 / 8),
    ("8 experts 1024x1024, 4096 tokens, 50% to one", 8, 1024, 1024, 4096, 0.5),
    ("8 experts 1024x1024, 4096 tokens, 90% to one", 8, 1024, 1024, 4096, 0.9),
    ("64 experts 512x512, 8192 tokens, even", 64, 512, 512, 8192, 1 / 64),
    ("64 experts 512x512, 8192 tokens, 25% to one", 64, 512, 512, 8192, 0.25),
    ("8 experts 4096x1024, 16384 tokens, 50% to one", 8, 4096, 1024, 16384, 0.5),
]


def rows() -> list[dict]:
    out = []
    for label, groups, n, k, tokens, hot in CASES:
        kernel = moe.grouped_weight_grad_kernel(
            groups, n, k, target=GPU, num_sms=SMS, blocks_per_sm=1, tiles=TILES, fixup="workspace"
        )
        routing = _routing(tokens, groups, hot)
        report = tvm_streamk.explain(kernel, sizes={"group_rows": routing}, gpu=GPU, print_=False)
        panels = ragged_cost.tile_panels(routing, TILES[2], (n // TILES[0]) * (k // TILES[1]))
        plans = ragged_cost.plans(panels, -(-tokens // TILES[2]), SMS)
        per_tile = ragged_cost.predicted_times(
            {"data_parallel_per_tile": plans["data_parallel_per_tile"]},
            SMS,
            cost=tvm_streamk.cost_model.cost_for(
                tvm_streamk.analysis.first_site(kernel), GPU, "workspace"
            ),
        )["data_parallel_per_tile"]
        sk, dp = report.stats.predicted_us, report.baseline_stats.predicted_us
        out.append({"case": label, "stream_k": sk, "as_written": dp, "per_tile": per_tile})
    return out


def table(found: list[dict]) -> str:
    lines = [
        "| case | Stream-K (µs) | as written (µs) | per-tile data-parallel (µs) "
        "| Stream-K speed-up vs per-tile |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in found:
        lines.append(
            f"| {r['case']} | {r['stream_k']:.0f} | {r['as_written']:.0f} | "
            f"{r['per_tile']:.0f} | {r['per_tile'] / r['stream_k']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the markdown table here")
    args = parser.parse_args()
    text = table(rows())
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

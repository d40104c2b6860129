"""What the Stream-K heuristic decides across GEMM shapes, as a markdown table.

For each shape ``M x N x K`` cut into 128x128 output tiles and 32-wide K-panels, and for each SM
count, the table lists the policy :func:`tvm_streamk.cost_model.choose` picks, its grid and its
predicted speed-up over data-parallel under the default (uncalibrated) constants. Nothing runs on
a GPU: this shows the model's decisions, not measurements.

Run ``python bench/heuristic_table.py --sms 132 108 --fixup workspace --out table.md``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

from tvm_streamk.cost_model import FIXUPS, predicted_time
from tvm_streamk.decomposition import plan

TILE_M, TILE_N, TILE_K = 128, 128, 32
SIZES_MN = (512, 1024, 2048, 4096, 8192)
SIZES_K = (512, 2048, 8192, 16384)
FAST_SIZES_MN = (512, 2048)
FAST_SIZES_K = (512, 8192)


def _label(p) -> str:
    if p.policy == "split_k":
        return f"split_k S={p.splits}"
    if p.policy == "hybrid":
        return f"hybrid {p.variant}"
    return p.policy


def decide(m: int, n: int, k: int, num_sms: int, fixup: str) -> tuple[str, int, float]:
    """The heuristic's policy label, grid and predicted speed-up over data-parallel."""
    tiles = math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
    panels = math.ceil(k / TILE_K)
    chosen = plan(tiles, panels, num_sms, fixup=fixup)
    dp = plan(tiles, panels, num_sms, policy="data_parallel")
    speedup = predicted_time(dp, fixup=fixup) / predicted_time(chosen, fixup=fixup)
    return _label(chosen), chosen.grid, speedup


def table(sms: list[int], fixup: str, sizes_mn=SIZES_MN, sizes_k=SIZES_K) -> str:
    """Markdown table of decisions for ``M <= N`` over the size grids (tiles are symmetric)."""
    head = ["M", "N", "K", "tiles", "panels"]
    for s in sms:
        head += [f"{s} SMs: policy", "grid", "speed-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, n, k in itertools.product(sizes_mn, sizes_mn, sizes_k):
        if m > n:
            continue
        tiles = math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
        row = [str(m), str(n), str(k), str(tiles), str(math.ceil(k / TILE_K))]
        for s in sms:
            label, grid, speedup = decide(m, n, k, s, fixup)
            row += [label, str(grid), f"{speedup:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    """Print (or write) the decision table; return it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sms", type=int, nargs="+", default=[132, 108], help="SM counts")
    parser.add_argument("--out", type=Path, help="write the table here instead of stdout")
    parser.add_argument(
        "--fixup", choices=FIXUPS, default="workspace", help="the fixup the model prices"
    )
    parser.add_argument("--fast", action="store_true", help="a small grid of shapes, for CI")
    args = parser.parse_args(argv)
    if any(s < 1 for s in args.sms):
        parser.error(f"--sms must be positive ints, found {args.sms}")
    sizes = (FAST_SIZES_MN, FAST_SIZES_K) if args.fast else (SIZES_MN, SIZES_K)
    text = table(args.sms, args.fixup, *sizes)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()

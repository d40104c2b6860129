"""What the Stream-K heuristic decides across GEMM shapes, as a markdown table.

For each shape ``M x N x K`` cut into 128x128 output tiles and 32-wide K-panels of fp16 on tensor
cores (fp32 accumulation), and for each GPU of :data:`tvm_streamk.cost_model.GPU_SPECS`, the
table lists the policy :func:`tvm_streamk.cost_model.choose` picks, its grid and its predicted
speed-up over data-parallel, priced in microseconds on that GPU. Nothing runs on a GPU: this
shows the model's decisions, not measurements.

Run ``python bench/heuristic_table.py --gpu nvidia/nvidia-h100 nvidia/nvidia-a100 --fixup
workspace --out table.md``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

from tvm_streamk import fixup_registry
from tvm_streamk.cost_model import GPU_SPECS, KernelTraits, predicted_time, price, priced
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


def decide(m: int, n: int, k: int, gpu: str, fixup: str) -> tuple[str, int, float]:
    """The heuristic's policy label, grid and predicted speed-up over data-parallel on ``gpu``."""
    spec = GPU_SPECS[gpu]
    traits = KernelTraits(TILE_M, TILE_N, TILE_K, "float16", "float32", "float16", "mma", m, n, k)
    cost = priced(price(traits, spec, fixup))
    tiles = math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
    panels = math.ceil(k / TILE_K)
    chosen = plan(tiles, panels, spec.sms, cost=cost, fixup=fixup)
    dp = plan(tiles, panels, spec.sms, policy="data_parallel")
    t_dp = predicted_time(dp, cost=cost, fixup=fixup)
    return _label(chosen), chosen.grid, t_dp / predicted_time(chosen, cost=cost, fixup=fixup)


def table(gpus: list[str], fixup: str, sizes_mn=SIZES_MN, sizes_k=SIZES_K) -> str:
    """Markdown table of decisions for ``M <= N`` over the size grids (tiles are symmetric)."""
    head = ["M", "N", "K", "tiles", "panels"]
    for g in gpus:
        head += [f"{g.split('/')[-1]} ({GPU_SPECS[g].sms} SMs): policy", "grid", "speed-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, n, k in itertools.product(sizes_mn, sizes_mn, sizes_k):
        if m > n:
            continue
        tiles = math.ceil(m / TILE_M) * math.ceil(n / TILE_N)
        row = [str(m), str(n), str(k), str(tiles), str(math.ceil(k / TILE_K))]
        for g in gpus:
            label, grid, speedup = decide(m, n, k, g, fixup)
            row += [label, str(grid), f"{speedup:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    """Print (or write) the decision table; return it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gpu",
        nargs="+",
        choices=sorted(GPU_SPECS),
        default=["nvidia/nvidia-h100", "nvidia/nvidia-a100"],
        help="GPUs to price on",
    )
    parser.add_argument("--out", type=Path, help="write the table here instead of stdout")
    parser.add_argument(
        "--fixup",
        choices=fixup_registry.names(),
        default="workspace",
        help="the fixup the model prices",
    )
    parser.add_argument("--fast", action="store_true", help="a small grid of shapes, for CI")
    args = parser.parse_args(argv)
    sizes = (FAST_SIZES_MN, FAST_SIZES_K) if args.fast else (SIZES_MN, SIZES_K)
    text = table(args.gpu, args.fixup, *sizes)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()

"""The project's Stream-K heuristic beside CUTLASS 3.x's, across GEMM shapes and tile configs.

CUTLASS's SM90 persistent Stream-K scheduler picks a decomposition with a few integer rules
(:func:`cutlass_decide` restates them); this project's :func:`tvm_streamk.cost_model.choose`
predicts every candidate with a list-scheduling model and keeps the fastest. This script runs
both on seeded log-uniform GEMM shapes and on LLM projections, for three tile configurations,
and writes a markdown report: per configuration the matrix of the two choices, the agreement,
and the most frequent kinds of disagreement with a representative shape, both choices'
predicted times under the project's model and the model's own ``Plan.reason``. Nothing runs on
a GPU: these are the two heuristics' decisions, not measurements.

Run ``python bench/cutlass_heuristic.py --out docs/heuristic.md``: when the file holds the
markers ``<!-- cutlass-comparison:begin -->`` and ``<!-- cutlass-comparison:end -->`` only the
text between them is replaced, otherwise the file is written whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tvm_streamk import cost_model
from tvm_streamk.decomposition import plan

CUTLASS_SOURCE = (
    "NVIDIA/cutlass v3.9.2 (ad7b2f5e), include/cutlass/gemm/kernel/tile_scheduler_params.h, "
    "struct PersistentTileSchedulerSm90StreamKParams"
)
# CUTLASS's ``min_iters_per_sk_unit_``: the fewest k-tiles a Stream-K unit is given.
MIN_ITERS_PER_SK_UNIT = 8
BEGIN = "<!-- cutlass-comparison:begin -->"
END = "<!-- cutlass-comparison:end -->"


class Decision(NamedTuple):
    """CUTLASS's decomposition of one GEMM.

    Attributes
    ----------
    mode : str
        ``data_parallel``, ``split_k``, ``stream_k`` (every tile walked Stream-K style) or
        ``hybrid`` (CUTLASS's stream-K mode with data-parallel tiles after the Stream-K ones).
    units : int
        Work units of the linearised schedule (CUTLASS's ``units_per_problem_ * splits``): one
        per tile for data-parallel, ``tiles * splits`` for split-K, the Stream-K units plus one
        per data-parallel tile otherwise. The persistent grid itself is always one wave of CTAs.
    splits : int
        K splits per tile (split-K), else 1.
    sk_units : int
        CTAs sharing the Stream-K tiles' iterations (0 unless stream-K or hybrid).
    sk_tiles : int
        Tiles walked Stream-K style (split-K: all of them).
    rule : str
        The rule that decided, one of :data:`RULES`.
    """

    mode: str
    units: int
    splits: int
    sk_units: int
    sk_tiles: int
    rule: str


RULES = {
    "full_waves": "the tiles fill whole waves",
    "short_k": f"at most {MIN_ITERS_PER_SK_UNIT} k-tiles per tile",
    "tail_half_full": "the last wave is at least half full",
    "split_k": "its Stream-K units are a multiple of the tiles",
    "stream_k": "one wave or less, or one full wave plus a short tail",
    "dp_plus_sk": "two or more full waves plus a short tail",
}


def _log_swizzle(tiles_m: int, tiles_n: int, max_swizzle: int) -> int:
    smaller = min(tiles_m, tiles_n)
    for log, (need_swizzle, need_tiles) in ((3, (8, 6)), (2, (4, 3)), (1, (2, 2))):
        if max_swizzle >= need_swizzle and smaller >= need_tiles:
            return log
    return 0


def cutlass_decide(
    tiles_m: int,
    tiles_n: int,
    k_tiles: int,
    sm_count: int,
    ctas_per_sm: int = 1,
    max_swizzle: int = 1,
) -> Decision:
    """CUTLASS 3.x's Stream-K decomposition of a ``tiles_m x tiles_n`` GEMM of ``k_tiles`` k-tiles.

    A restatement, in this project's words, of ``PersistentTileSchedulerSm90StreamKParams``
    (:data:`CUTLASS_SOURCE`; unchanged through 4.x) with its default arguments: decomposition
    mode ``Heuristic``, ``splits = 1``, 1x1 clusters. One wave is ``W = sm_count * ctas_per_sm``
    CTAs; CUTLASS itself counts ``sm_count`` (``get_grid_shape`` for 1x1 clusters), i.e.
    ``ctas_per_sm = 1``. The rules, in the order the source applies them:

    0. ``get_log_swizzle_size``: with ``max_swizzle`` > 1 both tile counts are first rounded up
       to a multiple of the swizzle (``2**log``, ``log`` from 1 to 3 as the smaller count reaches
       2, 3, 6); the default ``max_swizzle = 1`` leaves them alone.
    1. ``get_num_sk_tiles``: data-parallel when the tiles fill whole waves (``full_waves ==
       total_waves``), or when a tile has at most ``min_iters_per_sk_unit_ = 8`` k-tiles.
    2. ``get_num_sk_tiles`` (``Heuristic`` mode only): data-parallel when the last wave holds
       ``tail >= W / 2`` tiles. With no full wave the tail is all the tiles, so one wave at least
       half full stays data-parallel too.
    3. ``get_num_sk_tiles``: otherwise ``full_waves - 1`` full waves of tiles stay
       data-parallel and the rest (the tail plus one full wave; every tile when there is at
       most one full wave) are the ``sk_tiles`` Stream-K tiles, which come first.
    4. ``get_num_sk_units``: ``sk_units = min(W, sk_tiles * k_tiles // 8)``, so that no unit gets
       fewer than 8 k-tiles; it only falls below ``W`` when there is no full wave.
    5. ``select_decomposition_mode``: split-K with ``splits = sk_units / sk_tiles`` when
       ``sk_units > sk_tiles`` and divides by it. That needs ``sk_tiles < W``, i.e. no full
       wave, so it covers every tile (``set_params_basic``).
    6. ``select_decomposition_mode`` / ``set_params_stream_k``: otherwise stream-K: ``sk_units``
       units share the ``sk_tiles * k_tiles`` iterations and the scheduler (``assign_work`` in
       ``sm90_tile_scheduler_stream_k.hpp``) hands units ``>= sk_units`` the data-parallel
       tiles after them: with two or more full waves this is the data-parallel + "two-tile"
       Stream-K hybrid of the Stream-K paper (this project's ``hybrid(two_tile)``).

    Not restated: the grouping of Stream-K units (``calculate_groups``, up to 8 groups for L2
    locality), which changes who computes which iterations but not the mode, and the separate
    reduction, which ``should_perform_separate_reduction`` disables.

    Parameters
    ----------
    tiles_m, tiles_n : int
        Output tiles along M and N (``ceil(M / BM)``, ``ceil(N / BN)``).
    k_tiles : int
        K-tiles per output tile (``ceil(K / BK)``).
    sm_count : int
        SMs of the GPU.
    ctas_per_sm : int
        CTAs resident per SM that make up a wave (see above).
    max_swizzle : int
        CUTLASS's ``max_swizzle_size`` argument.

    Returns
    -------
    Decision

    Examples
    --------
    >>> cutlass_decide(33, 8, 64, 132)  # 264 tiles: two full waves
    Decision(mode='data_parallel', units=264, splits=1, sk_units=0, sk_tiles=0, rule='full_waves')
    >>> cutlass_decide(11, 1, 64, 132)  # 11 tiles, 88 units of 8 k-tiles: split 8 ways
    Decision(mode='split_k', units=88, splits=8, sk_units=88, sk_tiles=11, rule='split_k')
    >>> cutlass_decide(40, 10, 64, 132).mode  # 3 full waves and 4 tiles
    'hybrid'
    """
    for name, value in (
        ("tiles_m", tiles_m),
        ("tiles_n", tiles_n),
        ("k_tiles", k_tiles),
        ("sm_count", sm_count),
        ("ctas_per_sm", ctas_per_sm),
        ("max_swizzle", max_swizzle),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, found {value!r}")
    swizzle = 1 << _log_swizzle(tiles_m, tiles_n, max_swizzle)
    tiles = -(-tiles_m // swizzle) * swizzle * (-(-tiles_n // swizzle) * swizzle)
    wave = sm_count * ctas_per_sm
    full = tiles // wave
    tail = tiles - full * wave

    def data_parallel(rule: str) -> Decision:
        return Decision("data_parallel", tiles, 1, 0, 0, rule)

    if tail == 0:
        return data_parallel("full_waves")
    if k_tiles <= MIN_ITERS_PER_SK_UNIT:
        return data_parallel("short_k")
    if 2 * tail >= wave:
        return data_parallel("tail_half_full")
    sk_tiles = tiles - max(full - 1, 0) * wave
    sk_units = min(wave, sk_tiles * k_tiles // MIN_ITERS_PER_SK_UNIT)
    if sk_units > sk_tiles and sk_units % sk_tiles == 0:
        splits = sk_units // sk_tiles
        return Decision("split_k", tiles * splits, splits, sk_units, tiles, "split_k")
    dp_tiles = tiles - sk_tiles
    mode, rule = ("hybrid", "dp_plus_sk") if dp_tiles else ("stream_k", "stream_k")
    return Decision(mode, sk_units + dp_tiles, 1, sk_units, sk_tiles, rule)


@dataclass(frozen=True)
class TileConfig:
    """A kernel's tile and its occupancy on the GPU compared.

    Attributes
    ----------
    name : str
    bm, bn, bk : int
        Output tile and K-panel (CUTLASS's k-tile).
    warps : int
        Warps per block, for :func:`tvm_streamk.cost_model.saturation`.
    blocks_per_sm : int
        Resident blocks per SM of the kernel: both sides' wave is ``num_sms * blocks_per_sm``.
    source : str
        Where the tile and its occupancy come from.
    """

    name: str
    bm: int
    bn: int
    bk: int
    warps: int
    blocks_per_sm: int
    source: str

    @property
    def saturation(self) -> int:
        return cost_model.saturation(self.warps, self.blocks_per_sm)


# Occupancies are ptxas's (CUDA 13.0, sm_90) for the data-parallel kernels, read with
# tvm_streamk.resources.kernel_uses; the tensor-core tile is the one the cost model's constants
# describe, and dlight's WMMA kernel (16 warps, 106 registers, 72 KiB) holds one block per SM.
CONFIGS = (
    TileConfig(
        "tensor-core 128x128x32",
        128,
        128,
        32,
        8,
        1,
        "the 128x128x32 fp16 tile of the cost model's constants; one block per SM, like "
        "dlight's WMMA kernel (512 threads, 106 registers, 72 KiB shared)",
    ),
    TileConfig(
        "SIMT 64x64x16",
        64,
        64,
        16,
        8,
        4,
        "tvm_streamk.workloads.reference_schedule(bm=64, bn=64, bk=16): 256 threads, "
        "64 registers, 8 KiB shared: 4 blocks per SM (registers)",
    ),
    TileConfig(
        "dlight fp32 32x64x16",
        32,
        64,
        16,
        4,
        8,
        "dlight.gpu.Matmul's CUDA config (8x16 threads of 4x4 outputs, micro_size_k 16): "
        "128 threads, 64 registers, 6.75 KiB shared: 8 blocks per SM (registers)",
    ),
)

# (model, projection, in_features, out_features): each is an (M = tokens, N = out, K = in) GEMM.
LLM_PROJECTIONS = (
    ("Llama-2-7B", "qkv", 4096, 12288),
    ("Llama-2-7B", "o", 4096, 4096),
    ("Llama-2-7B", "gate/up", 4096, 11008),
    ("Llama-2-7B", "down", 11008, 4096),
    ("Llama-2-70B", "qkv", 8192, 10240),
    ("Llama-2-70B", "o", 8192, 8192),
    ("Llama-2-70B", "gate/up", 8192, 28672),
    ("Llama-2-70B", "down", 28672, 8192),
    ("GPT-2", "qkv", 768, 2304),
    ("GPT-2", "proj", 768, 768),
    ("GPT-2", "fc", 768, 3072),
    ("GPT-2", "fc proj", 3072, 768),
)
LLM_TOKENS = (16, 128, 512, 2048, 4096)


def random_shapes(count: int, seed: int, low: int = 128, high: int = 16384) -> list[tuple]:
    """``count`` ``(M, N, K)`` drawn log-uniformly from ``[low, high]`` by numpy's PCG64."""
    rng = np.random.default_rng(seed)
    draws = np.exp(rng.uniform(math.log(low), math.log(high), size=(count, 3)))
    return [tuple(int(v) for v in np.rint(row)) for row in draws]


def llm_shapes() -> list[tuple]:
    """``(M, N, K)`` of the LLM projections at each token count in :data:`LLM_TOKENS`."""
    return [(t, n, k) for _, _, k, n in LLM_PROJECTIONS for t in LLM_TOKENS]


# Counts along a plan's critical chain (cost_model.critical_features): iteration units (K-panel
# iterations times the blocks sharing their SM), segments, partial-tile transfers, launches.
Chain = tuple[float, float, float, float]


@dataclass(frozen=True)
class Row:
    """Both heuristics' choice for one shape and tile configuration.

    ``ours_chain`` and ``cutlass_chain`` are the critical chains of the two plans under the
    project's model; they are only computed (and only needed) when the plans differ.
    """

    config: str
    shape: tuple[int, int, int]
    tiles: int
    k_tiles: int
    wave: int
    ours: str
    ours_policy: str
    ours_grid: int
    ours_reason: str
    cutlass: Decision
    cutlass_plan: str
    cutlass_grid: int
    ours_chain: Chain | None = None
    cutlass_chain: Chain | None = None

    @property
    def same_mode(self) -> bool:
        return self.ours_policy == self.cutlass.mode

    @property
    def same_plan(self) -> bool:
        return (self.ours, self.ours_grid) == (self.cutlass_plan, self.cutlass_grid)

    @property
    def t_ours(self) -> float:
        return _units(self.ours_chain)

    @property
    def t_cutlass(self) -> float:
        return _units(self.cutlass_chain)

    @property
    def ratio(self) -> float:
        """CUTLASS's predicted time over ours."""
        return self.t_cutlass / self.t_ours


def _units(chain: Chain | None) -> float:
    if chain is None:
        raise ValueError("the plans agree, so their chains were not computed")
    return float(np.dot(chain, cost_model.DEFAULT_COST.vector()))


def _cutlass_plan(d: Decision, tiles: int, panels: int, num_sms: int, bps: int):
    """The project's plan of CUTLASS's decomposition, for its predicted time."""
    if d.mode == "stream_k":
        # A grid of sk_units blocks; its time is predicted with them spread over all the SMs.
        return plan(tiles, panels, d.sk_units, 1, "stream_k")
    if d.mode == "split_k":
        return plan(tiles, panels, num_sms, bps, "split_k", splits=d.splits)
    if d.mode == "hybrid":
        p = plan(tiles, panels, num_sms, bps, "hybrid", variant="two_tile")
        if (p.sk_tiles, p.grid) != (d.sk_tiles, d.sk_units):
            raise AssertionError(f"CUTLASS's dp + sk {d} is not hybrid(two_tile) {p}")
        return p
    # CUTLASS's CTAs loop over the tiles; the project's data-parallel plan launches a block per
    # tile, so the model charges it a launch per wave that CUTLASS does not pay (a caveat in
    # docs/heuristic.md, "How the comparison is set up").
    return plan(tiles, panels, num_sms, bps, "data_parallel")


def compare(task: tuple[TileConfig, tuple[int, int, int], int]) -> Row:
    """Both choices for one ``(config, (M, N, K), num_sms)``."""
    config, (m, n, k), num_sms = task
    tiles_m, tiles_n, panels = -(-m // config.bm), -(-n // config.bn), -(-k // config.bk)
    tiles, bps, busy = tiles_m * tiles_n, config.blocks_per_sm, config.saturation
    ours = cost_model.choose(
        tiles, panels, num_sms, bps, dp_blocks_per_sm=bps, saturation=busy, fixup="workspace"
    )
    decision = cutlass_decide(tiles_m, tiles_n, panels, num_sms, bps)
    theirs = _cutlass_plan(decision, tiles, panels, num_sms, bps)
    row = Row(
        config.name,
        (m, n, k),
        tiles,
        panels,
        num_sms * bps,
        ours.label,
        ours.policy,
        ours.grid,
        ours.reason,
        decision,
        theirs.label,
        theirs.grid,
    )
    if row.same_plan:
        return row

    def chain(p) -> Chain:
        return cost_model.critical_features(
            p, num_sms=num_sms, blocks_per_sm=bps, fixup="workspace", saturation=busy
        )

    return dataclasses.replace(row, ours_chain=chain(ours), cutlass_chain=chain(theirs))


# Why a kind of disagreement happens, keyed by (CUTLASS's rule, the project's policy): the
# mechanism on each side, checked against the critical chains of the classes' members. The
# report quotes the numbers next to it.
WHY = {
    ("stream_k", "split_k"): (
        "Fewer tiles than half a wave (or one wave plus a short tail) with long K. CUTLASS "
        "walks them Stream-K over min(wave, iterations / 8) units, which puts about wave / "
        "tiles peers on a tile and two tile segments on most units; in the model the owner "
        "reads every peer's partial in turn (`c_fix` each), so it prefers split-K into a few "
        "splits, one segment per block"
    ),
    ("dp_plus_sk", "data_parallel"): (
        "Two or more full waves and a short tail. CUTLASS always moves the tail plus one wave "
        "into Stream-K; the model predicts that hybrid at most a few per cent faster (the tail "
        "costs at most one tile's time over several waves), so under the 3% `min_gain` it keeps "
        "data-parallel, or slower at short K, where the Stream-K segments and fix-ups outweigh "
        "the tail"
    ),
    ("stream_k", "data_parallel"): (
        "A short tail or a small single wave, mostly at short K. The Stream-K chain carries "
        "one more segment and one or more partial transfers (`c_seg + c_fix` = 12 units and "
        "up), more than the K-loop it saves when a tile has few k-tiles; CUTLASS's only bound "
        "is 8 k-tiles per unit. With several blocks per SM a second reason adds to it: CUTLASS "
        "counts the wave in CTAs, while in the model blocks beyond `saturation` per SM add no "
        "throughput, so a wave that is partly empty in CTAs can already keep every SM busy"
    ),
    ("tail_half_full", "stream_k"): (
        "The last (or only) wave at least half full, at long K. CUTLASS's rule weighs the "
        "tail's size only; its idle part costs up to half of one tile's K-loop, which at long "
        "K exceeds Stream-K's fixed segment and fix-up costs, so the model balances all the "
        "tiles over one wave"
    ),
    ("split_k", "split_k"): (
        "Both split every tile. CUTLASS into sk_units / tiles = min(wave / tiles, k-tiles / 8) "
        "parts: as many as fit in a wave, each of at least 8 k-tiles. At long K that is more "
        "than the model's choice, whose owner reads the S - 1 partials in turn (and which tries "
        "at most 16 splits within two waves); at short K it can be fewer, where the model "
        "splits further to use more of the idle SMs"
    ),
    ("tail_half_full", "hybrid"): (
        "Several waves, the last at least half full. The model's hybrid still clears the 3% "
        "margin: at long K by the idle part of the last wave, at short K by the launches its "
        "persistent grid saves (`c_block` per tile, which CUTLASS's persistent data-parallel "
        "mode saves too)"
    ),
    ("split_k", "data_parallel"): (
        "A few tiles of 16 to 24 k-tiles. CUTLASS splits them into units of 8 k-tiles; in the "
        "model a split's segment and partial transfers cost more than the k-tiles it saves"
    ),
    ("short_k", "hybrid"): (
        "Many waves of tiles of at most 8 k-tiles. CUTLASS does not split them; the model's "
        "hybrid moves a few tiles to Stream-K but runs on a persistent grid, which saves a "
        "launch (`c_block`) per tile and wave, several per cent of a tile this short. "
        "CUTLASS's data-parallel mode is persistent too, so this is a difference between the "
        "project's data-parallel plan and CUTLASS's rather than between the heuristics"
    ),
    ("tail_half_full", "split_k"): (
        "One wave at least half full and no full wave. CUTLASS's `2 * tail >= wave` keeps "
        "data-parallel without a full wave too (the source's comment says 'more than one "
        "wave'; the condition does not test it); at exactly half a wave the model splits every "
        "tile in two and fills the wave"
    ),
}


def _pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.1f}%)" if whole else "-"


def _shape(row: Row) -> str:
    m, n, k = row.shape
    return f"{m}x{n}x{k}"


def _chain(chain: Chain | None) -> str:
    it, seg, fix, blk = chain
    return f"{it:.0f} it + {seg:.0f} seg + {fix:.0f} fix + {blk:.0f} blk = {_units(chain):.0f}"


def _class_key(row: Row) -> tuple[str, str]:
    return (row.cutlass.rule, row.ours_policy)


def _matrix(rows: Sequence[Row]) -> list[str]:
    ours_keys = ["data_parallel", "split_k", "stream_k", "hybrid(one_tile)", "hybrid(two_tile)"]
    theirs_keys = ["data_parallel", "split_k", "stream_k", "hybrid"]

    def ours_key(r: Row) -> str:
        return r.ours if r.ours_policy == "hybrid" else r.ours_policy

    counts = Counter((ours_key(r), r.cutlass.mode) for r in rows)
    head = ["ours \\ CUTLASS", *theirs_keys, "total"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for o in ours_keys:
        cells = [counts[(o, t)] for t in theirs_keys]
        lines.append(f"| {o} | " + " | ".join(str(c) for c in cells) + f" | {sum(cells)} |")
    totals = [sum(counts[(o, t)] for o in ours_keys) for t in theirs_keys]
    lines.append("| total | " + " | ".join(str(c) for c in totals) + f" | {len(rows)} |")
    return lines


def _summary(rows_by_config: dict[str, list[Row]], configs, literal) -> list[str]:
    out = [
        "| configuration | decisions | same mode | same plan | at most 8 k-tiles: both "
        "data-parallel | same mode if CUTLASS's wave is one CTA per SM |",
        "|---|---|---|---|---|---|",
    ]
    for c in configs:
        rows = rows_by_config[c.name]
        short = [r for r in rows if r.k_tiles <= MIN_ITERS_PER_SK_UNIT]
        short_dp = sum(r.ours_policy == "data_parallel" for r in short)
        out.append(
            f"| {c.name} | {len(rows)} | {_pct(sum(r.same_mode for r in rows), len(rows))} | "
            f"{_pct(sum(r.same_plan for r in rows), len(rows))} | {_pct(short_dp, len(short))} | "
            f"{_pct(*literal[c.name])} |"
        )
    rows = [r for c in configs for r in rows_by_config[c.name]]
    out.append(
        f"| all | {len(rows)} | {_pct(sum(r.same_mode for r in rows), len(rows))} | "
        f"{_pct(sum(r.same_plan for r in rows), len(rows))} | | |"
    )
    return out


def _classes(rows: Sequence[Row], configs: Sequence[TileConfig], top: int) -> list[str]:
    classes: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        if not r.same_plan:
            classes.setdefault(_class_key(r), []).append(r)
    ranked = sorted(classes.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:top]
    out = [
        "| # | CUTLASS: rule -> mode | ours | "
        + " | ".join(c.name for c in configs)
        + " | median k-tiles | median tiles / wave | CUTLASS / ours, model time: median "
        "(range) | CUTLASS's faster |",
        "|---|---|---|" + "---|" * len(configs) + "---|---|---|---|",
    ]
    for i, ((rule, policy), members) in enumerate(ranked, 1):
        per = Counter(r.config for r in members)
        ratios = sorted(r.ratio for r in members)
        out.append(
            f"| {i} | {rule} -> {members[0].cutlass.mode} | {policy} | "
            + " | ".join(str(per[c.name]) for c in configs)
            + f" | {statistics.median(r.k_tiles for r in members):.0f}"
            f" | {statistics.median(r.tiles / r.wave for r in members):.2f}"
            f" | {statistics.median(ratios):.3f}x ({ratios[0]:.2f}x to {ratios[-1]:.2f}x)"
            f" | {sum(x < 1 for x in ratios)} |"
        )
    out.append("")
    for i, ((rule, policy), members) in enumerate(ranked, 1):
        why = WHY.get((rule, policy), "No mechanism recorded for this class; compare the chains")
        out.append(
            f"{i}. **CUTLASS: {RULES[rule]} -> {members[0].cutlass.mode}; ours: {policy}** "
            f"({len(members)}). {why}."
        )
        for c in configs:
            mine = sorted((r for r in members if r.config == c.name), key=lambda r: r.ratio)
            if not mine:
                continue
            rep = mine[len(mine) // 2]
            d = rep.cutlass
            out.append(
                f"   * {c.name}: {_shape(rep)}, {rep.tiles} tiles of {rep.k_tiles} k-tiles, "
                f"wave {rep.wave}. Ours {rep.ours} on {rep.ours_grid} blocks: "
                f"{_chain(rep.ours_chain)}. CUTLASS {rep.cutlass_plan} on "
                f"{d.sk_units or rep.cutlass_grid} units: {_chain(rep.cutlass_chain)}. "
                f"`{rep.ours_reason}`"
            )
    return out


def report(
    rows_by_config: dict[str, list[Row]],
    configs: Sequence[TileConfig],
    num_sms: int,
    header: Iterable[str],
    literal: dict[str, tuple[int, int]],
    top: int,
) -> str:
    """The markdown report of :func:`main`."""
    out = list(header) + [
        "",
        "| configuration | tile | warps | blocks/SM | saturation | wave | where from |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in configs:
        out.append(
            f"| {c.name} | {c.bm}x{c.bn}x{c.bk} | {c.warps} | {c.blocks_per_sm} | "
            f"{c.saturation} | {num_sms * c.blocks_per_sm} | {c.source} |"
        )
    out += ["", *_summary(rows_by_config, configs, literal), ""]
    for c in configs:
        rows = rows_by_config[c.name]
        rules = Counter(r.cutlass.rule for r in rows)
        out += [f"#### {c.name}: the project's policy x CUTLASS's mode", "", *_matrix(rows), ""]
        out += [
            "CUTLASS's deciding rules: "
            + ", ".join(f"{k} {v}" for k, v in rules.most_common())
            + ".",
            "",
        ]
    everything = [r for c in configs for r in rows_by_config[c.name]]
    out += [
        "#### The most frequent disagreements",
        "",
        "A class is CUTLASS's deciding rule and the project's policy; where both name the same "
        "mode they differ in the splits, the hybrid or the units. Times are the project's "
        "model's, in units of one K-panel iteration of one tile; \"CUTLASS's faster\" counts the "
        "shapes where the model predicts CUTLASS's plan faster than its own pick (by less than "
        "the 3% margin). Each example is the class member of median time ratio in that "
        "configuration, with both plans' critical chains: iteration units (K-panel iterations "
        "times the resident blocks sharing the SM), segments (6 units each), partial-tile "
        "transfers (6 each) and block launches (1 each).",
        "",
        *_classes(everything, configs, top),
    ]
    return "\n".join(out) + "\n"


def _literal_agreement(rows: Sequence[Row], config: TileConfig, num_sms: int) -> tuple[int, int]:
    """Mode agreement when CUTLASS's wave is one CTA per SM, as in its source."""
    same = 0
    for r in rows:
        m, n, _ = r.shape
        d = cutlass_decide(-(-m // config.bm), -(-n // config.bn), r.k_tiles, num_sms, 1)
        same += d.mode == r.ours_policy
    return same, len(rows)


def _write(path: Path, text: str) -> None:
    if path.exists():
        old = path.read_text()
        if BEGIN in old and END in old:
            head, rest = old.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            path.write_text(f"{head}{BEGIN}\n\n{text}\n{END}{tail}")
            return
    path.write_text(text)


def main(argv: list[str] | None = None) -> str:
    """Compare the two heuristics; print (or write) the report and return it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="random shapes")
    parser.add_argument("--seed", type=int, default=12, help="numpy seed of the random shapes")
    parser.add_argument("--sms", type=int, default=132, help="SMs of the GPU (H100 SXM: 132)")
    parser.add_argument("--no-llm", action="store_true", help="leave out the LLM projections")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--top", type=int, default=10, help="disagreement classes listed")
    parser.add_argument("--out", type=Path, help="write here (between the markers if present)")
    parser.add_argument("--fast", action="store_true", help="40 random shapes, no LLM ones (CI)")
    args = parser.parse_args(argv)
    for name in ("count", "sms", "jobs", "top"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive int, found {getattr(args, name)}")
    count = 40 if args.fast else args.count
    llm = [] if args.no_llm or args.fast else llm_shapes()
    shapes = random_shapes(count, args.seed) + llm
    tasks = [(c, s, args.sms) for c in CONFIGS for s in shapes]
    start = time.perf_counter()
    if args.jobs == 1:
        rows = [compare(t) for t in tasks]
    else:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            rows = pool.map(compare, tasks, chunksize=4)
    # On stderr, so that the report stays the same from run to run.
    print(
        f"{len(tasks)} decisions in {time.perf_counter() - start:.0f} s with {args.jobs} "
        "worker process(es)",
        file=sys.stderr,
    )
    by_config = {c.name: [r for r in rows if r.config == c.name] for c in CONFIGS}
    literal = {c.name: _literal_agreement(by_config[c.name], c, args.sms) for c in CONFIGS}
    flags = " --fast" if args.fast else f" --count {count}"
    flags += " --no-llm" if args.no_llm and not args.fast else ""
    llm_text = f" plus the {len(llm)} LLM projections below" if llm else ""
    header = [
        f"Generated by `python bench/cutlass_heuristic.py{flags} --seed {args.seed} --sms "
        f"{args.sms}`: {count} (M, N, K) drawn log-uniformly from [128, 16384] (numpy "
        f"`default_rng({args.seed})`){llm_text}, each cut into the three tiles below: "
        f"{len(tasks)} decisions per side on {args.sms} SMs.",
    ]
    if llm:
        models = sorted({m for m, *_ in LLM_PROJECTIONS})
        header.append("")
        header.append(
            "LLM projections (M = tokens "
            + ", ".join(map(str, LLM_TOKENS))
            + "; N x K = out x in features): "
            + "; ".join(
                f"{model} "
                + ", ".join(f"{p} {n}x{k}" for m, p, k, n in LLM_PROJECTIONS if m == model)
                for model in models
            )
            + "."
        )
    text = report(by_config, CONFIGS, args.sms, header, literal, args.top)
    if args.out is None:
        sys.stdout.write(text)
    else:
        _write(args.out, text)
    return text


if __name__ == "__main__":
    main()

"""The GEMM shapes of the GPU proof pack: a seeded sweep and the cases Stream-K is about.

Plain Python, no TVM: ``sweep()`` and ``tiny()`` return :class:`Shape` records whose ``cls``
names the shape class the report groups speed-ups by, and whose ``suite`` names the kernels the
pack builds for it (:data:`bench.gpu.kernels.SUITES`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

LOW, HIGH = 128, 16384
SEED = 13
RANDOM_SHAPES = 220
# Streaming multiprocessors the wave-quantised shapes are cut for (H100 and H200).
WAVE_SMS = 132

# (model, [(matmul, K, N)]) with C[tokens, N] = X[tokens, K] @ W[K, N].
MODELS = {
    "llama2-7b": [("qkv", 4096, 12288), ("o", 4096, 4096), ("gate_up", 4096, 22016),
                  ("down", 11008, 4096)],
    "llama2-70b": [("qkv", 8192, 10240), ("o", 8192, 8192), ("gate_up", 8192, 57344),
                   ("down", 28672, 8192)],
    "gpt2": [("qkv", 768, 2304), ("proj", 768, 768), ("fc", 768, 3072), ("fc_proj", 3072, 768)],
}  # fmt: skip
TOKENS = (1, 16, 128, 512, 2048, 4096)
# The tensor-core sweep: prefill token counts and random shapes (:func:`tensor_core_shapes`).
TENSOR_TOKENS = (128, 512, 2048, 4096)
TENSOR_RANDOM_SHAPES = 16
# Few output tiles, long reductions: data-parallel leaves most SMs idle for the whole kernel.
LONG_K = [(128, 128, 65536), (256, 128, 65536), (256, 256, 32768), (128, 512, 16384),
          (512, 512, 16384), (384, 384, 8192)]  # fmt: skip
# Tile shapes (bm, bn) of the schedules in the pack, for the one-more-than-a-wave shapes.
WAVE_TILES = [(128, 128), (64, 64), (32, 64)]
# Shapes every suite is built for in full (all decompositions of every schedule source).
FOCUS = [(4256, 256, 4096), (896, 2432, 4096), (512, 512, 16384), (2048, 2048, 2048)]


@dataclass(frozen=True)
class Shape:
    """One GEMM ``C[m, n] = A[m, k] @ B[k, n]`` of the pack."""

    m: int
    n: int
    k: int
    cls: str
    suite: str
    note: str = ""
    # A dynamic-M kernel: built once with a symbolic M (``m`` is then 0), run at each of these.
    run_ms: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        return f"{'dynM' if self.run_ms else self.m}x{self.n}x{self.k}"


def _log_uniform(rng: random.Random) -> int:
    value = math.exp(rng.uniform(math.log(LOW), math.log(HIGH)))
    return min(HIGH, max(LOW, 8 * round(value / 8)))


def _near_square_factors(tiles: int) -> tuple[int, int]:
    best = (1, tiles)
    for rows in range(1, math.isqrt(tiles) + 1):
        if tiles % rows == 0:
            best = (rows, tiles // rows)
    return best


def random_shapes(count: int = RANDOM_SHAPES, seed: int = SEED) -> list[Shape]:
    """``count`` shapes with m, n, k drawn log-uniformly from [128, 16384] (multiples of 8)."""
    rng = random.Random(seed)
    return [
        Shape(_log_uniform(rng), _log_uniform(rng), _log_uniform(rng), "random", "sweep")
        for _ in range(count)
    ]


def model_shapes(tokens=TOKENS) -> list[Shape]:
    """The linear layers of Llama-2-7B, Llama-2-70B and GPT-2 at each token count."""
    return [
        Shape(t, n, k, f"model-{'decode' if t <= 16 else 'prefill'}", "sweep", f"{model} {name}")
        for model, layers in MODELS.items()
        for name, k, n in layers
        for t in tokens
    ]


def long_k_shapes() -> list[Shape]:
    return [Shape(m, n, k, "long-k", "sweep") for m, n, k in LONG_K]


def wave_shapes(num_sms: int = WAVE_SMS) -> list[Shape]:
    """Tile counts one more than one and two full waves of ``num_sms``, per tile shape."""
    shapes = []
    for bm, bn in WAVE_TILES:
        for tiles in (num_sms + 1, 2 * num_sms + 1):
            rows, cols = _near_square_factors(tiles)
            for k in (1024, 4096):
                note = f"{tiles} tiles of {bm}x{bn}"
                shapes.append(Shape(rows * bm, cols * bn, k, "wave+1", "sweep", note))
    return shapes


def focus_shapes() -> list[Shape]:
    return [Shape(m, n, k, "focus", "focus") for m, n, k in FOCUS]


def _unique(shapes: list[Shape]) -> list[Shape]:
    seen, out = set(), []
    for shape in shapes:
        if (shape.key, shape.suite) not in seen:
            seen.add((shape.key, shape.suite))
            out.append(shape)
    return out


def _round_robin(groups: list[list[Shape]]) -> list[Shape]:
    out = []
    for i in range(max(len(g) for g in groups)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def tensor_core_shapes() -> list[Shape]:
    """fp16 tensor-core builds (suite ``sweep-wmma``): the models' prefill layers, the long
    reductions, the one-more-than-a-wave shapes and a few random ones, so that the run measures
    the tensor-core constants of the microsecond model over more than the focus shapes."""
    prefill = [s for s in model_shapes(TENSOR_TOKENS) if not s.note.startswith("llama2-70b")]
    rng = random.Random(SEED + 1)
    drawn = [
        Shape(_log_uniform(rng), _log_uniform(rng), _log_uniform(rng), "random", "")
        for _ in range(TENSOR_RANDOM_SHAPES)
    ]
    every = prefill + long_k_shapes() + wave_shapes() + drawn
    # The focus suite builds its shapes' tensor-core kernels already (the same names).
    every = [s for s in every if (s.m, s.n, s.k) not in FOCUS]
    return [dataclasses.replace(s, suite="sweep-wmma") for s in every]


def sweep() -> list[Shape]:
    """The full sweep: the tiny shapes (which carry the sanitizer's kernels) and the focus
    shapes first, then the classes taken in turn, so that a run trimmed by its time budget
    still covers every class."""
    classes = [
        wave_shapes(),
        long_k_shapes(),
        model_shapes(),
        random_shapes(),
        tensor_core_shapes(),
    ]
    return _unique(tiny() + focus_shapes() + dynamic_shapes() + _round_robin(classes))


def dynamic_shapes(tokens=TOKENS) -> list[Shape]:
    """Dynamic-M kernels of the models' matmuls, each built once and run at every token count
    (a Relax model with a symbolic sequence length compiles each matmul once)."""
    picked = [("gpt2", "fc"), ("llama2-7b", "o"), ("llama2-7b", "down")]
    out = []
    for model, name in picked:
        k, n = next((k, n) for mm, k, n in MODELS[model] if mm == name)
        note = f"{model} {name}, symbolic tokens"
        out.append(Shape(0, n, k, "model-dynamic", "dynamic", note, tuple(tokens)))
    return out


def tiny() -> list[Shape]:
    """Four shapes for CI: one suite each, small enough to build in a minute or two on 2 cores."""
    return [
        # 12 x 12 tiles of 64 x 64: one more than a wave of 132 blocks, 12 tiles left over.
        Shape(768, 768, 1024, "focus", "tiny-reference", "every decomposition, reference"),
        Shape(256, 256, 8192, "long-k", "tiny-dlight", "dlight fp32"),
        Shape(512, 384, 1024, "focus", "tiny-wmma", "dlight fp16 tensor cores"),
        # One build of a dynamic-M dlight kernel, run at 1, 100 and 4097 rows.
        Shape(
            0, 768, 3072, "model-dynamic", "tiny-dynamic", "dlight fp32, symbolic M", (1, 100, 4097)
        ),
    ]


def dynamic() -> list[Shape]:
    """The dynamic-M kernels alone (the sweep's and the tiny set's): a pack small enough to
    build and run again beside a sweep."""
    return _unique([s for s in tiny() if s.run_ms] + dynamic_shapes())


SETS = {"sweep": sweep, "tiny": tiny, "dynamic": dynamic}

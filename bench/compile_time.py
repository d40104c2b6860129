"""How much longer a model takes to compile with Stream-K decisions than with stock TVM.

For each model, in one run on the same machine: ``tvm.compile(mod, target)`` (TVM's default
CUDA pipeline, dlight's rules), the same for the arch TVM 0.27's dlight parses (``sm_90`` for
the tag's ``sm_90a``, which it reads as no tensor cores: the tensor-core schedules the pipeline
gives, ``_compat.dlight_cuda_target``) and ``tvm.compile(mod, target,
relax_pipeline=tvm_streamk.relax_pipeline(target), tir_pipeline="tvm_streamk")``, timed in
turn, with the pipeline's ratio to each. Models: SqueezeNet from the ``onnx`` package's test
data, and a Llama-style transformer block written with ``tvm.relax.frontend.nn`` (RMSNorm,
attention projections, SwiGLU MLP; the sequence length symbolic). Nothing runs on a GPU; the
CUDA source is generated, and nvcc runs only where the decision reads a kernel's registers.

Run ``python bench/compile_time.py`` (``--models squeezenet`` for one; ``--repeat 3`` for the
best of three alternating runs each).
"""

from __future__ import annotations

import argparse
import importlib
import time

import tvm
from tvm.relax.frontend import nn

import tvm_streamk
from tvm_streamk import workloads
from tvm_streamk._compat import dlight_cuda_target

TARGET = "nvidia/nvidia-h100"


class _Block(nn.Module):
    """A Llama-style decoder block's GEMMs and norms (attention scores left out: TVM's)."""

    def __init__(self, hidden: int = 1024, inter: int = 2816):
        self.norm1 = nn.RMSNorm(hidden, axes=-1, bias=False)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = nn.RMSNorm(hidden, axes=-1, bias=False)
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)
        self.inter = inter

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        qkv = self.qkv(self.norm1(x))
        q, k, v = nn.split(qkv, 3, axis=-1)
        h = x + self.o(q * nn.sigmoid(k) + v)
        gate, up = nn.split(self.gate_up(self.norm2(h)), 2, axis=-1)
        return h + self.down(nn.silu(gate) * up)


def transformer_block() -> tvm.IRModule:
    spec = {"forward": {"x": nn.spec.Tensor(["seq", 1024], "float16")}}
    block = _Block()
    block.to("float16")
    mod, _ = block.export_tvm(spec)
    return mod


MODELS = {
    "squeezenet": lambda: workloads.onnx_model("squeezenet"),
    "transformer_block": transformer_block,
}


def measure(name: str, repeat: int = 1) -> tuple[float, float, float]:
    """Seconds to compile model ``name`` stock, stock for the arch dlight parses (``sm_90``
    for the H100 tag's ``sm_90a``: the tensor-core schedules the pipeline gives), and with
    Stream-K decisions, the best of ``repeat`` alternating runs each."""
    # TVM parses its tensor intrinsics on first use, once per process (seconds to a minute,
    # through inspect.stack); whichever compile came first would pay it.
    importlib.import_module("tvm.s_tir.tensor_intrin")
    target = tvm.target.Target(TARGET)
    parsed = dlight_cuda_target(target)
    pipeline = tvm_streamk.relax_pipeline(target)
    stock = same = ours = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        tvm.compile(MODELS[name](), target)
        stock = min(stock, time.perf_counter() - t0)
        t0 = time.perf_counter()
        tvm.compile(MODELS[name](), parsed)
        same = min(same, time.perf_counter() - t0)
        t0 = time.perf_counter()
        tvm.compile(MODELS[name](), target, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
        ours = min(ours, time.perf_counter() - t0)
    return stock, same, ours


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs each")
    args = parser.parse_args(argv)
    print(
        f"| model | stock (s) | stock, arch {dlight_cuda_target(tvm.target.Target(TARGET)).arch}"
        f" (s) | relax_pipeline (s) | ratio | ratio to the same schedules |  target {TARGET}"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.models:
        stock, same, ours = measure(name, args.repeat)
        print(
            f"| {name} | {stock:.2f} | {same:.2f} | {ours:.2f} | {ours / stock:.2f}x "
            f"| {ours / same:.2f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

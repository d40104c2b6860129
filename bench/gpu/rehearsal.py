"""A rehearsal pack: the GPU pack's layout and calling convention, with CPU kernels, some of
them broken on purpose, for running ``run.py`` and ``device_run.sh`` where there is no GPU.

Each kernel is a TVM library built for ``llvm`` whose entry takes ``(A[m, k], B[k, n],
C[m, n])`` like the pack's, recorded in a manifest of the pack's format with ``"device":
"cpu"`` (no cubin, no CUDA runtime). Beside correct kernels, the flaws the runner must catch
and survive: ``drop`` (a lost partial tile: the first 16 x 16 outputs sum half of K), ``hang``
(the call sleeps for an hour) and ``crash`` (the call aborts the process). With the numpy
stand-in for torch (``tests/standins``) on ``PYTHONPATH`` and the stand-ins for nvidia-smi and
compute-sanitizer on ``PATH``::

    python -m bench.gpu.rehearsal --out /tmp/rehearsal           # and /tmp/rehearsal.tar.gz
    PYTHONPATH=tests/standins PATH=tests/standins/bin:$PATH KERNEL_TIMEOUT=5 \\
        OUT=/tmp/rehearsal-out bash bench/gpu/device_run.sh /tmp/rehearsal.tar.gz

``tests/bench/test_gpu_rehearsal.py`` does this and checks what comes back.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm.script import tirx as T

from bench.gpu import pack


@dataclass(frozen=True)
class Kernel:
    """One rehearsal kernel: a GEMM of one shape, correct or with one ``flaw``."""

    m: int
    n: int
    k: int
    variant: str
    flaw: str | None = None
    dtype: str = "float32"
    fixup: str | None = None
    sanitize: bool = False
    cls: str = "rehearsal"

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}x{self.k}-cpu-{self.variant}"


# Two shapes; the flaws sit between correct kernels, so the test sees that the rest still ran.
KERNELS = (
    Kernel(48, 40, 96, "data_parallel", sanitize=True),
    Kernel(48, 40, 96, "stream_k-workspace", fixup="workspace", sanitize=True),
    Kernel(48, 40, 96, "split_k-drops", flaw="drop", fixup="workspace"),
    Kernel(48, 40, 96, "stream_k-hangs", flaw="hang", fixup="workspace"),
    Kernel(48, 40, 96, "hybrid", fixup="workspace"),
    Kernel(32, 24, 64, "data_parallel", dtype="float16"),
    Kernel(32, 24, 64, "stream_k-atomic", dtype="float16", fixup="atomic"),
    Kernel(32, 24, 64, "stream_k-crashes", flaw="crash", dtype="float16", fixup="workspace"),
)


def gemm(kernel: Kernel) -> tvm.tirx.PrimFunc:
    """``C = A @ B`` accumulated in float32, with the kernel's flaw."""
    m, n, k, dtype, flaw, half = (
        kernel.m,
        kernel.n,
        kernel.k,
        kernel.dtype,
        kernel.flaw,
        kernel.k // 2,
    )

    # fmt: off
    @T.prim_func
    def main(A: T.Buffer((m, k), dtype), B: T.Buffer((k, n), dtype), C: T.Buffer((m, n), dtype)):
        T.func_attr({"global_symbol": "main"})
        acc = T.alloc_buffer((1,), "float32")
        if flaw == "hang":
            T.evaluate(T.call_extern("int32", "sleep", 3600))
        if flaw == "crash":
            T.evaluate(T.call_extern("int32", "abort"))
        for i, j in T.grid(m, n):
            acc[0] = T.float32(0)
            for kk in range(k):
                if flaw != "drop" or i >= 16 or j >= 16 or kk < half:
                    acc[0] = acc[0] + T.Cast("float32", A[i, kk]) * T.Cast("float32", B[kk, j])
            C[i, j] = T.Cast(dtype, acc[0])
    # fmt: on

    return main


def record(kernel: Kernel) -> dict:
    """The manifest record of a rehearsal kernel (the fields ``run.py`` and the report read)."""
    m, n, k = kernel.m, kernel.n, kernel.k
    plan = {"label": kernel.variant, "policy": kernel.variant.split("-")[0], "grid": 1,
            "blocks_per_sm": 1, "tiles": 1, "panels": 1, "reason": "rehearsal"}  # fmt: skip
    return {
        "name": kernel.name,
        "task": kernel.name,
        "device": "cpu",
        "file": f"kernels/{kernel.name}.so",
        "entry": "main",
        "shape": {"m": m, "n": n, "k": k},
        "dtypes": {"a": kernel.dtype, "b": kernel.dtype, "c": kernel.dtype},
        "acc_dtype": "float32",
        "schedule_source": "cpu",
        "variant": kernel.variant,
        "decision": {},
        "fixup": kernel.fixup,
        "runtime_grid": False,
        "plan": plan,
        "data_parallel_plan": dict(plan, label="data_parallel", policy="data_parallel"),
        "predicted_units": 1.0,
        "predicted_dp_units": 1.0,
        "args": [
            {"name": "A", "shape": [m, k], "dtype": kernel.dtype},
            {"name": "B", "shape": [k, n], "dtype": kernel.dtype},
            {"name": "C", "shape": [m, n], "dtype": kernel.dtype},
        ],
        "output_index": 2,
        "sanitize": kernel.sanitize,
        "shape_class": kernel.cls,
        "suite": "rehearsal",
        "note": kernel.flaw or "",
        "resources": {"kernels": {}, "main": None},
    }


def build(out: Path, kernels=KERNELS) -> dict:
    """The rehearsal pack in ``out`` (emptied first) and ``OUT.tar.gz``; its manifest."""
    if out.exists():
        shutil.rmtree(out)
    (out / "kernels").mkdir(parents=True)
    records = []
    for kernel in kernels:
        lib = tvm.compile(tvm.IRModule({"main": gemm(kernel)}), target="llvm")
        lib.export_library(str(out / "kernels" / f"{kernel.name}.so"))
        records.append(record(kernel))
    manifest = {
        "format": 2,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "shapes": "rehearsal",
        "target": "llvm",
        "kernels": records,
        "failed": [],
        "skipped": [],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    pack.copy_runner(out)
    pack.archive(out)
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the pack's folder (emptied)")
    args = parser.parse_args(argv)
    manifest = build(args.out)
    print(f"rehearsal pack {args.out}: {len(manifest['kernels'])} kernels, {args.out}.tar.gz")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a GPU would see of a kernel, without a GPU: ptxas's resource report through nvcc.

PoCL has no shared-memory limit, no register file and no occupancy, so a kernel that runs there
may not launch on a GPU at all. :func:`resources` compiles CUDA source to a cubin with
``nvcc -Xptxas -v`` for one arch and returns, per kernel, the registers, spills, stack and
shared memory ptxas reports; a kernel ptxas refuses (too much shared memory, say) raises
:class:`PtxasError` with ptxas's own line.

>>> import tvm, tvm_streamk
>>> from tvm_streamk import ptxas, workloads
>>> sch = workloads.reference_schedule(workloads.gemm(448, 1216, 4096))
>>> _ = sch.stream_k("C_update", num_sms=132, target="nvidia/nvidia-h100")
>>> lib = tvm.compile(sch.mod, target="nvidia/nvidia-h100", tir_pipeline="tvm_streamk")
>>> report = ptxas.resources(lib.mod.imports[0].inspect_source(), "sm_90a")
>>> sorted(report) == ["main_kernel", "main_kernel_1"]
True
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KernelResources", "PtxasError", "available", "clear_cache", "resources"]


class PtxasError(RuntimeError):
    """nvcc could not compile the source, or ptxas refused a kernel (its messages included)."""


@dataclass(frozen=True)
class KernelResources:
    """ptxas's report of one kernel (bytes for everything but ``registers``)."""

    registers: int
    shared: int
    stack: int
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\w+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def available() -> bool:
    """Whether ``nvcc`` is on ``PATH``."""
    return shutil.which("nvcc") is not None


def resources(source: str, arch: str, timeout: float = 300) -> dict[str, KernelResources]:
    """Per-kernel resources of CUDA ``source`` compiled for ``arch`` (``"sm_80"``, ``"sm_90a"``).

    ``arch`` is what a TVM CUDA target carries as ``target.attrs["arch"]``. A source read once
    is not compiled again in the same process (MetaSchedule and a model's repeated shapes
    build the same kernel many times); :func:`clear_cache` forgets them.
    """
    if not available():
        raise PtxasError("nvcc is not on PATH; install the CUDA toolkit to read ptxas resources.")
    return dict(_compiled(source, arch, timeout))


def clear_cache() -> None:
    """Forget the sources :func:`resources` has read (after changing the CUDA toolkit)."""
    _compiled.cache_clear()


@functools.lru_cache(maxsize=4096)
def _compiled(source: str, arch: str, timeout: float) -> tuple:
    with tempfile.TemporaryDirectory(prefix="tvm_streamk_ptxas_") as tmp:
        cu = Path(tmp) / "kernels.cu"
        cu.write_text(source)
        cmd = [
            "nvcc",
            "-cubin",
            f"-arch={arch}",
            "-Xptxas",
            "-v",
            str(cu),
            "-o",
            str(cu.with_suffix(".cubin")),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    report = done.stderr + done.stdout
    if done.returncode != 0:
        errors = [line.strip() for line in report.splitlines() if "error" in line]
        raise PtxasError(
            f"nvcc -arch={arch} failed (exit {done.returncode}): "
            + ("; ".join(errors[:3]) or report.strip()[-500:])
        )
    return tuple(parse(report).items())


def parse(report: str) -> dict[str, KernelResources]:
    """The per-kernel resources in the text ``nvcc -Xptxas -v`` printed."""
    found: dict[str, dict] = {}
    current = None
    for line in report.splitlines():
        if m := _ENTRY.search(line) or _PROPERTIES.search(line):
            current = found.setdefault(m.group(1), {})
        elif current is not None and (m := _FRAME.search(line)):
            current.update(stack=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        elif current is not None and (m := _USED.search(line)):
            current["registers"] = int(m[1])
            smem = _SMEM.search(line)
            current["shared"] = int(smem[1]) if smem else 0
    return {
        name: KernelResources(
            registers=f["registers"],
            shared=f["shared"],
            stack=f.get("stack", 0),
            spill_stores=f.get("spill_stores", 0),
            spill_loads=f.get("spill_loads", 0),
        )
        for name, f in found.items()
        if "registers" in f
    }

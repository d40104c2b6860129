"""What to know when the first launch fails: run by the staged command after a failed smoke.

Run with ``CUDA_LAUNCH_BLOCKING=1`` (every launch synchronous, so an error names its launch)
and ``python -X faulthandler`` (a crash prints the Python stack). In one process, no worker:
the machine (driver and runtime versions), which ``libcudart`` and ``libcuda`` the process
mapped, the kernel's library and cubin (paths, sizes, SHA-256), the digests of the CUDA
sources TVM's runtime asked the cubin store for against the one the manifest expects, and the
launch itself with its exception and traceback. Every step is recorded before the next runs,
so a crash keeps what came before.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import traceback
from pathlib import Path

from . import checks, pack_files
from .journal import Journal


def _sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def mapped_libraries(*names: str) -> dict[str, list[str]]:
    """The files of this process's memory map whose names start with each of ``names``."""
    found: dict[str, set[str]] = {name: set() for name in names}
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return {name: [] for name in names}
    for line in maps:
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        for name in names:
            if Path(path).name.startswith(name):
                found[name].add(path)
    return {name: sorted(paths) for name, paths in found.items()}


def driver_version() -> int | str:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        status = lib.cuDriverGetVersion(ctypes.byref(version))
        return version.value if status == 0 else f"cuDriverGetVersion returned {status}"
    except OSError as err:
        return f"no libcuda.so.1: {err}"


def run(pack: Path, entries: list[dict], out: Path, log=print) -> int:
    """The ``diagnose`` command on ``entries`` (the smoke stage's kernels)."""
    journal = Journal(out)

    def step(what: str, **facts) -> None:
        journal.write({"kind": "diagnosis", "step": what, **facts})
        log(f"{what}: {facts}")

    step(
        "environment",
        python=platform.python_version(),
        cuda_launch_blocking=os.environ.get("CUDA_LAUNCH_BLOCKING"),
        ld_library_path=os.environ.get("LD_LIBRARY_PATH"),
        driver=driver_version(),
    )
    status = 0
    try:
        import torch

        step("torch", version=torch.__version__, cuda=torch.version.cuda,
             available=torch.cuda.is_available())  # fmt: skip
        tvm, tvm_ffi, store = pack_files.import_tvm(pack, entries)
        step("tvm", file=tvm.__file__, runtime_only=bool(getattr(tvm.base, "_RUNTIME_ONLY", 0)))
        step("libraries", **mapped_libraries("libcudart", "libcuda.", "libtvm_runtime"))
    except Exception as err:  # noqa: BLE001 - the record is the point
        step(
            "import failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()
        )
        return 1
    for entry in entries:
        lib, cubin = pack / entry["file"], pack / entry.get("cubin", "-")
        step(
            "kernel",
            name=entry["name"],
            library=str(lib),
            library_bytes=lib.stat().st_size if lib.is_file() else None,
            library_sha256=_sha(lib),
            cubin=str(cubin),
            cubin_bytes=cubin.stat().st_size if cubin.is_file() else None,
            cubin_sha256=_sha(cubin),
            expected_source_sha256=entry.get("source_sha256"),
        )
        try:
            module = tvm.runtime.load_module(str(lib))
            fn = module[entry["entry"]]
            device = pack_files.device_of(entry)
            a, b, ref = checks.exact_inputs(torch, entry, device)
            out_tensor = checks.output(torch, entry, device)
            tensors = [a, b]
            tensors.insert(entry["output_index"], out_tensor)
            with tvm_ffi.use_torch_stream():
                fn(*[tvm.runtime.from_dlpack(t) for t in tensors])
                torch.cuda.synchronize()
            step(
                "launch",
                name=entry["name"],
                asked=store.asked,
                served=store.served,
                **checks.exact_check(torch, out_tensor, ref),
            )
        except Exception as err:  # noqa: BLE001
            status = 1
            step(
                "launch failed",
                name=entry["name"],
                error=f"{type(err).__name__}: {err}"[:4000],
                traceback=traceback.format_exc()[-6000:],
                asked=store.asked,
                served=store.served,
                libraries=mapped_libraries("libcudart", "libcuda."),
            )
            break
    return status

"""The pack on the GPU machine: its manifest, its runtime-only TVM and the cubins it carries.

TVM 0.27's CUDA modules carry CUDA source, which TVM's CUDA runtime compiles when a module is
first used, through the ``tvm_callback_cuda_compile`` global. The pack compiled every source
with nvcc when it was built; :class:`CubinStore`, registered as that global, hands back the
pack's cubin for the source's SHA-256, and refuses a source it has none for: nothing is
compiled on the GPU machine.

A runtime-only ``import tvm`` (``TVM_USE_RUNTIME_LIB=1``) does not load
``libtvm_runtime_cuda.so``; :func:`load_cuda_runtime` loads it with ctypes. It links against
``libcudart.so.13`` (PyTorch's, once torch is imported, else the one bundled beside it) and the
driver's ``libcuda.so.1``.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
from pathlib import Path


class PackError(RuntimeError):
    """The pack is incomplete or does not match what the runner expects."""


def setup_runtime(pack: Path) -> None:
    """Put the pack's runtime-only TVM first on ``sys.path`` (before anything imports tvm)."""
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    # tvm_ffi would otherwise try to JIT-compile a torch extension at import; nothing compiles
    # there, and from_dlpack does not need it.
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    if (pack / "runtime").is_dir():
        sys.path.insert(0, str(pack / "runtime"))
    # Only where the machine has none of its own.
    sys.path.append(str(pack / "runtime-fallback"))


def manifest(pack: Path) -> dict:
    path = pack / "manifest.json"
    if not path.is_file():
        raise PackError(f"{path} is missing: this folder is not a GPU pack (bench.gpu.pack)")
    return json.loads(path.read_text())


def select(entries: list[dict], only: str | None) -> list[dict]:
    """The entries named in ``only`` (comma-separated), in the manifest's order."""
    if not only:
        return list(entries)
    wanted = only.split(",")
    known = {e["name"] for e in entries}
    missing = [name for name in wanted if name not in known]
    if missing:
        raise PackError(f"not in the manifest: {missing}; the names are in manifest.json")
    chosen = set(wanted)
    return [e for e in entries if e["name"] in chosen]


def device_of(entry: dict) -> str:
    """Where the kernel runs: ``cuda`` for the pack's kernels, ``cpu`` for the rehearsal's."""
    return entry.get("device", "cuda")


def check_layout(entry: dict) -> None:
    m, n, k = (entry["shape"][x] for x in "mnk")
    shapes = [a["shape"] for a in entry["args"]]
    if shapes[0] != [m, k] or shapes[1] != [k, n] or shapes[entry["output_index"]] != [m, n]:
        raise PackError(f"{entry['name']}: expected A[m, k], B[k, n], C[m, n]; found {shapes}")


def groups(entries: list[dict]) -> list[list[dict]]:
    """Consecutive entries of one shape and input dtype: they share inputs, are timed together
    (interleaved) and against one cuBLAS call."""
    out: list[list[dict]] = []
    last = None
    for entry in entries:
        key = (tuple(entry["shape"].values()), entry["dtypes"]["a"])
        if out and key == last:
            out[-1].append(entry)
        else:
            out.append([entry])
        last = key
    return out


class CubinStore:
    """``tvm_callback_cuda_compile``: the pack's cubin for a CUDA source, by its SHA-256."""

    def __init__(self, pack: Path, entries: list[dict]):
        self.paths = {e["source_sha256"]: pack / e["cubin"] for e in entries if "cubin" in e}
        self.served: list[str] = []
        self.asked: list[str] = []

    def __call__(self, code) -> bytes:
        text = code if isinstance(code, str) else bytes(code).decode()
        digest = hashlib.sha256(text.encode()).hexdigest()
        self.asked.append(digest)
        path = self.paths.get(digest)
        if path is None or not path.is_file():
            raise RuntimeError(
                f"no cubin in the pack for CUDA source {digest[:12]}: this machine compiles "
                "nothing; rebuild the pack (python -m bench.gpu.pack) so that every kernel's "
                "source has its cubin"
            )
        self.served.append(digest)
        return path.read_bytes()


def load_cuda_runtime(tvm) -> str | None:
    """Load TVM's CUDA runtime library (a runtime-only ``import tvm`` does not); the reason
    when it cannot be loaded, else None."""
    lib = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    try:
        ctypes.CDLL(str(lib), mode=os.RTLD_LOCAL)
    except OSError as err:
        return str(err)
    return None


def import_tvm(pack: Path, entries: list[dict]):
    """``(tvm, tvm_ffi, store)`` with TVM's CUDA runtime loaded and the cubin store registered
    where an entry runs on CUDA; raises :class:`PackError` when that runtime does not load."""
    import tvm
    import tvm_ffi

    store = CubinStore(pack, entries)
    if any(device_of(e) == "cuda" for e in entries):
        error = load_cuda_runtime(tvm)
        if error is not None:
            raise PackError(f"TVM's CUDA runtime library does not load: {error}")
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", store, override=True)
    return tvm, tvm_ffi, store


def dry_run(pack: Path, entries: list[dict], log=print) -> dict:
    """Every entry up to the launch: files, argument shapes, and (where TVM's CUDA runtime
    loads) the module, its request for its own cubin and its entry function.

    The cubin itself is loaded (``cuModuleLoadData``) at the first launch, which is the smoke
    stage's job."""
    import tvm
    import tvm_ffi

    store = CubinStore(pack, entries)
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", store, override=True)
    cuda_error = load_cuda_runtime(tvm)
    walked = []
    loaded: dict[str, object] = {}
    for entry in entries:
        record = {"name": entry["name"]}
        for key in ("file", "cubin"):
            if key in entry and not (pack / entry[key]).is_file():
                raise PackError(f"{entry['name']}: {entry[key]} is missing from the pack")
        check_layout(entry)
        record["arg_shapes"] = [(a["shape"], a["dtype"]) for a in entry["args"]]
        can_load = cuda_error is None or device_of(entry) != "cuda"
        if can_load and entry["file"] not in loaded:
            served = len(store.served)
            module = tvm.runtime.load_module(str(pack / entry["file"]))
            module[entry["entry"]]
            if device_of(entry) == "cuda" and store.served[served:] != [entry["source_sha256"]]:
                raise PackError(f"{entry['name']}: its library did not ask for its own cubin")
            loaded[entry["file"]] = module
        record["loaded"] = can_load
        walked.append(record)
        log(f"dry-run {entry['name']}: {'loaded' if can_load else 'files checked'}")
    if cuda_error is not None:
        log(
            "dry-run stopped every entry before tvm.runtime.load_module: TVM's CUDA runtime "
            f"library does not load here ({cuda_error})"
        )
    log(f"dry-run walked {len(walked)} of {len(entries)} entries")
    return {
        "dry_run": walked,
        "cuda_runtime_error": cuda_error,
        "tvm": tvm.__file__,
        "runtime_only": bool(getattr(tvm.base, "_RUNTIME_ONLY", False)),
    }

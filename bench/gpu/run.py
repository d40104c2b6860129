"""Run the GPU proof pack on a CUDA GPU: correctness, timings, cuBLAS, compute-sanitizer.

This file travels inside the pack and runs where TVM is not installed and nothing can be
compiled: Python 3.12 with PyTorch and a CUDA driver. It needs only the standard library, the
pack's runtime-only TVM (``runtime/``, put first on ``sys.path`` with ``TVM_USE_RUNTIME_LIB=1``)
and, except for ``--dry-run``, torch.

How a kernel is loaded: TVM 0.27's CUDA modules carry CUDA source, which the CUDA runtime
compiles at load time through the ``tvm_callback_cuda_compile`` global. The pack compiled every
source with nvcc when it was built; the callback registered here hands back that cubin, found
by the source's SHA-256 (a source without a cubin is an error: nothing is compiled here).

What is checked, per kernel: fresh random inputs (uniform in [-1, 1]) for every shape, the
output filled with NaN before the call, then against ``torch.matmul`` of the inputs in float64
(float32 for fp16 inputs, TF32 off):

* fp32 accumulation: ``max|C - ref| <= 1e-5 * max|ref| * max(1, sqrt(k / 16384))``;
* fp16 accumulation (dlight's WMMA schedule accumulates in half): every element finite and
  ``rms(C - ref) <= 2**-10 * sqrt(k) * rms(ref)``, a statistical bound (rounding errors of a
  k-term half-precision sum grow as sqrt(k) units in the last place) that a lost or doubled
  partial tile (an error of the order of the result) fails.

Timing: CUDA events around each call on torch's current stream (TVM launches on the same stream
through ``tvm_ffi.use_torch_stream``), a 256 MiB write between calls to flush L2, ``--warmup``
calls first, the median of ``--repeat`` (>= 20) calls; torch.matmul (cuBLAS) is timed the same
way per shape. ``--budget`` stops starting new shapes when the time is spent.

Usage (from the pack's folder)::

    python run.py --dry-run                 # no GPU: walk every entry up to the launch
    python run.py --budget 420 --sanitize   # the proof: sanitizers first, then the sweep
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

FP32_TOL = 1e-5
FP32_TOL_K = 16384
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
FLUSH_BYTES = 256 * 2**20


def setup_runtime(pack: Path) -> None:
    """Put the pack's runtime-only TVM first on ``sys.path`` (before anything imports tvm)."""
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    # tvm_ffi would otherwise try to JIT-compile a torch extension at import; nothing compiles
    # there, and from_dlpack does not need it.
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    sys.path.insert(0, str(pack / "runtime"))
    # Only where the machine has none of its own.
    sys.path.append(str(pack / "runtime-fallback"))


class CubinStore:
    """``tvm_callback_cuda_compile``: the pack's cubin for a CUDA source, by its SHA-256."""

    def __init__(self, pack: Path, entries: list[dict]):
        self.paths = {e["source_sha256"]: pack / e["cubin"] for e in entries}
        self.served: list[str] = []

    def __call__(self, code) -> bytes:
        text = code if isinstance(code, str) else bytes(code).decode()
        digest = hashlib.sha256(text.encode()).hexdigest()
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


def _groups(entries: list[dict]) -> list[list[dict]]:
    """Consecutive entries of one shape and input dtype: they share inputs and cuBLAS time."""
    groups: list[list[dict]] = []
    for entry in entries:
        key = (tuple(entry["shape"].values()), entry["dtypes"]["a"])
        if groups and groups[-1][0]["_key"] == key:
            groups[-1].append(entry)
        else:
            groups.append([entry])
        entry["_key"] = key
    return groups


def _check_layout(entry: dict) -> None:
    m, n, k = (entry["shape"][x] for x in "mnk")
    shapes = [a["shape"] for a in entry["args"]]
    if shapes[0] != [m, k] or shapes[1] != [k, n] or shapes[entry["output_index"]] != [m, n]:
        raise ValueError(f"{entry['name']}: expected A[m, k], B[k, n], C[m, n]; found {shapes}")


def dry_run(pack: Path, entries: list[dict], tvm, tvm_ffi, cuda_error: str | None) -> dict:
    """Every entry up to the launch: files, argument shapes, and (where TVM's CUDA runtime
    loads) the module, its cubin and its entry function."""
    store = CubinStore(pack, entries)
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", store, override=True)
    walked = []
    for entry in entries:
        record = {"name": entry["name"]}
        for key in ("file", "cubin"):
            if not (pack / entry[key]).is_file():
                raise FileNotFoundError(f"{entry['name']}: {entry[key]} is missing from the pack")
        _check_layout(entry)
        record["arg_shapes"] = [(a["shape"], a["dtype"]) for a in entry["args"]]
        if cuda_error is None:
            served = len(store.served)
            module = tvm.runtime.load_module(str(pack / entry["file"]))
            module[entry["entry"]]
            if store.served[served:] != [entry["source_sha256"]]:
                raise RuntimeError(f"{entry['name']}: its library did not ask for its own cubin")
            record["loaded"] = True
        else:
            record["loaded"] = False
        walked.append(record)
        print(f"dry-run {entry['name']}: {'loaded' if record['loaded'] else 'files checked'}")
    if cuda_error is not None:
        print(
            "dry-run stopped every entry before tvm.runtime.load_module: TVM's CUDA runtime "
            f"library does not load here ({cuda_error})"
        )
    return {"dry_run": walked, "cuda_runtime_error": cuda_error}


class Runner:
    """The GPU side: inputs, reference, checks and timings with torch."""

    def __init__(self, torch, tvm, tvm_ffi, warmup: int, repeat: int):
        self.torch, self.tvm, self.tvm_ffi = torch, tvm, tvm_ffi
        self.warmup, self.repeat = warmup, repeat
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def dtype(self, name: str):
        return {"float32": self.torch.float32, "float16": self.torch.float16}[name]

    def inputs(self, entry: dict):
        torch = self.torch
        a_arg, b_arg = entry["args"][0], entry["args"][1]
        a = torch.empty(a_arg["shape"], dtype=self.dtype(a_arg["dtype"]), device="cuda")
        b = torch.empty(b_arg["shape"], dtype=self.dtype(b_arg["dtype"]), device="cuda")
        a.uniform_(-1.0, 1.0)
        b.uniform_(-1.0, 1.0)
        wide = torch.float32 if a.dtype == torch.float16 else torch.float64
        return a, b, (a.to(wide) @ b.to(wide))

    def times(self, fn) -> list[float]:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.repeat)]
        for start, end in zip(starts, ends):
            self.flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return sorted(s.elapsed_time(e) for s, e in zip(starts, ends))

    def check(self, entry: dict, out, ref) -> dict:
        torch = self.torch
        k = entry["shape"]["k"]
        diff = out.to(ref.dtype) - ref
        finite = bool(torch.isfinite(out).all())
        max_ref = float(ref.abs().max())
        max_err = float(diff.abs().max()) if finite else math.inf
        rms_ref = float(ref.pow(2).mean().sqrt())
        rms_err = float(diff.pow(2).mean().sqrt()) if finite else math.inf
        if entry.get("acc_dtype") == "float16":
            tol = 2.0**-10 * math.sqrt(k)
            ok = finite and rms_err <= tol * rms_ref
            rule = "rms(C-ref) <= 2^-10*sqrt(k)*rms(ref), fp32 reference"
        else:
            tol = FP32_TOL * max(1.0, math.sqrt(k / FP32_TOL_K))
            ok = finite and max_err <= tol * max_ref
            rule = "max|C-ref| <= 1e-5*max(1,sqrt(k/16384))*max|ref|, float64 reference"
        return {
            "correct": ok,
            "finite": finite,
            "max_err_rel": max_err / max_ref if max_ref else max_err,
            "rms_err_rel": rms_err / rms_ref if rms_ref else rms_err,
            "tolerance": tol,
            "rule": rule,
        }

    def run_kernel(self, pack: Path, entry: dict, a, b, ref, time_it: bool) -> dict:
        torch, tvm = self.torch, self.tvm
        _check_layout(entry)
        module = tvm.runtime.load_module(str(pack / entry["file"]))
        fn = module[entry["entry"]]
        out_arg = entry["args"][entry["output_index"]]
        out = torch.full(
            out_arg["shape"], math.nan, dtype=self.dtype(out_arg["dtype"]), device="cuda"
        )
        tensors = [a, b]
        tensors.insert(entry["output_index"], out)
        args = [tvm.runtime.from_dlpack(t) for t in tensors]
        with self.tvm_ffi.use_torch_stream():
            fn(*args)
            torch.cuda.synchronize()
            result = self.check(entry, out, ref)
            if time_it:
                ms = self.times(lambda: fn(*args))
                result.update(median_ms=ms[len(ms) // 2], min_ms=ms[0], max_ms=ms[-1])
        return result

    def cublas_ms(self, a, b) -> float:
        ms = self.times(lambda: self.torch.matmul(a, b))
        return ms[len(ms) // 2]


def run_sweep(pack, entries, runner: Runner, budget: float, started: float, time_it: bool):
    results, not_run = [], []
    for group in _groups(entries):
        if time.monotonic() - started > budget:
            not_run.extend(e["name"] for e in group)
            continue
        try:
            a, b, ref = runner.inputs(group[0])
            cublas = runner.cublas_ms(a, b) if time_it else None
        except Exception as err:  # noqa: BLE001 - record and go on to the next shape
            for entry in group:
                results.append({"name": entry["name"], "status": "error", "error": repr(err)})
            continue
        for entry in group:
            record = {"name": entry["name"], "cublas_ms": cublas}
            try:
                record.update(runner.run_kernel(pack, entry, a, b, ref, time_it))
                record["status"] = "ok" if record["correct"] else "wrong"
            except Exception as err:  # noqa: BLE001 - a failing kernel must not stop the run
                record.update(status="error", error=f"{type(err).__name__}: {err}"[:2000])
            results.append(record)
            timing = (
                f" {record['median_ms']:.3f} ms (cuBLAS {cublas:.3f})"
                if "median_ms" in record
                else ""
            )
            print(f"{record['status']:5} {entry['name']}{timing}", flush=True)
        del a, b, ref
    return results, not_run


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in sorted(Path("/usr/local").glob("cuda*"), reverse=True):
        for candidate in (
            root / "bin" / "compute-sanitizer",
            root / "compute-sanitizer" / "compute-sanitizer",
        ):
            if candidate.is_file():
                return str(candidate)
    return None


_SUMMARY = re.compile(r"(?:ERROR|RACECHECK|SYNCCHECK) SUMMARY:.*?(\d+) error", re.IGNORECASE)


def _sanitize_once(sanitizer, tool, pack, names, timeout, kernel_filter=True) -> dict:
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "3", "--print-limit", "20"]
    if kernel_filter:
        cmd += ["--kernel-name", "kns=main_kernel"]
    cmd += [
        sys.executable,
        str(Path(__file__).resolve()),
        "--pack",
        str(pack),
        "--check-only",
        "--only",
        ",".join(names),
        "--out",
        os.devnull,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"tool": tool, "kernels": names, "status": "timeout", "timeout_s": timeout}
    output = proc.stdout + proc.stderr
    if kernel_filter and "ERROR SUMMARY" not in output and "SUMMARY" not in output:
        # An older compute-sanitizer without --kernel-name: check every kernel instead.
        return _sanitize_once(sanitizer, tool, pack, names, timeout, kernel_filter=False)
    errors = [int(x) for x in _SUMMARY.findall(output)]
    clean = proc.returncode == 0 and all(e == 0 for e in errors)
    return {
        "tool": tool,
        "kernels": names,
        "status": "clean" if clean else "errors",
        "returncode": proc.returncode,
        "errors": sum(errors),
        "kernel_filter": kernel_filter,
        "output_tail": output[-4000:],
    }


def sanitize(pack: Path, entries: list[dict], timeout: float, deadline: float) -> list[dict]:
    """memcheck, racecheck and synccheck over the kernels the pack marks: one process per tool,
    then, while ``deadline`` (a ``time.monotonic()`` value) allows, one per kernel of a tool
    that reported errors (to name the kernel)."""
    chosen = [e["name"] for e in entries if e.get("sanitize")]
    sanitizer = find_sanitizer()
    if sanitizer is None:
        return [{"status": "unavailable", "why": "compute-sanitizer not found"}]
    if not chosen:
        return [{"status": "unavailable", "why": "no kernel of the selection is marked sanitize"}]
    reports = []
    for tool in SANITIZER_TOOLS:
        report = _sanitize_once(sanitizer, tool, pack, chosen, timeout)
        reports.append(report)
        print(f"sanitizer {tool} on {len(chosen)} kernels: {report['status']}", flush=True)
        if report["status"] != "errors":
            continue
        for name in chosen:
            if time.monotonic() + timeout > deadline:
                break
            single = _sanitize_once(sanitizer, tool, pack, [name], timeout)
            reports.append(single)
            print(f"  {tool} {name}: {single['status']}", flush=True)
    return reports


def _device(torch) -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "sms": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--out", type=Path, default=Path("results.json"))
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; trims the sweep")
    parser.add_argument(
        "--dry-run", action="store_true", help="no GPU: walk every entry up to the launch"
    )
    parser.add_argument(
        "--sanitize", action="store_true", help="compute-sanitizer on the marked kernels first"
    )
    parser.add_argument(
        "--sanitize-timeout", type=float, default=90.0, help="seconds per sanitizer process"
    )
    parser.add_argument("--only", help="comma-separated kernel names")
    parser.add_argument("--check-only", action="store_true", help="correctness, no timing")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    started = time.monotonic()
    pack = args.pack.resolve()
    manifest = json.loads((pack / "manifest.json").read_text())
    entries = manifest["kernels"]
    if args.only:
        wanted = set(args.only.split(","))
        entries = [e for e in entries if e["name"] in wanted]
        missing = wanted - {e["name"] for e in entries}
        if missing:
            parser.error(f"not in the manifest: {sorted(missing)}")
    setup_runtime(pack)
    torch = None
    if not args.dry_run:
        # torch first: it loads its CUDA runtime, which TVM's CUDA library then shares.
        import torch
    import tvm
    import tvm_ffi

    results = {
        "pack": manifest["created"],
        "shapes": manifest["shapes"],
        "host": platform.node(),
        "python": platform.python_version(),
        "tvm": tvm.__file__,
        "runtime_only": bool(tvm.base._RUNTIME_ONLY),
    }
    cuda_error = load_cuda_runtime(tvm)
    if args.dry_run:
        results.update(dry_run(pack, entries, tvm, tvm_ffi, cuda_error))
        print(f"dry-run walked {len(results['dry_run'])} of {len(entries)} entries")
    else:
        if cuda_error is not None:
            print(f"TVM's CUDA runtime library does not load: {cuda_error}", file=sys.stderr)
            return 2
        store = CubinStore(pack, manifest["kernels"])
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", store, override=True)
        results["device"] = _device(torch)
        if args.sanitize:
            deadline = started + args.budget
            results["sanitizer"] = sanitize(pack, entries, args.sanitize_timeout, deadline)
        runner = Runner(
            torch, tvm, tvm_ffi, args.warmup, max(20, args.repeat) if not args.check_only else 1
        )
        kernels, not_run = run_sweep(
            pack, entries, runner, args.budget, started, not args.check_only
        )
        results["kernels"] = kernels
        results["not_run"] = not_run
        results["budget_s"] = args.budget
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    if str(args.out) != os.devnull:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.out}")
    bad = [k for k in results.get("kernels", []) if k["status"] != "ok"]
    dirty = [s for s in results.get("sanitizer", []) if s["status"] not in ("clean",)]
    return 1 if bad or dirty else 0


if __name__ == "__main__":
    sys.exit(main())

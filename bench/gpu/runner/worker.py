"""One worker process: load, check and time a list of kernels, a journal record per kernel.

The parent (:mod:`.orchestrate`) starts a worker on the kernels still to do and reads two files
it writes: the journal (a record per kernel, once final) and the progress file (a line each
time the worker starts a kernel's stage, flushed, so the parent knows which kernel and stage a
hang or crash belongs to). A per-kernel watchdog (``faulthandler.dump_traceback_later``,
re-armed at every stage) ends the worker with a traceback when one stage takes longer than the
timeout, even while the main thread waits on the GPU.

Per group of kernels sharing a shape (:func:`.pack_files.groups`):

1. fresh inputs: integer-valued ones for the exact pass and uniform ones for the float pass,
   each with its float64 product (:mod:`.checks`);
2. per kernel: load, the float pass on a NaN-filled output, the exact pass ``calls`` times;
3. the group's correct kernels and ``torch.matmul`` (cuBLAS) timed interleaved: in each round
   every kernel once, after an L2 flush, the order rotated round by round, so that clock and
   temperature drift hits all of them alike; the GPU's clocks read before and after;
4. per kernel: the float pass again on the last timed call's output, and the same bits as the
   first call for a deterministic kernel; then its record.

An exception in a kernel is that kernel's ``error`` record; the worker then exits with
:data:`EXIT_RESTART`, because a CUDA error can leave the context unusable for every later
kernel; the parent starts a fresh worker on the rest.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import checks, pack_files
from .journal import Journal

EXIT_RESTART = 75
FLUSH_BYTES = 256 * 2**20
# Seconds of timed calls per kernel and round trip: the repeat count shrinks for slow kernels.
TIME_TARGET_S = 0.5
MIN_REPEAT = 5
CLOCK_FIELDS = (
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "temperature.gpu",
    "power.draw",
    "clocks_throttle_reasons.active",
)


class Progress:
    """The progress file, and the watchdog re-armed with every line."""

    def __init__(self, path: Path | None, timeout: float | None):
        self.path, self.timeout = path, timeout

    def __call__(self, names: str | list[str], stage: str) -> None:
        """Stage ``stage`` of one kernel, or of several at once (timing a group)."""
        if self.timeout:
            faulthandler.dump_traceback_later(self.timeout, exit=True)
        if self.path is not None:
            names = [names] if isinstance(names, str) else list(names)
            line = {"t": time.time(), "names": names, "stage": stage}
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")

    def stop(self) -> None:
        if self.timeout:
            faulthandler.cancel_dump_traceback_later()


def clocks() -> dict | None:
    """The GPU's clocks, temperature, power and throttle reasons, from nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    fields = ",".join(CLOCK_FIELDS)
    try:
        proc = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"error": repr(err)}
    values = proc.stdout.strip().splitlines()[0].split(", ") if proc.stdout.strip() else []
    if len(values) != len(CLOCK_FIELDS):
        return {"raw": proc.stdout}
    return dict(zip(CLOCK_FIELDS, values))


class Worker:
    """The GPU side: kernels loaded through TVM's runtime, tensors and timing from torch."""

    def __init__(self, pack: Path, entries: list[dict], torch, progress: Progress, options):
        self.pack, self.torch, self.progress, self.options = pack, torch, progress, options
        self.tvm, self.tvm_ffi, self.store = pack_files.import_tvm(pack, entries)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # cuBLAS's fp16 GEMM with fp32 accumulation (no reduced-precision split-K reductions).
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        self.modules: dict[str, object] = {}
        # The kernel being timed, which an exception during timing is blamed on.
        self.current: dict | None = None
        self.flush = None
        if options.time:
            self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    # -- kernels -------------------------------------------------------------------------------

    def function(self, entry: dict):
        path = entry["file"]
        if path not in self.modules:
            self.modules[path] = self.tvm.runtime.load_module(str(self.pack / path))
        return self.modules[path][entry["entry"]]

    def caller(self, entry: dict, fn, a, b, out):
        pack_files.check_layout(entry)
        tensors = [a, b]
        tensors.insert(entry["output_index"], out)
        args = [self.tvm.runtime.from_dlpack(t) for t in tensors]
        return lambda: fn(*args)

    # With ``--host-inputs`` (the sanitizer's child) every tensor is made on the host and
    # copied, and the checks read a host copy of the output: compute-sanitizer's initcheck,
    # filtered to the pack's kernels, does not see the writes of torch's own (uninstrumented)
    # kernels and would call every element they wrote, inputs and check results alike,
    # uninitialized; copies it does see.

    def inputs(self, make, entry: dict, device: str) -> tuple:
        """``a, b, ref`` from ``make``: on ``device``, or made on the host, ``a`` and ``b``
        copied to ``device`` and ``ref`` left on the host."""
        if not self.options.host_inputs:
            return make(self.torch, entry, device)
        a, b, ref = make(self.torch, entry, "cpu")
        return a.to(device), b.to(device), ref

    def output(self, entry: dict, device: str):
        if not self.options.host_inputs:
            return checks.output(self.torch, entry, device)
        return checks.output(self.torch, entry, "cpu").to(device)

    def observed(self, out):
        """What the checks read: ``out``, or its copy on the host."""
        return out.to("cpu") if self.options.host_inputs else out

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    # -- one group -----------------------------------------------------------------------------

    def run_group(self, group: list[dict], journal: Journal) -> bool:
        """Check and time one group; False when a kernel raised (the worker must restart)."""
        device = pack_files.device_of(group[0])
        self.progress([e["name"] for e in group], "inputs")
        a, b, ref = self.inputs(checks.float_inputs, group[0], device)
        ea, eb, eref = self.inputs(checks.exact_inputs, group[0], device)
        states = []
        for entry in group:
            state = {"entry": entry, "record": {"kind": "kernel", "name": entry["name"]}}
            states.append(state)
            try:
                self.check(state, a, b, ref, ea, eb, eref)
            except Exception as err:  # noqa: BLE001 - recorded; the worker restarts
                self.fail(state, err, journal)
                return False
        if self.options.time:
            try:
                self.time_group(states, a, b, ref)
            except Exception as err:  # noqa: BLE001 - recorded; the worker restarts
                self.fail(self.current or states[0], err, journal)
                return False
        for state in states:
            record = state["record"]
            record.setdefault("status", "ok" if record["correct"] else "wrong")
            journal.write(record)
            print(_line(record), flush=True)
        return True

    def check(self, state: dict, a, b, ref, ea, eb, eref) -> None:
        entry, record = state["entry"], state["record"]
        device = pack_files.device_of(entry)
        self.progress(entry["name"], "load")
        fn = self.function(entry)
        self.progress(entry["name"], "float")
        out = self.output(entry, device)
        call = self.caller(entry, fn, a, b, out)
        with self.stream():
            call()
            self.synchronize()
        record["float"] = checks.float_check(self.torch, entry, self.observed(out), ref)
        state.update(out=out, call=call, first=out.clone())
        exact = []
        for i in range(self.options.calls):
            self.progress(entry["name"], f"exact call {i + 1}")
            eout = self.output(entry, device)
            ecall = self.caller(entry, fn, ea, eb, eout)
            with self.stream():
                ecall()
                self.synchronize()
            exact.append(checks.exact_check(self.torch, self.observed(eout), eref)["mismatches"])
            if exact[-1]:
                break
        record["exact_mismatches"] = exact
        record["correct"] = record["float"]["correct"] and not any(exact)

    def time_group(self, states: list[dict], a, b, ref) -> None:
        torch = self.torch
        timed = [s for s in states if s["record"]["correct"]]
        if not timed:
            return
        calls = {s["entry"]["name"]: s for s in timed}
        cublas_out = {}

        def cublas():
            cublas_out["c"] = torch.matmul(a, b)

        order = [*calls, "cublas"]
        fns = {name: calls[name]["call"] for name in calls} | {"cublas": cublas}
        before = clocks()
        with self.stream():
            times = self.interleaved(order, fns, calls)
        after = clocks()
        for name, s in calls.items():
            record, ms = s["record"], times[name]
            record.update(
                median_ms=ms[len(ms) // 2],
                min_ms=ms[0],
                max_ms=ms[-1],
                repeat=len(ms),
                cublas_ms=times["cublas"][len(times["cublas"]) // 2],
                clocks={"before": before, "after": after},
            )
            self.current = s
            self.progress(name, "recheck")
            again = checks.float_check(torch, s["entry"], s["out"], ref)
            record["float_after_timing"] = again
            same = bool(torch.equal(s["out"], s["first"]))
            record["same_bits_as_first_call"] = same
            deterministic = checks.is_deterministic(s["entry"])
            record["correct"] = again["correct"] and (same or not deterministic)
        self.current = None

    def interleaved(self, order: list[str], fns: dict, states: dict) -> dict[str, list[float]]:
        torch, options = self.torch, self.options
        for name in order:
            self.current = states.get(name)
            self.progress([name] if name in states else [], "warm-up")
            for _ in range(options.warmup):
                fns[name]()
            self.synchronize()
        repeat = options.repeat
        events: dict[str, list] = {name: [] for name in order}
        round_started = time.perf_counter()
        for r in range(options.repeat):
            rotated = order[r % len(order) :] + order[: r % len(order)]
            for name in rotated:
                self.current = states.get(name)
                self.flush.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fns[name]()
                end.record()
                events[name].append((start, end))
            # Calls are not synchronised one by one (the flush hides each launch's latency from
            # the events), so a hang here is the group's.
            self.progress([n for n in order if n in states], f"timing round {r + 1}")
            self.synchronize()
            if r == 0:
                seconds = time.perf_counter() - round_started
                repeat = max(
                    MIN_REPEAT, min(options.repeat, int(TIME_TARGET_S / max(seconds, 1e-9)))
                )
            if r + 1 >= repeat:
                break
        self.current = None
        return {name: sorted(s.elapsed_time(e) for s, e in pairs) for name, pairs in events.items()}

    def stream(self):
        return self.tvm_ffi.use_torch_stream()

    def fail(self, state: dict, err: Exception, journal: Journal) -> None:
        record = state["record"]
        record.update(status="error", error=f"{type(err).__name__}: {err}"[:2000])
        journal.write(record)
        print(_line(record), flush=True)


def _line(record: dict) -> str:
    timing = ""
    if "median_ms" in record:
        timing = f" {record['median_ms']:.4f} ms (cuBLAS {record['cublas_ms']:.4f})"
    detail = ""
    if record["status"] == "wrong":
        detail = f" float {record['float']} exact mismatches {record['exact_mismatches']}"
    elif record["status"] == "error":
        detail = f" {record['error'][:300]}"
    return f"{record['status']:5} {record['name']}{timing}{detail}"


def die_with_parent() -> None:
    """Be killed when the parent dies: a parent killed with SIGKILL cannot kill its worker,
    which would go on writing the journal under a resumed run (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(options) -> int:
    """The ``worker`` command: the kernels of ``options.names_file`` until ``options.deadline``."""
    die_with_parent()
    if options.parent_pid and os.getppid() != options.parent_pid:
        return 2  # the parent died before the line above took effect
    pack = options.pack
    manifest = pack_files.manifest(pack)
    names = json.loads(Path(options.names_file).read_text())
    entries = pack_files.select(manifest["kernels"], ",".join(names))
    progress = Progress(options.progress, options.kernel_timeout)
    faulthandler.enable()
    progress([], "start")
    import torch

    worker = Worker(pack, entries, torch, progress, options)
    journal = Journal(options.out)
    for group in pack_files.groups(entries):
        if options.deadline and time.time() > options.deadline:
            break
        if not worker.run_group(group, journal):
            progress.stop()
            return EXIT_RESTART
    progress.stop()
    return 0

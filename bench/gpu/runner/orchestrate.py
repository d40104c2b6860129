"""The parent of the workers: nothing a kernel does can end the run or lose a finished record.

:func:`run` starts a worker (:mod:`.worker`, ``run.py worker``) in its own process group on the
kernels still to do and watches it:

* the worker's progress file names the kernel (or, while a group is timed, the kernels) and the
  stage it is in; when no line comes for ``kernel_timeout`` seconds (plus a grace for the
  worker's own watchdog to print its traceback), the parent kills the worker's process group;
* when a worker ends other than normally (killed by the watchdog, crashed, or restarting after
  a kernel raised), the kernels it was in get a record: ``timeout`` or ``crashed`` with the
  stage and the worker's last stderr; a fresh worker then takes the kernels still without a
  record, so a hang or a poisoned CUDA context costs only the kernels it happened in;
* a worker that dies twice running without naming a kernel (torch or the runtime not
  importing) ends the run with an ``error`` record for what is left;
* the budget (``deadline``) stops workers from starting new groups; what is left is recorded as
  ``not_run``. SIGTERM or SIGINT (the stage's ``timeout``) kills the worker's process group and
  writes an ``error`` record before exiting; after SIGKILL the journal still holds every record
  written before.

``--skip-done`` runs only kernels that have no final record in the journal yet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .journal import Journal
from .worker import EXIT_RESTART

# Seconds the parent waits past the worker's own watchdog before killing it.
GRACE_S = 10.0
STDERR_TAIL = 3000


class _Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise _Interrupted(signal.Signals(signum).name)


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a child started with ``start_new_session=True`` and everything it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_bounded(cmd: list[str], log: Path, timeout: float) -> tuple[int, bool]:
    """``cmd`` in its own process group, its output to ``log``, killed with everything it
    started after ``timeout`` seconds: ``(return code, timed out)``."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            return proc.returncode, False
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return proc.returncode, True


def _last_progress(path: Path) -> dict | None:
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def _tail(path: Path) -> str:
    return (
        path.read_text(encoding="utf-8", errors="replace")[-STDERR_TAIL:] if path.is_file() else ""
    )


class Orchestrator:
    def __init__(self, pack: Path, journal: Journal, options, log=print):
        self.pack, self.journal, self.options, self.log = pack, journal, options, log
        self.proc: subprocess.Popen | None = None
        # Each worker's names, progress and stderr, kept beside the journal for a post-mortem.
        if str(journal.path) == os.devnull:
            self.scratch = Path(tempfile.mkdtemp(prefix="gpu-pack-run-"))
        else:
            self.scratch = journal.path.parent / f"{journal.path.stem}-workers"
            self.scratch.mkdir(parents=True, exist_ok=True)
        self.launched = 0

    def worker_command(self, names: list[str], progress: Path, deadline: float) -> list[str]:
        names_file = self.scratch / f"names-{os.getpid()}-{self.launched}.json"
        names_file.write_text(json.dumps(names))
        o = self.options
        cmd = [
            sys.executable,
            str(Path(__file__).resolve().parent.parent / "run.py"),
            "worker",
            "--pack", str(self.pack),
            "--out", str(self.journal.path),
            "--names-file", str(names_file),
            "--progress", str(progress),
            "--parent-pid", str(os.getpid()),
            "--deadline", str(deadline),
            "--kernel-timeout", str(o.kernel_timeout),
            "--calls", str(o.calls),
            "--warmup", str(o.warmup),
            "--repeat", str(o.repeat),
        ]  # fmt: skip
        return cmd + ([] if o.time else ["--check-only"])

    def start(self, names: list[str], deadline: float) -> tuple[Path, Path]:
        self.launched += 1
        progress = self.scratch / f"progress-{os.getpid()}-{self.launched}.jsonl"
        stderr = self.scratch / f"stderr-{os.getpid()}-{self.launched}.txt"
        cmd = self.worker_command(names, progress, deadline)
        with open(stderr, "w") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=None, stderr=err, start_new_session=True, cwd=self.pack
            )
        return progress, stderr

    def watch(self, progress: Path) -> tuple[int, bool]:
        """Wait for the worker; ``(returncode, killed by the parent's watchdog)``."""
        timeout = self.options.kernel_timeout
        limit = timeout + GRACE_S if timeout else float("inf")
        started = time.time()
        while True:
            try:
                return self.proc.wait(timeout=1.0), False
            except subprocess.TimeoutExpired:
                pass
            last = _last_progress(progress)
            since = time.time() - (last["t"] if last else started)
            if since > limit:
                kill_group(self.proc)
                return self.proc.returncode, True

    def blame(self, progress: Path, stderr: Path, returncode: int, killed: bool) -> list[str]:
        """Records for the kernels a failed worker was in; their names."""
        last = _last_progress(progress)
        names = [n for n in (last or {}).get("names", []) if n not in self.journal.finished()]
        if not names:
            return []
        err = _tail(stderr)
        timed_out = killed or "Timeout (" in err
        if returncode == EXIT_RESTART and not timed_out:
            return []  # the worker wrote the kernel's own error record before restarting
        status = "timeout" if timed_out else "crashed"
        for name in names:
            self.journal.write(
                {
                    "kind": "kernel",
                    "name": name,
                    "status": status,
                    "stage": last["stage"],
                    "returncode": returncode,
                    "killed_by_parent": killed,
                    "stderr_tail": err,
                    "kernel_timeout_s": self.options.kernel_timeout,
                }
            )
        self.log(f"{status:7} {', '.join(names)} at stage {last['stage']!r} (exit {returncode})")
        return names

    def run(self, entries: list[dict], deadline: float) -> dict:
        todo = [e["name"] for e in entries]
        fruitless = 0
        while todo and time.time() < deadline:
            progress, stderr = self.start(todo, deadline)
            returncode, killed = self.watch(progress)
            self.proc = None
            finished = self.journal.finished()
            before = len(todo)
            todo = [name for name in todo if name not in finished]
            if returncode == 0 and not killed:
                break  # the worker did everything, or stopped at the deadline
            blamed = self.blame(progress, stderr, returncode, killed)
            todo = [name for name in todo if name not in blamed]
            fruitless = 0 if len(todo) < before else fruitless + 1
            if fruitless >= 2:
                self.journal.write(
                    {
                        "kind": "error",
                        "stage": "worker start",
                        "error": f"two workers in a row ended (exit {returncode}) before "
                        "finishing any kernel",
                        "stderr_tail": _tail(stderr),
                        "left": todo,
                    }
                )
                return {"status": "error", "left": todo}
        if todo:
            why = "time budget spent" if time.time() >= deadline else "worker stopped early"
            self.journal.write({"kind": "not_run", "names": todo, "why": why})
        return {"status": "complete" if not todo else "budget", "left": todo}


def run(pack: Path, entries: list[dict], options, header: dict, log=print) -> int:
    """Run ``entries`` through workers into ``options.out``; the exit status (0: every kernel
    that ran is correct, 1: some kernel is not, 2: the run itself failed)."""
    journal = Journal(options.out)
    if options.skip_done:
        done = journal.finished()
        entries = [e for e in entries if e["name"] not in done]
        header = {**header, "skipped_done": len(done)}
    journal.write({"kind": "header", **header, "kernels": len(entries)})
    orchestrator = Orchestrator(pack, journal, options, log)
    deadline = time.time() + options.budget
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        outcome = orchestrator.run(entries, deadline)
    except _Interrupted as why:
        if orchestrator.proc is not None:
            kill_group(orchestrator.proc)
        journal.write({"kind": "error", "stage": "run", "error": f"interrupted by {why}"})
        return 2
    except BaseException:
        # The caller records the error; no worker may outlive the run.
        if orchestrator.proc is not None:
            kill_group(orchestrator.proc)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    names = {e["name"] for e in entries}
    mine = [r for r in journal.records() if r.get("kind") == "kernel" and r["name"] in names]
    latest = {r["name"]: r["status"] for r in mine}
    bad = sorted(n for n, status in latest.items() if status != "ok")
    journal.write({"kind": "end", **outcome, "bad": bad, "workers": orchestrator.launched})
    if outcome["status"] == "error":
        return 2
    return 1 if bad else 0

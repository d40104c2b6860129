"""Nsight Compute (``ncu``) on named kernels: why a kernel is slower than its baseline.

One ``ncu`` process per kernel, each profiling the first launches of the pack's kernels
(``--kernel-name regex:main_kernel``) of one ``run.py worker --check-only --calls 1`` child,
in its own process group, killed with everything under it when its time is up. The sections
are the ones that tell a decomposition's cost from a code-generation one: speed of light,
occupancy, launch statistics (registers, shared memory, waves), memory workload (DRAM bytes,
L2 hit rate), warp states and instruction statistics (executed instructions).

Each kernel's raw CSV (``--csv --page details``) is kept beside the journal; the journal gets
one record per kernel with the metrics :data:`METRICS` names, per launch, or the reason it has
none (``ncu`` not found, not permitted to read the counters, timeout).
"""

from __future__ import annotations

import csv
import io
import shutil
import sys
import time
from pathlib import Path

from .journal import Journal
from .orchestrate import run_bounded

SECTIONS = (
    "SpeedOfLight",
    "Occupancy",
    "LaunchStats",
    "MemoryWorkloadAnalysis",
    "WarpStateStats",
    "InstructionStats",
)
# The metrics the journal keeps, by the name ncu's details page gives them.
METRICS = (
    "Duration",
    "Registers Per Thread",
    "Static Shared Memory Per Block",
    "Dynamic Shared Memory Per Block",
    "Grid Size",
    "Block Size",
    "Waves Per SM",
    "Theoretical Occupancy",
    "Achieved Occupancy",
    "Block Limit Registers",
    "Block Limit Shared Mem",
    "Compute (SM) Throughput",
    "Memory Throughput",
    "DRAM Throughput",
    "L2 Hit Rate",
    "L1/TEX Hit Rate",
    "Executed Instructions",
    "Executed Ipc Active",
    "Warp Cycles Per Issued Instruction",
)
# Launches of the pack's kernels profiled per child: the float pass's, and a second kernel of
# the same call where a build has one.
LAUNCHES = 2


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for root in sorted(Path("/usr/local").glob("cuda*"), reverse=True):
        for candidate in (root / "bin" / "ncu", *sorted(root.glob("nsight-compute*/ncu"))):
            if candidate.is_file():
                return str(candidate)
    for candidate in sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu")):
        if candidate.is_file():
            return str(candidate)
    return None


def _child(pack: Path, name: str, scratch: Path) -> list[str]:
    names_file = scratch / f"{name}.names.json"
    names_file.write_text(f'["{name}"]')
    return [
        sys.executable,
        str(Path(__file__).resolve().parent.parent / "run.py"),
        "worker",
        "--pack", str(pack),
        "--out", str(scratch / f"{name}.jsonl"),
        "--names-file", str(names_file),
        "--check-only",
        "--calls", "1",
        "--kernel-timeout", "0",
    ]  # fmt: skip


def parse(text: str) -> list[dict]:
    """Per profiled launch (ncu's ``ID``), its kernel name and the :data:`METRICS` found, as
    ``{"value": ..., "unit": ...}``, from ncu's ``--csv --page details`` output (lines before
    the CSV header, ncu's own messages, are skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    launches: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        launch = launches.setdefault(
            row.get("ID", "?"), {"kernel": row.get("Kernel Name"), "metrics": {}}
        )
        metric = row.get("Metric Name")
        if metric in METRICS:
            launch["metrics"][metric] = {
                "value": row.get("Metric Value"),
                "unit": row.get("Metric Unit"),
            }
    return list(launches.values())


def profile_once(ncu: str, pack: Path, name: str, timeout: float, scratch: Path) -> dict:
    """``ncu`` over one kernel's child: the record for the journal."""
    cmd = [ncu, "--target-processes", "all", "--kernel-name", "regex:main_kernel",
           "--launch-count", str(LAUNCHES), "--csv", "--page", "details"]  # fmt: skip
    for section in SECTIONS:
        cmd += ["--section", section]
    cmd += _child(pack, name, scratch)
    out_path = scratch / f"{name}.ncu.csv"
    started = time.monotonic()
    returncode, timed_out = run_bounded(cmd, out_path, timeout)
    text = out_path.read_text(errors="replace")
    launches = parse(text)
    if timed_out:
        status = "timeout"
    elif "ERR_NVGPUCTRPERM" in text:
        status = "not permitted"
    elif not launches:
        status = "no data"
    else:
        status = "ok"
    return {
        "kind": "profile",
        "name": name,
        "status": status,
        "returncode": returncode,
        "seconds": round(time.monotonic() - started, 1),
        "launches": launches,
        "csv": out_path.name,
        "output_tail": "" if status == "ok" else text[-3000:],
    }


def run(pack: Path, entries: list[dict], options, log=print) -> int:
    """The ``profile`` command: ``ncu`` on each of ``entries`` (``--only``) within
    ``options.budget`` seconds, ``options.kernel_budget`` at most each. Exit status 0 only when
    every kernel was profiled."""
    journal = Journal(options.out)
    names = [e["name"] for e in entries]
    ncu = find_ncu()
    journal.write({"kind": "header", "stage": "profile", "kernels": names, "ncu": ncu})
    if ncu is None:
        journal.write({"kind": "end", "status": "unavailable", "why": "ncu not found"})
        log("profile: ncu not found")
        return 1
    deadline = time.monotonic() + options.budget
    scratch = Path(options.out).parent / (Path(options.out).stem + "-children")
    scratch.mkdir(parents=True, exist_ok=True)
    done = 0
    for name in names:
        left = deadline - time.monotonic()
        if left < 5:
            journal.write({"kind": "profile", "name": name, "status": "not run (budget)"})
            continue
        record = profile_once(ncu, pack, name, min(options.kernel_budget, left), scratch)
        journal.write(record)
        done += record["status"] == "ok"
        log(f"profile {name}: {record['status']} ({record['seconds']} s)")
        if record["status"] == "not permitted":
            break
    journal.write({"kind": "end", "status": f"{done} of {len(names)} profiled"})
    return 0 if done == len(names) else 1

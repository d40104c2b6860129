"""compute-sanitizer on the kernels the pack marks, last, within its own budget.

One sanitizer process per tool (memcheck, racecheck, synccheck, initcheck) over every marked
kernel, each running ``run.py worker --check-only`` (no timing, no watchdog: the sanitizer
slows kernels down a hundredfold) in its own process group, killed with everything under it
when its time is up. racecheck and synccheck see shared memory and barriers; initcheck sees
reads of global memory nothing wrote, such as a fix-up reading a partial no block stored.
Only the pack's kernels are instrumented (``--kernel-name``), so the child makes its tensors on
the host and copies them (``--host-inputs``): initcheck sees a copy, but not the writes of
torch's uninstrumented kernels (the first GPU run, without it, flagged the A reads of every
block it watched).

Two verdicts are kept apart: the sanitizer's (``clean`` only when its summary was printed and
counts no error; ``errors``, ``timeout``, or ``no-summary`` when the child died before the
sanitizer could summarise) and the child's own records (ok, wrong, error) in the tool's journal.
A tool that counted errors is rerun per kernel, while the budget allows, to name the kernel.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

from .journal import Journal, kernel_records, read
from .orchestrate import run_bounded

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
_SUMMARY = re.compile(r"(?:ERROR|RACECHECK|SYNCCHECK) SUMMARY:.*?(\d+) error", re.IGNORECASE)


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


def _child(pack: Path, names: list[str], journal: Path) -> list[str]:
    names_file = journal.with_suffix(".names.json")
    names_file.write_text("[" + ", ".join(f'"{n}"' for n in names) + "]")
    return [
        sys.executable,
        str(Path(__file__).resolve().parent.parent / "run.py"),
        "worker",
        "--pack", str(pack),
        "--out", str(journal),
        "--names-file", str(names_file),
        "--check-only",
        "--host-inputs",
        "--calls", "1",
        "--kernel-timeout", "0",
    ]  # fmt: skip


def sanitize_once(sanitizer, tool, pack, names, timeout, scratch: Path, kernel_filter=True) -> dict:
    """One sanitizer process of ``tool`` over ``names``: its verdict and the child's."""
    journal = scratch / f"{tool}-{len(names)}-{time.time_ns()}.jsonl"
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "3", "--print-limit", "20"]
    if kernel_filter:
        cmd += ["--kernel-name", "kns=main_kernel"]
    cmd += _child(pack, names, journal)
    log = journal.with_suffix(".log")
    started = time.monotonic()
    returncode, timed_out = run_bounded(cmd, log, timeout)
    output = log.read_text(errors="replace")
    if kernel_filter and not timed_out and "SUMMARY" not in output and "kernel-name" in output:
        # A compute-sanitizer without --kernel-name: check every kernel instead.
        return sanitize_once(sanitizer, tool, pack, names, timeout, scratch, kernel_filter=False)
    errors = [int(x) for x in _SUMMARY.findall(output)]
    if timed_out:
        status = "timeout"
    elif not errors:
        status = "no-summary"
    elif returncode == 0 and sum(errors) == 0:
        status = "clean"
    else:
        status = "errors"
    child = {r["name"]: r["status"] for r in kernel_records(read(journal))}
    return {
        "kind": "sanitizer",
        "tool": tool,
        "kernels": names,
        "status": status,
        "errors": sum(errors),
        "returncode": returncode,
        "seconds": round(time.monotonic() - started, 1),
        "timeout_s": timeout,
        "kernel_filter": kernel_filter,
        "child": {n: child.get(n, "no record") for n in names},
        "output_tail": output[-4000:],
    }


def run(pack: Path, entries: list[dict], options, log=print) -> int:
    """The ``sanitize`` command: every tool on the marked kernels within ``options.budget``
    seconds, a journal record per sanitizer process. Exit status 0 only when every tool ran
    clean and every child's kernel was ok."""
    journal = Journal(options.out)
    # The kernels named with --only, else the ones the pack marks.
    chosen = [e["name"] for e in entries if options.only or e.get("sanitize")]
    sanitizer = find_sanitizer()
    journal.write(
        {"kind": "header", "stage": "sanitize", "kernels": chosen, "sanitizer": sanitizer}
    )
    if sanitizer is None or not chosen:
        why = "compute-sanitizer not found" if sanitizer is None else "no kernel is marked"
        journal.write({"kind": "end", "status": "unavailable", "why": why})
        log(f"sanitizers: {why}")
        return 1
    deadline = time.monotonic() + options.budget
    scratch = Path(options.out).parent / (Path(options.out).stem + "-children")
    scratch.mkdir(parents=True, exist_ok=True)
    tools = options.tools.split(",") if options.tools else list(TOOLS)
    reports = []
    for i, tool in enumerate(tools):
        left = deadline - time.monotonic()
        # Each tool gets an equal share of what is left, so the last one is not starved.
        timeout = min(options.tool_timeout, left / (len(tools) - i))
        if timeout < 1:
            journal.write({"kind": "sanitizer", "tool": tool, "status": "not run (budget)"})
            continue
        report = sanitize_once(sanitizer, tool, pack, chosen, timeout, scratch)
        journal.write(report)
        reports.append(report)
        log(f"sanitizer {tool} on {len(chosen)} kernels: {report['status']} ({report['child']})")
        if report["status"] != "errors":
            continue
        for name in chosen:
            left = deadline - time.monotonic()
            if left < 1:
                break
            single = sanitize_once(sanitizer, tool, pack, [name], min(timeout, left), scratch)
            journal.write(single)
            log(f"  {tool} {name}: {single['status']}")
    clean = len(reports) == len(tools) and all(
        r["status"] == "clean" and set(r["child"].values()) == {"ok"} for r in reports
    )
    journal.write({"kind": "end", "status": "clean" if clean else "not clean"})
    return 0 if clean else 1

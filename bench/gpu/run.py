"""Run the GPU proof pack on a CUDA GPU: correctness, timings, cuBLAS, compute-sanitizer.

This file and ``runner/`` travel inside the pack and run where TVM's compiler is not installed
and nothing can be compiled: Python 3.12 with PyTorch and a CUDA driver. They need the standard
library, the pack's runtime-only TVM (``runtime/``) and, except for ``dry-run``, torch. The
staged command (``device_run.sh``) calls the commands below in order; each can be run alone::

    python run.py env       --out env.json            # driver, torch, CUDA, clocks, sanitizer
    python run.py dry-run   --out dry-run.json        # no GPU needed: every entry up to the launch
    python run.py smoke     --out smoke.jsonl         # one data-parallel kernel per schedule source
    python run.py diagnose  --out diagnose.jsonl      # after a failed smoke, in one process
    python run.py sweep     --out results.jsonl --budget 200 [--skip-done]
    python run.py sanitize  --out sanitizer.jsonl --budget 80 [--only NAMES --tools TOOLS]
    python run.py profile   --out profile.jsonl --only NAMES   # Nsight Compute, per kernel

What is checked and how kernels are timed: :mod:`runner.checks` and :mod:`runner.worker`; how a
hang or a crash is survived: :mod:`runner.orchestrate`. Exit status: 0 when every kernel that
ran is correct (and, for ``sanitize``, every tool ran clean), 1 when not, 2 when the run itself
failed; every early exit leaves an ``error`` record in the journal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from runner import (  # noqa: E402
    diagnose,
    journal,
    orchestrate,
    pack_files,
    profile,
    sanitize,
    worker,
)


def _common(parser: argparse.ArgumentParser, out: str) -> None:
    parser.add_argument("--pack", type=Path, default=HERE, help="the pack's folder")
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--only", help="comma-separated kernel names (default: all)")


def _kernels(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kernel-timeout",
        type=float,
        default=30.0,
        help="seconds one stage of one kernel may take (0: no watchdog)",
    )
    parser.add_argument("--calls", type=int, default=5, help="checked calls on exact inputs")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20, help="timed rounds at most")
    parser.add_argument("--check-only", action="store_true", help="correctness, no timing")
    parser.add_argument(
        "--host-inputs",
        action="store_true",
        help="make inputs and outputs on the host and copy them to the GPU (for initcheck)",
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = top.add_subparsers(dest="command", required=True)
    _common(commands.add_parser("env", help="the machine, as JSON"), "env.json")
    _common(commands.add_parser("dry-run", help="every entry up to the launch"), "dry-run.json")
    smoke = commands.add_parser("smoke", help="one data-parallel kernel per schedule source")
    _common(smoke, "smoke.jsonl")
    _kernels(smoke)
    smoke.add_argument("--budget", type=float, default=90.0)
    _common(commands.add_parser("diagnose", help="the smoke's kernels in one process"),
            "diagnose.jsonl")  # fmt: skip
    sweep = commands.add_parser("sweep", help="check and time every kernel, within a budget")
    _common(sweep, "results.jsonl")
    _kernels(sweep)
    sweep.add_argument("--budget", type=float, default=200.0, help="seconds; trims the sweep")
    sweep.add_argument("--skip-done", action="store_true",
                       help="run only kernels without a final record in --out")  # fmt: skip
    san = commands.add_parser(
        "sanitize", help="compute-sanitizer on the marked kernels (or the --only ones)"
    )
    _common(san, "sanitizer.jsonl")
    san.add_argument("--budget", type=float, default=80.0, help="seconds for every tool")
    san.add_argument("--tool-timeout", type=float, default=60.0, help="seconds per process")
    san.add_argument("--tools", help=f"comma-separated (default: {','.join(sanitize.TOOLS)})")
    prof = commands.add_parser("profile", help="Nsight Compute on the --only kernels")
    _common(prof, "profile.jsonl")
    prof.add_argument("--budget", type=float, default=120.0, help="seconds for every kernel")
    prof.add_argument("--kernel-budget", type=float, default=60.0, help="seconds per kernel")
    work = commands.add_parser("worker", help="internal: one worker process")
    _common(work, os.devnull)
    _kernels(work)
    work.add_argument("--names-file", required=True)
    work.add_argument("--progress", type=Path)
    work.add_argument("--deadline", type=float, default=0.0, help="time.time() to stop at")
    work.add_argument("--parent-pid", type=int, default=0, help="exit if the parent is gone")
    return top


def smoke_entries(entries: list[dict]) -> list[dict]:
    """The first data-parallel kernel of each schedule source."""
    chosen: dict[str, dict] = {}
    for entry in entries:
        if entry["variant"] == "data_parallel":
            chosen.setdefault(entry["schedule_source"], entry)
    return list(chosen.values())


def environment() -> dict:
    """The machine as the runner sees it (torch imported, CUDA initialised)."""
    facts: dict = {"python": platform.python_version(), "host": platform.node()}
    facts["driver"] = diagnose.driver_version()
    try:
        import torch

        facts["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda}
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            facts["device"] = {
                "name": props.name,
                "sms": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
            }
    except Exception as err:  # noqa: BLE001 - the record is the point
        facts["torch_error"] = f"{type(err).__name__}: {err}"
    facts["libraries"] = diagnose.mapped_libraries("libcudart", "libcuda.")
    facts["clocks"] = worker.clocks()
    found = sanitize.find_sanitizer()
    if found:
        proc = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
        facts["compute_sanitizer"] = proc.stdout.strip().splitlines()[-1:] or proc.stderr[-200:]
    return facts


def main(argv=None) -> int:
    options = parser().parse_args(argv)
    pack = options.pack.resolve()
    pack_files.setup_runtime(pack)
    if options.command == "env":
        facts = environment()
        options.out.write_text(json.dumps(facts, indent=1) + "\n")
        print(json.dumps(facts, indent=1))
        return 0
    manifest = pack_files.manifest(pack)
    entries = pack_files.select(manifest["kernels"], options.only)
    if options.command == "worker":
        options.time = not options.check_only
        return worker.main(options)
    if options.command == "dry-run":
        result = pack_files.dry_run(pack, entries)
        if str(options.out) != os.devnull:
            options.out.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    if options.command == "diagnose":
        return diagnose.run(pack, smoke_entries(entries), options.out)
    if options.command == "sanitize":
        return sanitize.run(pack, entries, options)
    if options.command == "profile":
        if not options.only:
            raise SystemExit("profile: name the kernels with --only (names in manifest.json)")
        return profile.run(pack, entries, options)
    if options.command == "smoke":
        entries = smoke_entries(entries)
        options.skip_done, options.check_only = False, True
    options.time = not options.check_only
    header = {
        "stage": options.command,
        "pack": manifest["created"],
        "shapes": manifest["shapes"],
        "host": platform.node(),
        "python": platform.python_version(),
        "options": {k: v for k, v in vars(options).items() if k not in ("pack", "out")},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        return orchestrate.run(pack, entries, options, header)
    except Exception as err:  # noqa: BLE001 - an error record, then the exit status
        journal.Journal(options.out).write(
            {"kind": "error", "stage": options.command, "error": f"{type(err).__name__}: {err}"}
        )
        print(f"{options.command} failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

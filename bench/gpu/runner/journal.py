"""The results journal: one JSON object per line, written and flushed as each record is final.

A run that is killed, times out or crashes keeps every record written before: nothing is held
back until the end. Several processes write the same journal in turn (the parent's header and
error records, each worker's kernel records), never at once, each line with one ``write`` of an
append-mode file.

Record kinds: ``header`` (first, one per run or resumed run), ``kernel`` (one per kernel, its
``status`` one of :data:`FINAL`), ``error`` (a failure that is not one kernel's: a worker that
could not start, a signal), ``not_run`` (kernels the budget left out) and ``end`` (the run's
own verdict; absent when the run was killed with SIGKILL).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# A kernel record with one of these statuses is final: ``--skip-done`` does not run it again.
FINAL = ("ok", "wrong", "error", "timeout", "crashed")


class Journal:
    """Appends records to ``path`` (``os.devnull``: nowhere)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def write(self, record: dict) -> None:
        if str(self.path) == os.devnull:
            return
        record = {"t": round(time.time(), 3), **record}
        line = json.dumps(record, default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(line)
            out.flush()

    def records(self) -> list[dict]:
        return read(self.path)

    def finished(self) -> set[str]:
        """Names of the kernels that have a final record."""
        return {
            r["name"]
            for r in self.records()
            if r.get("kind") == "kernel" and r.get("status") in FINAL
        }


def read(path: Path | str) -> list[dict]:
    """Every complete record of a journal (a line cut short by a kill is dropped)."""
    path = Path(path)
    if str(path) == os.devnull or not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def kernel_records(records: list[dict]) -> list[dict]:
    """The last kernel record of each kernel (a resumed run's record replaces an earlier one),
    in the order of those last records."""
    latest: dict[str, dict] = {}
    for record in records:
        if record.get("kind") == "kernel":
            latest.pop(record["name"], None)
            latest[record["name"]] = record
    return list(latest.values())

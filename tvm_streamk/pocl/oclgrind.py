"""Running a kernel under the Oclgrind simulator and judging what it reports.

Oclgrind executes every work-item of the OpenCL kernel and checks each access: out-of-bounds
global, local and private accesses, barrier divergence, uninitialised values reaching control
flow or memory, and (``OCLGRIND_DATA_RACES``, set by :mod:`.device`) data races. A Stream-K
kernel is expected to be clean of all of them, with two documented exceptions, both
inter-work-group hand-offs that Oclgrind's race detector cannot model (it knows no
happens-before through atomics and fences across work-groups):

* **the workspace fix-up's hand-off**: the last block to arrive at a tile's counter reads the
  partial tiles other blocks stored to ``sk_workspace``, and under a grid read at run time the
  peer record the tile's first and last peers stored to ``sk_peer_record``. Their stores happen
  before the counter's atomic increments that precede the reader's own increment (fence,
  barrier, atomic; see :mod:`tvm_streamk.transform.fixup_workspace`), but Oclgrind reports the
  pair as a read-write race. Accepted: read-write races between different work-groups whose
  both lines access ``sk_workspace``, or both ``sk_peer_record``.
* **TVM's float atomic add on OpenCL**: the codegen's ``atomic_add_float_emu`` helper reads
  the old value plainly and then retries ``atomic_cmpxchg`` until no other add intervened: the
  plain read races with other groups' compare-and-swap by design. Accepted: read-write races
  whose both lines lie inside that helper.

Anything else (every out-of-bounds, uninitialised or divergence report, any write-write race,
any race on other buffers) is a defect, raised as :class:`OclgrindReportError`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from . import device, runner
from .errors import PoclError

_LOCATION = re.compile(r"At line (\d+)")
_GROUP = re.compile(r"Group\((\d+,\d+,\d+)\)")
_HELPER = "atomic_add_float_emu"
# The buffers of the workspace fix-up's hand-off.
_HANDOFF_BUFFERS = ("sk_workspace", "sk_peer_record")


class OclgrindReportError(PoclError):
    """Oclgrind reported something other than the documented hand-off reads.

    ``reports`` holds those reports (each :class:`Report`'s ``text`` the whole diagnostic):
    the log itself is reopened, and emptied, by the next check's simulator context.
    """

    def __init__(self, message: str, reports: tuple = ()):
        super().__init__(message)
        self.reports = tuple(reports)


@dataclass(frozen=True)
class Report:
    """One diagnostic of Oclgrind's log.

    ``lines`` are the 1-based source lines it names (two for a race), ``groups`` the work-groups
    of its entities, ``text`` the whole diagnostic.
    """

    kind: str
    lines: tuple[int, ...]
    groups: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class CheckedRun:
    """The results of a run under Oclgrind: all arguments after it, and the accepted reports."""

    outputs: list
    accepted: tuple[Report, ...]


def parse(log: str) -> list[Report]:
    """The diagnostics of an Oclgrind log, in order."""
    reports = []
    for chunk in re.split(r"\n(?=\S)", log.strip()):
        chunk = chunk.strip("\n")
        if not chunk.strip():
            continue
        kind = chunk.splitlines()[0].strip()
        lines = tuple(int(n) for n in _LOCATION.findall(chunk))
        reports.append(Report(kind, lines, tuple(_GROUP.findall(chunk)), chunk))
    return reports


@functools.lru_cache(maxsize=8)
def _source_lines(source: str) -> tuple[str, ...]:
    return tuple(source.splitlines())


@functools.lru_cache(maxsize=8)
def _helper_lines(source: str) -> range:
    """Lines (1-based) of TVM's ``atomic_add_float_emu`` definition in ``source``."""
    lines = _source_lines(source)
    for i, line in enumerate(lines):
        if _HELPER in line and "{" in line:
            end = next((j for j in range(i, len(lines)) if lines[j].startswith("}")), i)
            return range(i + 1, end + 2)
    return range(0)


def is_documented_handoff(report: Report, source: str) -> bool:
    """Whether ``report`` is one of the two hand-offs of the module docstring."""
    if not report.kind.startswith("Read-write data race") or len(report.lines) != 2:
        return False
    if len(set(report.groups)) < 2:
        return False
    text = _source_lines(source)
    helper = _helper_lines(source)
    if all(n in helper for n in report.lines):
        return True
    return any(
        all(0 < n <= len(text) and buffer in text[n - 1] for n in report.lines)
        for buffer in _HANDOFF_BUFFERS
    )


def _excerpt(report: Report, source: str) -> str:
    text = _source_lines(source)
    where = "; ".join(
        f"line {n}: {text[n - 1].strip()[:160]}" for n in report.lines if 0 < n <= len(text)
    )
    if where:
        return f"{report.kind} ({where})"
    # No line of the kernel's source: the diagnostic itself is all there is to go on.
    text = " | ".join(ln.strip() for ln in report.text.splitlines() if ln.strip())
    return f"{report.kind or 'a report of no kind'} (no source line: {text[:300]!r})"


def check(mod, *arrays, pipeline: str = "default", func_name: str | None = None) -> CheckedRun:
    """Build ``mod`` for Oclgrind, run it once on ``arrays`` and judge the reports.

    Returns
    -------
    CheckedRun
        The arguments after the run (as :func:`tvm_streamk.pocl.run` returns them) and the
        documented hand-off reports that were accepted.

    Raises
    ------
    OclgrindReportError
        Naming every other report, with the OpenCL source line it points at; its ``reports``
        hold them whole.
    PoclError
        When Oclgrind's log cannot hold the run's reports (:func:`device.oclgrind_reports`).
    DeviceUnavailableError
        When Oclgrind is not installed (``bash scripts/install-opencl``).
    """
    # A fresh simulator context, so that no buffer inherits an earlier check's shadow memory.
    with device.use(device.with_fresh_context("oclgrind")):
        kernel = runner.compile(mod, pipeline, func_name=func_name)
        start = device.oclgrind_log_offset()
        outputs = kernel.run(*arrays)
        reports = parse(device.oclgrind_reports(start))
    accepted, rejected = [], []
    for report in reports:
        (accepted if is_documented_handoff(report, kernel.source) else rejected).append(report)
    if rejected:
        shown = "\n  ".join(_excerpt(r, kernel.source) for r in rejected[:5])
        more = f"\n  ... and {len(rejected) - 5} more" if len(rejected) > 5 else ""
        raise OclgrindReportError(
            f"Oclgrind reported {len(rejected)} problem(s) in {kernel.name!r} besides the "
            f"documented hand-off reads ({len(accepted)} accepted):\n  {shown}{more}\n"
            "The whole diagnostics: this exception's .reports (each Report's .text).",
            rejected,
        )
    return CheckedRun(outputs, tuple(accepted))

"""The GPU pack's run, rehearsed without a GPU: ``run.py`` and ``device_run.sh`` end to end.

The rehearsal pack (:mod:`bench.gpu.rehearsal`) holds CPU kernels in the pack's calling
convention: correct ones, one that drops a partial tile, one that hangs and one that aborts.
torch is the numpy stand-in and nvidia-smi and compute-sanitizer are stand-ins too
(``tests/standins``). What must hold, as on the GPU machine: a correct kernel is ``ok``, the
lost partial is ``wrong`` (the exact pass counts the elements), the hang is a ``timeout`` and
the abort a ``crash`` while every other kernel still runs, a sanitizer that hangs is killed
with everything it started, a run killed in the middle keeps every finished record and resumes
with ``--skip-done``, and a failed smoke stops the staged command after a diagnosis.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gpu import rehearsal, report
from bench.gpu.runner import journal
from tests.helpers import ROOT, STANDINS

DEVICE_RUN = ROOT / "bench" / "gpu" / "device_run.sh"
# Short enough for the hang to cost little, long enough for a loaded machine's TVM import.
KERNEL_TIMEOUT = 6
EXPECTED = {
    "48x40x96-cpu-data_parallel": "ok",
    "48x40x96-cpu-stream_k-workspace": "ok",
    "48x40x96-cpu-split_k-drops": "wrong",
    "48x40x96-cpu-stream_k-hangs": "timeout",
    "48x40x96-cpu-hybrid": "ok",
    "32x24x64-cpu-data_parallel": "ok",
    "32x24x64-cpu-stream_k-atomic": "ok",
    "32x24x64-cpu-stream_k-crashes": "crashed",
}


@pytest.fixture(scope="module")
def rehearsal_pack(tmp_path_factory):
    out = tmp_path_factory.mktemp("rehearsal") / "pack"
    rehearsal.build(out)
    return out


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(STANDINS)
    env["PATH"] = f"{STANDINS / 'bin'}:{Path(sys.executable).parent}:{env['PATH']}"
    env["PYTHON"] = sys.executable
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(pack: Path, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(pack / "run.py"), *args],
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=300,
        check=False,
    )


def _statuses(path: Path) -> dict:
    return {r["name"]: r["status"] for r in journal.kernel_records(journal.read(path))}


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` is gone (or a zombie about to be reaped) within ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def _staged(pack: Path, tmp_path: Path, **env) -> tuple[Path, subprocess.CompletedProcess]:
    """``device_run.sh`` on the pack's archive: the folder it wrote and how it ended."""
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(DEVICE_RUN), f"{pack}.tar.gz"],
        capture_output=True,
        text=True,
        env=_env(OUT=out, KERNEL_TIMEOUT=KERNEL_TIMEOUT, WORK=tmp_path / "work", **env),
        timeout=400,
        check=False,
    )
    return out, proc


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _processes_with(marker: str) -> list[int]:
    """PIDs of this user's processes whose environment holds ``marker``."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def test_a_killed_staged_command_leaves_no_archiver(rehearsal_pack, tmp_path):
    # SIGKILL skips the EXIT trap that stops the archiving loop; the loop must end by itself.
    marker = f"TVM_STREAMK_ARCHIVER_TEST={os.getpid()}-{time.monotonic_ns()}"
    archive = tmp_path / "back" / "gpu-out.tar.gz"
    env = _env(
        OUT=tmp_path / "out",
        WORK=tmp_path / "work",
        KERNEL_TIMEOUT=KERNEL_TIMEOUT,
        ARCHIVE=archive,
        ARCHIVE_EVERY=1,
    )
    env[marker.split("=")[0]] = marker.split("=")[1]
    proc = subprocess.Popen(
        ["bash", str(DEVICE_RUN), f"{rehearsal_pack}.tar.gz"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not archive.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert archive.exists(), "the archiver never wrote"
    proc.kill()
    proc.wait()

    def archivers() -> list[int]:
        return [p for p in _processes_with(marker) if "device_run.sh" in _cmdline(p)]

    deadline = time.monotonic() + 10
    while (left := archivers()) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in _processes_with(marker):  # what the killed script left running
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"the archiving loop outlived its script: {left}"


def test_staged_command_runs_every_stage(rehearsal_pack, tmp_path):
    # As the device tool runs it: the whole folder kept in one archive (8 files come back).
    archive = tmp_path / "back" / "gpu-out.tar.gz"
    named = "48x40x96-cpu-stream_k-workspace,48x40x96-cpu-data_parallel"
    out, proc = _staged(
        rehearsal_pack, tmp_path, ARCHIVE=archive, INITCHECK_ONLY=named, PROFILE_ONLY=named
    )
    stages = (out / "stages.log").read_text()
    # The sweep holds a wrong kernel: the command says so, after running every stage.
    assert proc.returncode == 1, stages + proc.stderr
    for stage in ("unpack", "env-before", "dry-run", "smoke", "sweep", "sanitize", "initcheck",
                  "profile", "env-after"):  # fmt: skip
        assert f"stage {stage} (limit" in stages, stage
    assert "stage smoke exit 0" in stages and "stage diagnose" not in stages
    assert json.loads((out / "env-before.json").read_text())["clocks"]["clocks.sm"] == "1980"
    # One data-parallel kernel per schedule source: the rehearsal has one source.
    assert _statuses(out / "smoke.jsonl") == {"48x40x96-cpu-data_parallel": "ok"}
    assert _statuses(out / "results.jsonl") == EXPECTED
    records = {r["name"]: r for r in journal.kernel_records(journal.read(out / "results.jsonl"))}
    # The lost partial: the first 16 x 16 outputs miss half of K; the exact pass sees it.
    assert records["48x40x96-cpu-split_k-drops"]["exact_mismatches"][0] > 0
    assert records["48x40x96-cpu-stream_k-hangs"]["stage"] == "float"
    assert "Timeout (0:00:0" in records["48x40x96-cpu-stream_k-hangs"]["stderr_tail"]
    ok = records["48x40x96-cpu-stream_k-workspace"]
    assert ok["exact_mismatches"] == [0] * 5 and ok["same_bits_as_first_call"] is True
    assert ok["median_ms"] > 0 and ok["cublas_ms"] > 0 and ok["clocks"]["before"]
    sanitizer = [r for r in journal.read(out / "sanitizer.jsonl") if r.get("kind") == "sanitizer"]
    assert [r["tool"] for r in sanitizer] == ["memcheck", "racecheck", "synccheck", "initcheck"]
    assert all(r["status"] == "clean" and set(r["child"].values()) == {"ok"} for r in sanitizer)
    # The named kernels, marked or not: initcheck alone, then Nsight Compute on each.
    initchecks = journal.read(out / "initcheck.jsonl")
    (initcheck,) = [r for r in initchecks if r.get("kind") == "sanitizer"]
    assert initcheck["tool"] == "initcheck" and set(initcheck["child"]) == set(named.split(","))
    profiled = [r for r in journal.read(out / "profile.jsonl") if r.get("kind") == "profile"]
    assert sorted((r["name"], r["status"]) for r in profiled) == [
        (n, "ok") for n in sorted(named.split(","))
    ]
    text = report.render(report.Run.from_folder(out))
    assert "| rehearsal | cpu | stream_k-workspace | 1 |" in text
    # The archive holds the finished folder: unpacked, it reports the same. It is written to a
    # temporary file and renamed, so nothing half-written is left beside it.
    assert [p.name for p in archive.parent.iterdir()] == ["gpu-out.tar.gz"]
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(archive.parent)], check=True)
    back = tmp_path / "back" / "out"
    assert (back / "manifest.json").is_file() and (back / "env-after.json").is_file()
    assert report.render(report.Run.from_folder(back)) == text
    assert "| 48x40x96-cpu-stream_k-hangs | timeout | float |" in text


def test_failed_smoke_stops_after_a_diagnosis(tmp_path):
    kernels = [rehearsal.Kernel(16, 16, 32, "data_parallel", flaw="crash")]
    pack = tmp_path / "pack"
    rehearsal.build(pack, kernels)
    out, proc = _staged(pack, tmp_path)
    stages = (out / "stages.log").read_text()
    assert proc.returncode == 1 and "smoke failed: stopped after the diagnosis" in stages
    assert not (out / "results.jsonl").exists() and (out / "env-after.json").is_file()
    steps = [r["step"] for r in journal.read(out / "diagnose.jsonl")]
    assert steps[:4] == ["environment", "torch", "tvm", "libraries"] and "kernel" in steps
    # The abort itself ends the diagnosis; faulthandler's stack is in its log.
    assert "Fatal Python error: Aborted" in (out / "diagnose.log").read_text()


def test_a_killed_run_keeps_its_records_and_resumes(rehearsal_pack, tmp_path):
    results = tmp_path / "results.jsonl"
    cmd = [sys.executable, str(rehearsal_pack / "run.py"), "sweep", "--out", str(results),
           "--kernel-timeout", str(KERNEL_TIMEOUT)]  # fmt: skip
    parent = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while len(_statuses(results)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    # SIGKILL to the parent alone: it cannot pass it on; its worker dies with it (PDEATHSIG).
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    lines = results.read_text().splitlines()
    assert all(json.loads(line) for line in lines), "a record was cut short"
    before = _statuses(results)
    assert 2 <= len(before) < len(EXPECTED), f"not killed in the middle: {before}"
    assert all(EXPECTED[n] == s for n, s in before.items()), before
    time.sleep(1.0)
    assert _statuses(results) == before, "a worker outlived its parent and went on writing"
    assert not any(r.get("kind") == "end" for r in journal.read(results))
    proc = _run(rehearsal_pack, "sweep", "--out", str(results), "--skip-done",
                "--kernel-timeout", str(KERNEL_TIMEOUT))  # fmt: skip
    # Its exit status speaks for the kernels it ran.
    left = {n: s for n, s in EXPECTED.items() if n not in before}
    assert proc.returncode == int(set(left.values()) != {"ok"}), proc.stdout + proc.stderr
    records = journal.read(results)
    headers = [r for r in records if r.get("kind") == "header"]
    assert headers[-1]["skipped_done"] == len(before)
    assert headers[-1]["kernels"] == len(EXPECTED) - len(before)
    assert _statuses(results) == EXPECTED
    ran_twice = [n for n in before if sum(r.get("name") == n for r in records) > 1]
    assert not ran_twice, f"--skip-done ran {ran_twice} again"


def test_a_sanitizer_that_hangs_leaves_no_process(rehearsal_pack, tmp_path):
    pids = tmp_path / "pids.txt"
    out = tmp_path / "sanitizer.jsonl"
    proc = _run(rehearsal_pack, "sanitize", "--out", str(out), "--budget", "6",
                "--tools", "memcheck,initcheck", SANITIZER_STANDIN="hang",
                SANITIZER_STANDIN_PIDS=pids)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reports = [r for r in journal.read(out) if r.get("kind") == "sanitizer"]
    assert [(r["tool"], r["status"]) for r in reports] == [
        ("memcheck", "timeout"), ("initcheck", "timeout")
    ]  # fmt: skip
    assert all(set(r["child"].values()) == {"no record"} for r in reports)
    started = [int(p) for line in pids.read_text().splitlines() for p in line.split()]
    assert len(started) == 4
    assert [p for p in started if not _gone(p)] == [], "a sanitizer process survived its timeout"


def test_sanitizer_errors_are_kept_apart_from_the_childs_verdict(rehearsal_pack, tmp_path):
    out = tmp_path / "sanitizer.jsonl"
    proc = _run(rehearsal_pack, "sanitize", "--out", str(out), "--budget", "120",
                "--tools", "memcheck", SANITIZER_STANDIN="errors")  # fmt: skip
    assert proc.returncode == 1
    first, *singles = [r for r in journal.read(out) if r.get("kind") == "sanitizer"]
    # The sanitizer counted errors; the kernels themselves were right.
    assert first["status"] == "errors" and first["errors"] == 2
    assert set(first["child"].values()) == {"ok"}
    assert [r["kernels"] for r in singles] == [[n] for n in first["kernels"]]
    silent = _run(rehearsal_pack, "sanitize", "--out", str(tmp_path / "silent.jsonl"),
                  "--tools", "racecheck", SANITIZER_STANDIN="silent")  # fmt: skip
    assert silent.returncode == 1
    (only,) = [r for r in journal.read(tmp_path / "silent.jsonl") if r.get("kind") == "sanitizer"]
    assert only["status"] == "no-summary"


def _stage_limits() -> dict:
    """The stage limits ``device_run.sh`` uses when nothing overrides them."""
    script = (
        f'eval "$(sed -n "/^UNPACK_S=/,/^KILL_S=/p" {DEVICE_RUN})"; '
        "for v in UNPACK_S ENV_S DRY_RUN_S SMOKE_S DIAGNOSE_S SWEEP_S SANITIZE_S KILL_S; "
        'do echo "$v ${!v}"; done'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return {k: int(v) for k, v in (line.split() for line in out.stdout.splitlines())}


def test_staged_command_fits_eight_minutes():
    # The device tool allows 10 minutes a command and about 15 of device time in a session,
    # a few minutes of start-up included: the whole staged command, at its worst (every stage
    # at its limit, each then killed), must fit 8 minutes.
    limits = _stage_limits()
    normal = ["UNPACK_S", "ENV_S", "DRY_RUN_S", "SMOKE_S", "SWEEP_S", "SANITIZE_S", "ENV_S"]
    failed_smoke = ["UNPACK_S", "ENV_S", "DRY_RUN_S", "SMOKE_S", "DIAGNOSE_S", "ENV_S"]
    for path in (normal, failed_smoke):
        worst = sum(limits[s] + limits["KILL_S"] for s in path)
        assert worst <= 8 * 60, (path, worst)


def test_profile_keeps_each_kernels_metrics_and_says_when_the_counters_are_refused(
    rehearsal_pack, tmp_path
):
    names = ["48x40x96-cpu-data_parallel", "48x40x96-cpu-stream_k-workspace"]
    out = tmp_path / "profile.jsonl"
    proc = _run(rehearsal_pack, "profile", "--out", str(out), "--only", ",".join(names))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [r for r in journal.read(out) if r.get("kind") == "profile"]
    assert [r["name"] for r in records] == names
    for r in records:
        (launch,) = r["launches"]
        # The metrics kept, with their units; the child ran the kernel (its journal says ok).
        assert launch["metrics"]["Duration"] == {"value": "12.35", "unit": "us"}
        assert "Not A Kept Metric" not in launch["metrics"]
        assert (out.parent / "profile-children" / r["csv"]).is_file()
        child = journal.read(out.parent / "profile-children" / f"{r['name']}.jsonl")
        assert [k["status"] for k in journal.kernel_records(child)] == ["ok"]
    refused = tmp_path / "refused.jsonl"
    proc = _run(rehearsal_pack, "profile", "--out", str(refused), "--only", ",".join(names),
                NCU_STANDIN="noperm")  # fmt: skip
    assert proc.returncode == 1
    records = [r for r in journal.read(refused) if r.get("kind") in ("profile", "end")]
    # Refused once, refused for all: it stops there and says so.
    assert [(r.get("name"), r["status"]) for r in records] == [
        (names[0], "not permitted"), (None, "0 of 2 profiled")
    ]  # fmt: skip
    assert "ERR_NVGPUCTRPERM" in records[0]["output_tail"]
    unnamed = _run(rehearsal_pack, "profile", "--out", str(tmp_path / "x.jsonl"))
    assert unnamed.returncode != 0 and "--only" in unnamed.stderr

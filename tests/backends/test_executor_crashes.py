"""A PoCL that crashes compiling a kernel hands the check to the next executor, and says so.

``tests.helpers.on_first_executor_that_builds`` runs a check in a child process per executor:
pip's PoCL 3.0-rc2 segfaults compiling some kernels MetaSchedule samples, on some CPUs. A child
killed by a signal moves the check on, named in what it returns; a child that fails otherwise
fails the test, as a wrong result must.
"""

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import on_first_executor_that_builds
from tvm_streamk import pocl

MARKER = "TVM_STREAMK_TEST_CRASH_MARKER"


def _crash_the_first_time() -> str:
    marker = Path(os.environ[MARKER])
    if not marker.exists():
        marker.write_text("crashed")
        print("building the first kernel", file=sys.stderr, flush=True)
        # As a compiler's segfault ends it: TVM's own handler would let a sent signal return.
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGSEGV)
    return pocl.current().key


def _wrong() -> None:
    raise AssertionError("row 0 differs")


def test_a_crash_moves_the_check_to_the_next_executor(default_opencl, tmp_path, monkeypatch):
    monkeypatch.setenv(MARKER, str(tmp_path / "crashed"))
    key = default_opencl.key
    found = on_first_executor_that_builds(f"{__name__}:_crash_the_first_time", [key, key])
    assert found == (key, key, [f"{key}: SIGSEGV building the first kernel"])


def test_every_executor_crashing_fails(default_opencl, tmp_path, monkeypatch):
    monkeypatch.setenv(MARKER, str(tmp_path / "absent"))
    with pytest.raises(pytest.fail.Exception, match="every executor crashed.*SIGSEGV"):
        on_first_executor_that_builds(f"{__name__}:_crash_the_first_time", [default_opencl.key])


def test_a_failing_check_fails_without_moving_on(default_opencl):
    with pytest.raises(pytest.fail.Exception, match="row 0 differs"):
        on_first_executor_that_builds(f"{__name__}:_wrong", [default_opencl.key, "never-tried"])

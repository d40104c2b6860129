"""Shared fixtures: the OpenCL executors the numeric tests run on.

A module that runs kernels says ``pytestmark = pytest.mark.usefixtures("opencl")``: each of its
tests then runs on the default executor (the first usable PoCL that builds with its
optimiser), and with ``-m executors`` on every other usable PoCL of this machine (pip's where
it builds on this CPU, Debian's): the two compile the same kernel differently, and kernels must
not depend on one compiler's luck. A machine with none fails those tests with the probe's
findings instead of skipping them: a skipped numeric suite would read as a pass.
"""

import pytest

from tvm_streamk import pocl

EXECUTORS = pocl.usable_executors()


def pytest_report_header(config):
    try:
        found = pocl.executors()
    except pocl.DeviceUnavailableError as err:
        return [f"OpenCL executors: none ({err})"]
    return ["OpenCL executors: " + "; ".join(e.describe() for e in found)]


def _require(executor: str | None = None):
    """Fail (never skip) the calling test when no usable executor exists."""
    try:
        return pocl.device.find(executor) if executor else pocl.current()
    except pocl.DeviceUnavailableError as err:
        pytest.fail(str(err), pytrace=False)


def _executor_params() -> list:
    if not EXECUTORS:
        return ["missing"]
    first = pocl.device.preferred(EXECUTORS)
    others = [e for e in EXECUTORS if e.key != first.key]
    return [first.key, *(pytest.param(e.key, marks=pytest.mark.executors) for e in others)]


@pytest.fixture(params=_executor_params())
def opencl(request):
    """Every usable PoCL in turn, made current for the test."""
    executor = _require(None if request.param == "missing" else request.param)
    with pocl.use(executor):
        yield executor


@pytest.fixture
def default_opencl():
    """The default executor (for tests that run kernels in a subprocess or once is enough)."""
    return _require()


@pytest.fixture
def oclgrind():
    """The Oclgrind simulator; its absence fails the test (``bash scripts/install-opencl``)."""
    return _require("oclgrind")


@pytest.fixture
def webgpu_adapter():
    """The WebGPU adapter (lavapipe here); its absence fails the test with the probe's findings
    and the remedy (``bash scripts/install-webgpu``, ``pip install wgpu``)."""
    from tvm_streamk import webgpu

    try:
        return webgpu.current()
    except webgpu.WebGPUUnavailableError as err:
        pytest.fail(str(err), pytrace=False)

"""Every tutorial runs in its fast mode; each asserts its own results against float64 numpy."""

import importlib.util

import pytest

from tests.helpers import ROOT

TUTORIALS = ROOT / "tutorials"

pytestmark = pytest.mark.usefixtures("opencl")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"tutorial_{name}", TUTORIALS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_tutorial_is_tested_here():
    assert sorted(p.stem for p in TUTORIALS.glob("*.py")) == ["fused_epilogue", "stream_k_gemm"]


def test_stream_k_gemm(capsys):
    tutorial = _load("stream_k_gemm")
    rows = tutorial.main(fast=True)
    assert rows and all(max(r["errors"]) <= tutorial.TOLERANCE for r in rows)
    assert all(r["data_parallel_s"] > 0 and r["stream_k_s"] > 0 for r in rows)
    assert "Stream-K decomposition for block 'C_update'" in capsys.readouterr().out


def test_fused_epilogue(capsys):
    tutorial = _load("fused_epilogue")
    result = tutorial.main(fast=True)
    assert max(result["errors"].values()) <= tutorial.TOLERANCE
    assert result["bitwise_identical"]
    out = capsys.readouterr().out
    assert "atomic fix-up refused: [no-epilogue]" in out
    assert "fixup     workspace" in out

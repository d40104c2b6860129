"""The ``tvm-streamk`` command line and the device discovery it relies on."""

import json
import re
import subprocess
import sys

import pytest
import tvm

from tvm_streamk import cli, pocl, ptxas
from tvm_streamk import device as devices

needs_pocl = pytest.mark.usefixtures("default_opencl")

# 3 x 1 tiles of 32 x 32 with 8 K-panels on 2 SMs: tile 1 is split, so the fix-up runs.
SMALL = ["--m", "96", "--n", "32", "--k", "64", "--num-sms", "2", "--repeat", "1"]


@needs_pocl
def test_demo_runs_as_a_module_and_passes():
    done = subprocess.run(
        [sys.executable, "-m", "tvm_streamk", "demo", *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "96x32x64 float32" in out
    assert out.count("(tolerance 1e-05): PASS") == 2
    assert "data-parallel" in out and "Stream-K" in out and " ms" in out
    assert "Stream-K decomposition for block 'C_update' of 'main'" in out
    assert "3 tiles of 32x32 x 8 K-panels" in out
    assert "the heuristic would choose" in out
    assert out.rstrip().endswith("PASS")


@needs_pocl
def test_demo_fails_with_status_1_when_a_check_fails(monkeypatch, capsys):
    # No relative error is below a negative tolerance: both checks must report FAIL.
    monkeypatch.setitem(cli.TOLERANCE, "float32", -1.0)
    assert cli.main(["demo", *SMALL, "--device", "pocl"]) == 1
    out = capsys.readouterr().out
    assert out.count(": FAIL") == 2
    assert "FAIL: a kernel disagrees with float64 numpy" in out


def test_source_prints_the_cuda_kernel_with_its_atomic(capsys):
    args = ["source", "--m", "160", "--n", "64", "--k", "64", "--num-sms", "4"]
    assert cli.main([*args, "--blocks-per-sm", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("// tvm-streamk: C = A @ B, 160x64x64 float32")
    assert "stream_k: 10 tiles x 8 panels on grid 4 (4 SMs x 1 block(s)/SM), atomic fixup" in out
    assert out.count('extern "C" __global__ void') >= 2  # the zeroing prologue and the kernel
    assert "atomicAdd(" in out


def test_source_takes_the_sm_count_from_the_target_tag(capsys):
    assert cli.main(["source", "--target", "nvidia/nvidia-a100", "--k", "64"]) == 0
    # The default M is one tile more than a wave of the A100's 108 SMs (x resident blocks).
    header = capsys.readouterr().out.splitlines()[1]
    assert "(108 SMs x " in header, header


def test_source_of_an_untabled_gpu_needs_num_sms(capsys):
    status = cli.main(["source", "--target", '{"kind": "cuda", "arch": "sm_80"}'])
    assert status == 2
    assert "--num-sms" in capsys.readouterr().err


def test_explain_prints_the_plan(capsys):
    args = ["explain", "--tiles", "133", "--panels", "64", "--num-sms", "132"]
    assert cli.main([*args, "--tile-shape", "128x128"]) == 0
    out = capsys.readouterr().out
    assert "133 tiles of 128x128 x 64 K-panels" in out
    assert "132 SMs x 1 block(s)/SM = 132 slots" in out
    assert "predicted speed-up" in out


def test_explain_from_a_gemm_shape_as_json(capsys):
    args = ["explain", "--m", "512", "--n", "512", "--k", "2048", "--bm", "128", "--bn", "128"]
    args += ["--bk", "32", "--target", "nvidia/nvidia-h100", "--policy", "split_k"]
    assert cli.main([*args, "--splits", "3", "--fixup", "workspace", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["tiles"], report["panels"], report["num_sms"]) == (16, 64, 132)
    assert report["plan"]["label"] == "split_k(S=3)"
    # 16 tiles split 3 ways: one fp32 128x128 slot per block, one int32 counter per tile.
    assert report["plan"]["workspace_bytes"] == 16 * 3 * 128 * 128 * 4 + 16 * 4


@pytest.mark.parametrize(
    "argv, why",
    [
        (["--tiles", "100", "--panels", "16", "--target", "nvidia/nvidia-h200"], "--m --n --k"),
        (
            ["--tiles", "100", "--panels", "16", "--target", "nvidia/nvidia-a10"],
            "nvidia/nvidia-a10 is not a GPU of tvm_streamk.cost_model.GPU_SPECS (it prices ",
        ),
    ],
    ids=["no-shape", "no-spec"],
)
def test_explain_says_why_a_target_gives_no_microseconds(argv, why, capsys):
    # Before, the JSON's predicted_us were null and so was its unpriced.
    assert cli.main(["explain", *argv, "--dtype", "float16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["predicted_us"] == {"plan": None, "data_parallel": None, "roofline": None}
    assert why in report["unpriced"]
    assert cli.main(["explain", *argv]) == 0
    assert "not priced, predictions in units" in capsys.readouterr().out


def test_explain_reports_bad_arguments_with_status_2(capsys):
    assert cli.main(["explain", "--tiles", "3"]) == 2
    assert "--panels" in capsys.readouterr().err
    assert cli.main(["explain", "--tiles", "3", "--panels", "4", "--policy", "stream_k"]) == 2
    assert "give --num-sms N or --target TAG" in capsys.readouterr().err


def test_default_device_is_pocl_without_a_usable_gpu(monkeypatch):
    def no_gpu(_index):
        raise RuntimeError("CUDA runtime not built")

    monkeypatch.setattr(tvm, "cuda", no_gpu)
    assert not devices.cuda_available()
    if pocl.available():
        assert devices.default_device() == "pocl"
        assert devices.num_sms("pocl") == pocl.compute_units()

    def missing():
        raise pocl.DeviceUnavailableError("no usable OpenCL CPU executor (findings)")

    monkeypatch.setattr(pocl, "current", missing)
    with pytest.raises(devices.NoDeviceError, match=r"no CUDA GPU .*\(findings\)"):
        devices.default_device()
    with pytest.raises(devices.NoDeviceError, match="asked for"):
        devices.num_sms("cuda")


@pytest.mark.parametrize("how", ["entry point", "module"])
def test_no_command_lists_the_commands(how, capsys):
    if how == "module":
        done = subprocess.run(
            [sys.executable, "-m", "tvm_streamk"], capture_output=True, text=True, timeout=120
        )
        status, err = done.returncode, done.stderr
    else:
        status, err = cli.main([]), capsys.readouterr().err
    assert status == 2
    for command in ("demo", "source", "explain"):
        assert f"    {command}" in err, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--policy", "split_k"], "--policy split_k needs --splits N"),
        (["--policy", "stream_k", "--splits", "3"], "--splits goes with --policy split_k"),
        (
            ["--policy", "stream_k", "--variant", "one_tile"],
            "--variant one_tile goes with --policy",
        ),
    ],
)
def test_policy_flags_are_named_as_flags(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["explain", "--tiles", "5", "--panels", "4", "--num-sms", "2", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "splits=" not in err, err


def test_source_default_is_one_tile_past_a_full_wave_of_resident_blocks(capsys):
    # One tile more than every resident block of every SM: the grid the kernel runs on.
    assert cli.main(["source", "--target", "nvidia/nvidia-h100", "--k", "64"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    tiles, grid = (int(x) for x in re.search(r"(\d+) tiles x .* on grid (\d+)", header).groups())
    assert tiles == grid + 1, header
    per_sm = int(re.search(r"x (\d+) block\(s\)/SM", header).group(1))
    assert grid == 132 * per_sm and (per_sm > 1 or not ptxas.available()), header


def test_no_opencl_gives_the_probes_one_remedy(monkeypatch, capsys):
    # The Python API and the command line report a missing OpenCL executor with the probe's
    # own findings and remedy, not each a remedy of its own.
    def missing():
        raise pocl.DeviceUnavailableError("no usable OpenCL CPU executor (probe findings). REMEDY")

    monkeypatch.setattr(pocl, "current", missing)
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    with pytest.raises(devices.NoDeviceError) as info:
        devices.default_device()
    assert "(probe findings). REMEDY" in str(info.value)
    assert cli.main(["demo", *SMALL]) == 2
    assert "(probe findings). REMEDY" in capsys.readouterr().err

"""What the tests share: targets, tolerances, paths and small IR inspections.

One home for each: a test module imports these by name and never defines its own copy, nor
imports another test module's private helpers (shared kernels are in :mod:`tests.kernels`).
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
import tvm_ffi

from tvm_streamk import resources

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
EXPECTED_IR = TESTS / "expected_ir"
STANDINS = TESTS / "standins"

OPENCL = tvm.target.Target({"kind": "opencl"})
A100 = tvm.target.Target("nvidia/nvidia-a100")
H100 = tvm.target.Target("nvidia/nvidia-h100")
# The archs the ptxas budget tests build for, by the tag of a GPU of each, and its SMs.
SM_TARGETS = {"sm_80": "nvidia/nvidia-a100", "sm_90": "nvidia/nvidia-h100"}
SM_COUNTS = {"sm_80": 108, "sm_90": 132}
# What a Stream-K kernel may take beyond the data-parallel kernel of its schedule, per ptxas:
# registers per thread and bytes of static shared memory (its fix-up's flags and counters).
EXTRA_REGISTERS = 16
EXTRA_SHARED = 1024
# fp32 accumulation of the tests' K products of values in [-1, 1] stays within this of float64,
# relative to the largest output (max|out - ref| / max|ref|).
FP32_TOL = 1e-5
FIXUPS = ("atomic", "workspace")
# Every concrete policy, as stream_k's keywords, and its test id.
POLICIES = [
    {"policy": "data_parallel"},
    {"policy": "split_k", "splits": 3},
    {"policy": "stream_k"},
    {"policy": "hybrid", "variant": "one_tile"},
    {"policy": "hybrid", "variant": "two_tile"},
]
POLICY_IDS = ["-".join(map(str, p.values())) for p in POLICIES]
# ``blocks_per_sm`` of a resources test, by test id: ptxas's count, and the default estimate
# from the IR (issue 31), which declares nothing to ptxas.
SIZINGS = {"ptxas": "ptxas", "estimate": None}


def with_sizings(cases, over_budget_when_estimated: dict | None = None) -> list:
    """``cases`` (tuples of parameters), each once per :data:`SIZINGS` with ``blocks_per_sm``
    last; a case ``over_budget_when_estimated`` names (its tuple, to what ptxas reads) is a
    strict xfail at the estimated grid, where nothing holds ptxas to the budget."""
    over = over_budget_when_estimated or {}
    params = []
    for case in cases:
        for name, sizing in SIZINGS.items():
            reason = over.get(tuple(case)) if sizing is None else None
            marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)]
            params.append(
                pytest.param(
                    *case,
                    sizing,
                    marks=marks if reason else [],
                    id="-".join([*map(str, case), name]),
                )
            )
    return params


def assert_grid_resident(uses: dict, arch: str, planned: int) -> None:
    """Every block of a persistent grid planned at ``planned`` blocks per SM is resident at
    once: ptxas's count for the kernels ``uses`` (``resources.kernel_uses``) holds that many,
    or the last blocks would wait for a second wave."""
    _, held = resources.fewest_blocks(uses, arch)
    assert held.blocks >= planned, (planned, held, uses)


# Pages of docs/ whose snippets need a device the default suite does not install: their own
# marked suite runs them (docs/webgpu.md: tests/backends/test_webgpu.py).
DEVICE_PAGES = {"webgpu"}


def python_snippets(page) -> list[str]:
    """The ```python blocks of a Markdown page."""
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def block_idx_extents(mod: tvm.IRModule, func: str = "main") -> list[tuple[str, int]]:
    """``(thread tag, extent)`` of every ``blockIdx``-bound loop of ``mod[func]``, in order."""
    found = []

    def on_for(loop):
        binding = loop.thread_binding
        if binding is not None and binding.thread_tag.startswith("blockIdx"):
            found.append((binding.thread_tag, int(loop.extent)))

    tvm_ffi.structural_walk(mod[func].body, (tvm.tirx.For, on_for))
    return found


def bracketed(text: str, opening: str) -> list[str]:
    """What follows each occurrence of ``opening`` in ``text`` up to the bracket that closes
    the last ``(`` or ``[`` opened in ``opening``."""
    pair = "()" if opening.rfind("(") > opening.rfind("[") else "[]"
    found = []
    for start in (m.end() for m in re.finditer(re.escape(opening), text)):
        depth, end = 1, start
        while depth:
            depth += {pair[0]: 1, pair[1]: -1}.get(text[end], 0)
            end += 1
        found.append(text[start : end - 1])
    return found


def cuda_modules(lib) -> list:
    """The CUDA modules a ``tvm.compile`` result imports, however deep."""
    found, stack = [], [lib.mod]
    while stack:
        mod = stack.pop()
        if mod.kind == "cuda":
            found.append(mod)
        stack.extend(mod.imports)
    return found


def conv_reference_for(kwargs: dict):
    """The float64 reference of ``workloads.conv(**kwargs)``, as a function of its arguments."""
    from tvm_streamk import workloads

    geometry = {k: v for k, v in kwargs.items() if k not in ("data_shape", "weight_shape")}
    return lambda args: workloads.conv_reference(args, **geometry)


# A child process of on_first_executor_that_builds: the function's JSON result, on its last line.
_CHILD = """
import importlib, json, sys
from tvm_streamk import pocl
module, name, key = sys.argv[1:]
with pocl.use(key):
    result = getattr(importlib.import_module(module), name)()
print("RESULT " + json.dumps(result))
"""


def on_first_executor_that_builds(function: str, keys, timeout: int = 1800):
    """``(key, result, crashes)``: ``function`` ("module:name", no arguments, a JSON result)
    run in a fresh Python process on each OpenCL executor of ``keys`` in turn, until one
    returns; ``crashes`` says which executors died before it, and where.

    pip's PoCL 3.0-rc2 segfaults compiling some kernels MetaSchedule samples: an LLVM crash in
    its work-group compiler (``pocl::VariableUniformityAnalysis::markInductionVariables``),
    on kernels that depend on the CPU it compiles for (seed 8's first M = 7 candidate of
    ``tests/integrations/test_meta_schedule_invariance.py`` on an Intel Xeon; seed 7's third on
    an AMD EPYC), and it aborts on others. Either takes the whole process, so it is met in a
    child: one killed by a signal moves on to the next executor. ``function`` reports progress
    on stderr ("building ..."), so a crash names the kernel it was building. A child that fails
    otherwise (an exception, a wrong result) fails the calling test with its output.
    """
    module, name = function.split(":")
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    crashes = []
    for key in keys:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, module, name, key],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=timeout,
        )
        if done.returncode < 0:
            last = [line for line in done.stderr.splitlines() if line.startswith("building ")]
            where = last[-1] if last else "before building a kernel"
            crashes.append(f"{key}: {signal.Signals(-done.returncode).name} {where}")
            continue
        if done.returncode != 0:
            pytest.fail(f"{function} on {key} failed:\n{done.stderr[-4000:]}", pytrace=False)
        result = done.stdout.strip().splitlines()[-1]
        assert result.startswith("RESULT "), done.stdout[-2000:]
        return key, json.loads(result[len("RESULT ") :]), crashes
    pytest.fail(f"{function}: every executor crashed: {crashes}", pytrace=False)

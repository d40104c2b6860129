"""What the tests share: targets, tolerances, paths and small IR inspections.

One home for each: a test module imports these by name and never defines its own copy, nor
imports another test module's private helpers (shared kernels are in :mod:`tests.kernels`).
"""

import re
from pathlib import Path

import pytest
import tvm
import tvm_ffi

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

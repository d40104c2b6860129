"""Build one GEMM kernel of the GPU pack: schedule, Stream-K decision, CUDA build, cubin.

A kernel is a schedule source (the reference schedule or dlight's, fp32 SIMT or fp16 tensor
cores) and a decomposition (data-parallel as scheduled, or a ``tvm_streamk.stream_k`` call).
:func:`build` returns the exported library, the cubin ptxas made from the CUDA source, and the
manifest record; nothing here runs a kernel.

TVM 0.27 keeps CUDA source in the module (its codegen never compiles); a CUDA runtime loading
the library compiles it through the ``tvm_callback_cuda_compile`` global. The GPU machine has no
compiler, so the source is compiled here, for the target's arch, and ``run.py`` registers a
callback that hands back this cubin by the source's SHA-256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tvm

import tvm_streamk
from tvm_streamk import cost_model, decomposition, occupancy, ptxas, resources, workloads
from tvm_streamk import decision as decisions
from tvm_streamk._compat import Schedule, dlight, dlight_cuda_target
from tvm_streamk.analysis import first_site

TARGET = "nvidia/nvidia-h100"
NUM_SMS = 132
REFERENCE_TILE = {"bm": 64, "bn": 64, "bk": 16}


@dataclass(frozen=True)
class Variant:
    """A schedule source and the ``stream_k`` keywords applied to it (None: data-parallel)."""

    source: str
    name: str
    decision: dict | None = None
    sanitize: bool = False

    @property
    def label(self) -> str:
        return f"{self.source}-{self.name}"


DP = {"reference": None, "dlight": None, "dlight_wmma": None}
SIMT_DECISIONS = {
    "heuristic": {"policy": "heuristic"},
    "stream_k-atomic": {"policy": "stream_k", "fixup": "atomic"},
    "stream_k-workspace": {"policy": "stream_k", "fixup": "workspace"},
    "hybrid": {"policy": "hybrid"},
    # One block per SM: with the occupancy grid a small shape's tiles fit one wave and the
    # hybrid is data-parallel; here its full waves are data-parallel and the rest Stream-K.
    "hybrid-one_tile": {"policy": "hybrid", "variant": "one_tile", "blocks_per_sm": 1},
    "split_k": {"policy": "split_k", "splits": 3},
    "stream_k-device": {"policy": "stream_k", "num_sms": "device"},
}
# Tensor-core fragments take the aligned split only: heuristic (an S dividing the panels) or an
# explicit split-K through the workspace.
WMMA_DECISIONS = {
    "heuristic": {"policy": "heuristic"},
    "split_k": {"policy": "split_k", "splits": 2, "fixup": "workspace"},
}
# One kernel of each kind compute-sanitizer checks: both fix-ups, the hybrid, split-K, tensor
# cores and the run-time grid.
SANITIZED = {
    ("reference", "stream_k-atomic"),
    ("reference", "stream_k-workspace"),
    ("reference", "hybrid-one_tile"),
    ("reference", "split_k"),
    ("reference", "stream_k-device"),
    ("dlight_wmma", "split_k"),
    ("dlight_dynamic", "stream_k-workspace"),
}


def _variants(source: str, decisions: dict, sanitize: bool = False) -> list[Variant]:
    out = [Variant(source, "data_parallel")]
    for name, decision in decisions.items():
        flagged = sanitize and (source, name) in SANITIZED
        out.append(Variant(source, name, decision, flagged))
    return out


# A dynamic-M kernel: the run-time choice, Stream-K with either fix-up (one build each).
DYNAMIC_DECISIONS = {
    "heuristic": {"policy": "heuristic"},
    "stream_k-atomic": {"policy": "stream_k", "fixup": "atomic"},
    "stream_k-workspace": {"policy": "stream_k", "fixup": "workspace"},
}

SUITES = {
    # The sweep: the schedule a user gets from dlight, and what the heuristic makes of it.
    "sweep": _variants("dlight", {"heuristic": SIMT_DECISIONS["heuristic"]}),
    "sweep-wmma": _variants("dlight_wmma", {"heuristic": WMMA_DECISIONS["heuristic"]}),
    "focus": _variants("reference", SIMT_DECISIONS)
    + _variants("dlight", SIMT_DECISIONS)
    + _variants("dlight_wmma", WMMA_DECISIONS),
    "tiny-reference": _variants("reference", SIMT_DECISIONS, sanitize=True),
    "tiny-dlight": _variants("dlight", {"heuristic": SIMT_DECISIONS["heuristic"]}),
    "tiny-wmma": _variants("dlight_wmma", {"split_k": WMMA_DECISIONS["split_k"]}, sanitize=True),
    "dynamic": _variants("dlight_dynamic", DYNAMIC_DECISIONS),
    "tiny-dynamic": _variants("dlight_dynamic", DYNAMIC_DECISIONS, sanitize=True),
}


class PackBuildError(RuntimeError):
    """A kernel of the pack could not be scheduled, built or compiled to a cubin."""


def _dlight_matmul(m, n: int, k: int, dtype: str, target) -> tvm.tirx.PrimFunc:
    """dlight's schedule of ``matmul(a[m, k], b[k, n])`` as a Relax model gets it (``m`` an
    int, or a ``tirx.Var`` for a symbolic M)."""
    mod = workloads.relax_matmul(m, n, k, dtype)
    # As the project's dlight rule sees sm_90a: the tensor-core schedule of sm_90.
    with dlight_cuda_target(target):
        mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul(), dlight.gpu.Fallback())(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func.with_attr("global_symbol", "main")


def schedule(source: str, m: int, n: int, k: int, target) -> Schedule:
    """A fresh data-parallel schedule of the GEMM from ``source``."""
    if source == "reference":
        return workloads.reference_schedule(workloads.gemm(m, n, k), **REFERENCE_TILE)
    if source == "dlight_dynamic":
        return Schedule(_dlight_matmul(tvm.tirx.Var("m", "int64"), n, k, "float32", target))
    dtype = {"dlight": "float32", "dlight_wmma": "float16"}[source]
    return Schedule(_dlight_matmul(m, n, k, dtype, target))


def cubin(source: str, arch: str) -> tuple[bytes, dict]:
    """ptxas's cubin of CUDA ``source`` for ``arch`` (``nvcc --cubin -O3``, as TVM's nvcc path)
    and, from the same compile, each kernel's resources (:func:`kernel_resources`)."""
    with tempfile.TemporaryDirectory() as tmp:
        cu, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        cu.write_text(source)
        cmd = ["nvcc", "--cubin", "-O3", f"-arch={arch}", "-Xptxas", "-v", "-o", str(out), str(cu)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise PackBuildError(f"nvcc failed ({' '.join(cmd)}):\n{proc.stdout}{proc.stderr}")
        report = ptxas.parse(proc.stderr + proc.stdout)
        return out.read_bytes(), kernel_resources(source, report, arch)


_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\((\d+)(?:,\s*\d+)?\)\s+(\w+)\(")


def kernel_resources(source: str, report: dict, arch: str) -> dict:
    """Per kernel: threads (its ``__launch_bounds__``), ptxas's registers, spills, stack and
    static shared memory, and the resident blocks per SM these allow on ``arch``; and the
    name of the kernel with the fewest resident blocks (the persistent one in a Stream-K
    build), so the report can tell a code-generation effect from a decomposition's."""
    threads = {name: int(n) for n, name in _LAUNCH_BOUNDS.findall(source)}
    kernels = {}
    for name, found in report.items():
        use = {
            "threads": threads.get(name),
            "registers": found.registers,
            "spill_bytes": found.spills,
            "stack": found.stack,
            "shared": found.shared,
        }
        if use["threads"]:
            held = occupancy.resident_blocks(arch, use["threads"], found.registers, found.shared)
            use["blocks_per_sm"] = held.blocks
            use["limiter"] = held.limiter
        kernels[name] = use
    held = {n: k.get("blocks_per_sm", 1 << 30) for n, k in kernels.items()}
    return {"kernels": kernels, "main": min(held, key=lambda n: (held[n], n)) if held else None}


def _args(func: tvm.tirx.PrimFunc) -> list[dict]:
    return [
        {"name": buf.name, "shape": [int(s) for s in buf.shape], "dtype": str(buf.dtype)}
        for buf in func.params
    ]


def _plan_record(p: decomposition.Plan) -> dict:
    record = dataclasses.asdict(p)
    record["label"] = p.label
    return record


def _fixup_of(sch: Schedule, block: str) -> str | None:
    annotations = sch.get(sch.get_sblock(block)).annotations
    if not decisions.has_decision(annotations):
        return None
    return decisions.decode(annotations, block).fixup


def _predicted_us(site, target, fixup: str, predicted_plan, dp_plan) -> dict:
    """The microsecond model's times of the kernel and of its data-parallel baseline on
    ``target`` (:func:`tvm_streamk.cost_model.cost_for`), or why it has none: what the GPU run
    calibrates the model's constants against."""
    why = cost_model.why_unpriced(site, target, fixup)
    if why is not None:
        return {"predicted_us": None, "predicted_dp_us": None, "unpriced": why}
    cost = cost_model.cost_for(site, target, fixup)
    return {
        "predicted_us": cost_model.predicted_time(predicted_plan, cost=cost, fixup=fixup),
        "predicted_dp_us": cost_model.predicted_time(dp_plan, cost=cost, fixup=fixup),
        "unpriced": None,
    }


def _record(
    variant,
    mnk,
    args,
    output,
    site,
    fixup,
    p,
    dp_plan,
    target,
    source,
    predicted_plan=None,
    runtime_grid=False,
) -> dict:
    """The manifest record of one kernel at one shape (module docstring of ``run.py``)."""
    m, n, k = mnk
    predicted_plan = p if predicted_plan is None else predicted_plan
    return {
        "name": f"{m}x{n}x{k}-{variant.label}",
        "shape": {"m": m, "n": n, "k": k},
        "dtypes": {"a": args[0]["dtype"], "b": args[1]["dtype"], "c": args[output]["dtype"]},
        "acc_dtype": str(site.accumulator.dtype),
        "schedule_source": variant.source,
        "variant": variant.name,
        "decision": dict(variant.decision or {}),
        "fixup": fixup,
        "runtime_grid": runtime_grid,
        "plan": _plan_record(p),
        "data_parallel_plan": _plan_record(dp_plan),
        "predicted_units": cost_model.predicted_time(predicted_plan, fixup=fixup or "workspace"),
        "predicted_dp_units": cost_model.predicted_time(dp_plan),
        **_predicted_us(site, target, fixup or "workspace", predicted_plan, dp_plan),
        "target": str(target.attrs.get("tag", "") or TARGET),
        "arch": str(target.attrs["arch"]),
        "entry": "main",
        "args": args,
        "output_index": output,
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "sanitize": variant.sanitize,
        "device": "cuda",
    }


def _prepare(variant: Variant, m: int, n: int, k: int, target):
    """``(schedule, site, block, function, data-parallel blocks per SM)``, or None without a
    site. The data-parallel kernel's resident blocks give the baseline's plan."""
    sch = schedule(variant.source, m, n, k, target)
    site = first_site(sch.mod["main"])
    if site is None:
        return None
    _, dp_occupancy = resources.resident_blocks(sch.mod, target)
    return sch, site, site.block.name_hint, sch.mod["main"], max(1, dp_occupancy.blocks)


def build(variant: Variant, m: int, n: int, k: int, target=TARGET, num_sms: int = NUM_SMS):
    """``(library, cubin bytes, record)`` of one kernel, or None where the source does not apply.

    The record holds what ``run.py`` needs to call the kernel without TVM's compiler (argument
    order, shapes and dtypes, the output's index) and what the report compares it with (the
    plan, and the cost model's predicted time in units of one tile's K-panel iteration).
    """
    target = tvm.target.Target(target)
    prepared = _prepare(variant, m, n, k, target)
    if prepared is None:
        return None
    sch, site, block, func, dp_bps = prepared
    dp_plan = decomposition.plan(site.tiles, site.panels, num_sms, dp_bps, "data_parallel")
    fixup = None
    if variant.decision is None:
        p = dp_plan
    else:
        kwargs = {"num_sms": num_sms, **variant.decision}
        p = tvm_streamk.stream_k(sch, block, target=target, **kwargs)
        fixup = _fixup_of(sch, block)
    runtime_grid = variant.decision is not None and variant.decision.get("num_sms") == "device"
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    source = lib.mod.imports[0].inspect_source()
    arch = str(target.attrs["arch"])
    binary, used = cubin(source, arch)
    if runtime_grid:
        # Planned for one SM; predict for the GPU's count, as the run-time grid will be.
        predicted_plan = decomposition.plan(
            site.tiles, site.panels, num_sms, p.blocks_per_sm, "stream_k"
        )
    else:
        predicted_plan = p
    args = _args(func)
    output = [a["name"] for a in args].index(site.writebacks[-1].output.name)
    record = _record(
        variant,
        (m, n, k),
        args,
        output,
        site,
        fixup,
        p,
        dp_plan,
        target,
        source,
        predicted_plan=predicted_plan,
        runtime_grid=runtime_grid,
    )
    record["resources"] = used
    return lib, binary, record


def build_dynamic(variant: Variant, n: int, k: int, run_ms, target=TARGET, num_sms: int = NUM_SMS):
    """``(library, cubin bytes, records)`` of one dynamic-M kernel (a symbolic M), built once:
    one record per M of ``run_ms``, each with that M's argument shapes and plan (what the
    kernel runs at that count), all naming the same library; None where no site is found."""
    target = tvm.target.Target(target)
    prepared = _prepare(variant, 0, n, k, target)
    if prepared is None:
        return None
    sch, site, block, func, dp_bps = prepared
    fixup = None
    decision = None
    if variant.decision is not None:
        tvm_streamk.stream_k(sch, block, target=target, num_sms=num_sms, **variant.decision)
        fixup = _fixup_of(sch, block)
        decision = decisions.decode(sch.get(sch.get_sblock(block)).annotations, block)
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    source = lib.mod.imports[0].inspect_source()
    arch = str(target.attrs["arch"])
    binary, used = cubin(source, arch)
    output = [buf.name for buf in func.params].index(site.writebacks[-1].output.name)
    records = []
    for m in run_ms:
        tiles = site.tiles_at({"m": m})
        dp_plan = decomposition.plan(tiles, site.panels, num_sms, dp_bps, "data_parallel")
        p = dp_plan if decision is None else decisions.resolve(site, decision, target, {"m": m})
        args = [
            {
                "name": buf.name,
                "shape": [m if not isinstance(x, tvm.tirx.IntImm) else int(x) for x in buf.shape],
                "dtype": str(buf.dtype),
            }
            for buf in func.params
        ]
        record = _record(variant, (m, n, k), args, output, site, fixup, p, dp_plan, target, source)
        record["runtime_m"] = True
        record["resources"] = used
        # compute-sanitizer checks the first M's run (one launch of the library is enough).
        record["sanitize"] = variant.sanitize and m == run_ms[0]
        records.append(record)
    return lib, binary, records

"""What batch invariance costs: ptxas resources and the cost model's predicted time, with and
without ``batch_invariant=True``, for the same schedule, shape and policy.

For each schedule source (the reference SIMT schedule, dlight's fp32 SIMT matmul, dlight's fp16
WMMA matmul), each arch (sm_80 for an A100, sm_90 for an H100) and each policy asked for
(data-parallel, Stream-K, the heuristic), the kernel is built with the ``tvm_streamk``
pipeline for the arch and read by ptxas (registers, spill bytes, static shared memory of the
persistent kernel), and its time predicted by the cost model in microseconds on that GPU (the
plan as chosen; the cost model's figures, not measurements). Nothing runs.

Run ``python -m bench.batch_invariance_price`` from the repository root (nvcc needed);
``--out FILE`` writes the markdown table, which docs/batch_invariance.md holds.
"""

from __future__ import annotations

import argparse

import tvm

import tvm_streamk
from bench.gpu import kernels
from tvm_streamk import cost_model, ptxas, resources
from tvm_streamk._compat import Schedule
from tvm_streamk.analysis import first_site
from tvm_streamk.decision import decode, planned_site, resolve

ARCHS = {"sm_80": ("nvidia/nvidia-a100", 108), "sm_90": ("nvidia/nvidia-h100", 132)}
# (source, M, N, K): a last wave one tile past full, and a K of several chunks.
CASES = [
    ("reference", 1056, 1024, 2048),
    ("dlight", 4256, 256, 4096),
    ("dlight_wmma", 2048, 2048, 2048),
]
POLICIES = ("data_parallel", "stream_k", "heuristic")


def _schedule(source: str, m: int, n: int, k: int, target) -> tuple[Schedule, str]:
    """The GPU pack's data-parallel schedule of ``source`` (:func:`bench.gpu.kernels.schedule`)
    and its reduction block."""
    sch = kernels.schedule(source, m, n, k, target)
    return sch, first_site(sch.mod["main"]).block.name_hint


def _measure(source, mnk, arch, policy, invariant) -> dict:
    tag, sms = ARCHS[arch]
    target = tvm.target.Target(tag)
    sch, block = _schedule(source, *mnk, target)
    # The model's SM sharing, as the decision sees it: the data-parallel kernel's occupancy.
    _, dp = resources.resident_blocks(sch.mod, target)
    busy = cost_model.saturation(dp.warps_per_block, dp.blocks)
    plan = tvm_streamk.stream_k(
        sch, block, num_sms=sms, target=target, policy=policy, batch_invariant=invariant
    )
    func = sch.mod["main"]
    site = first_site(func)
    decision = decode(site.block.annotations, site.block.name_hint)
    cost = cost_model.cost_for(planned_site(site, decision), target, decision.fixup)
    predicted = cost_model.predicted_time(
        resolve(site, decision, target), cost=cost, fixup=decision.fixup, saturation=busy
    )
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    used = ptxas.resources(lib.mod.imports[0].inspect_source(), arch)
    # The persistent kernel: the one with the most registers (the others zero counters).
    kernel = max(used.values(), key=lambda r: (r.registers, r.shared))
    return {
        "plan": plan.label,
        "registers": kernel.registers,
        "spills": kernel.spills,
        "shared": kernel.shared,
        "predicted": predicted,
        "unit": cost.unit,
    }


def _us(t: float) -> str:
    """Three significant figures, whole microseconds from 100 on (no exponent)."""
    return f"{t:.0f}" if t >= 100 else f"{t:.3g}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="markdown file (default: stdout)")
    parser.add_argument("--archs", nargs="+", default=sorted(ARCHS))
    args = parser.parse_args(argv)
    if not ptxas.available():
        parser.error("nvcc is needed (ptxas reads the kernels' resources)")
    rows = [
        "| schedule (M x N x K) | arch | policy asked | plan without / with | registers | "
        "spill bytes | shared bytes | predicted time (us) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for source, *mnk in CASES:
        for arch in args.archs:
            for policy in POLICIES:
                plain = _measure(source, mnk, arch, policy, False)
                ours = _measure(source, mnk, arch, policy, True)
                change = ours["predicted"] / plain["predicted"] - 1
                rows.append(
                    f"| {source} ({'x'.join(map(str, mnk))}) | {arch} | {policy} | "
                    f"{plain['plan']} / {ours['plan']} | "
                    f"{plain['registers']} / {ours['registers']} | "
                    f"{plain['spills']} / {ours['spills']} | "
                    f"{plain['shared']} / {ours['shared']} | "
                    f"{_us(plain['predicted'])} / {_us(ours['predicted'])} ({change:+.0%}) |"
                )
                print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``model_report``: where a whole model's work goes under :func:`tvm_streamk.relax_pipeline`.

For each fused TensorIR function of a Relax model the report lists its calls, its floating-point
work (:func:`tvm_streamk.analysis.flops.kernel_flops`, all calls), the dlight rule that schedules
it, and the Stream-K decision with its predicted gain over data-parallel, or why there is none.
Its headline is the share of the model's FLOPs in kernels the project decides on (a
data-parallel decision of the cost model counts: it was weighed, not skipped).

It runs the pipeline's own passes up to scheduling and the same rules in the same order, so what
it reports is what ``tvm.compile(mod, target, relax_pipeline=relax_pipeline(target))`` builds.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import tvm
from tvm import relax, tirx

from ._compat import Schedule, target_tag
from ._compat import target as as_target
from .analysis.flops import kernel_flops
from .decomposition import Plan
from .dlight import StreamKMatmul
from .explain import explain
from .relax_pipeline import fusion_passes, require_sm_count, schedule_rules

# dlight rules whose schedules reduce across threads (rfactor + allreduce).
CROSS_THREAD_RULES = ("GEMV", "Reduction", "GeneralReduction")
CALL_OPS = ("relax.call_tir", "relax.call_tir_inplace", "relax.call_tir_with_grad")


@dataclass(frozen=True)
class KernelRow:
    """One fused kernel of the model.

    Attributes
    ----------
    name : str
        The kernel's global name in the module.
    calls : int
        How many times the model's Relax functions call it.
    flops : int or None
        Floating-point operations of all its calls; None for a symbolic shape.
    rule : str or None
        The dlight rule that schedules it (``"StreamKMatmul"`` for the project's rule); None
        when it was scheduled before the pipeline or by no rule.
    plan : Plan or None
        The decision recorded on it.
    predicted_speedup : float or None
        The cost model's data-parallel time over the plan's (1.0 for a data-parallel decision).
    why_not : str or None
        Why it carries no decision.
    """

    name: str
    calls: int
    flops: int | None
    rule: str | None
    plan: Plan | None
    predicted_speedup: float | None
    why_not: str | None

    @property
    def decided(self) -> bool:
        return self.plan is not None


@dataclass
class ModelReport:
    """Per-kernel decisions of a model; ``str()`` is the table, :meth:`as_dict` plain data."""

    target: str
    kernels: list[KernelRow] = field(default_factory=list)

    @property
    def total_flops(self) -> int:
        return sum(k.flops or 0 for k in self.kernels)

    @property
    def decided_flops(self) -> int:
        return sum(k.flops or 0 for k in self.kernels if k.decided)

    @property
    def decided_share(self) -> float | None:
        """The fraction of the model's FLOPs in decided kernels (None without constant FLOPs)."""
        total = self.total_flops
        return None if total == 0 else self.decided_flops / total

    def as_dict(self) -> dict:
        return {
            "target": self.target,
            "total_flops": self.total_flops,
            "decided_flops": self.decided_flops,
            "decided_share": self.decided_share,
            "kernels": [
                {
                    "name": k.name,
                    "calls": k.calls,
                    "flops": k.flops,
                    "rule": k.rule,
                    "policy": None if k.plan is None else k.plan.policy,
                    "variant": None if k.plan is None else k.plan.variant,
                    "reason": None if k.plan is None else k.plan.reason,
                    "predicted_speedup": k.predicted_speedup,
                    "why_not": k.why_not,
                }
                for k in self.kernels
            ],
        }

    def __str__(self) -> str:
        total = self.total_flops
        share = self.decided_share
        head = (
            f"{len(self.kernels)} kernels, {total / 1e9:.3f} GFLOP, "
            + ("no constant FLOPs" if share is None else f"{100 * share:.1f}% of it decided")
            + f" (target {self.target})"
        )
        rows = [("kernel", "calls", "MFLOP", "share", "rule", "decision", "predicted gain")]
        notes = []
        for k in sorted(self.kernels, key=lambda k: -(k.flops or 0)):
            decision = "-"
            if k.plan is not None:
                decision = k.plan.policy + (f"/{k.plan.variant}" if k.plan.variant else "")
            gain = "-" if k.predicted_speedup is None else f"{k.predicted_speedup:.2f}x"
            rows.append(
                (
                    k.name,
                    str(k.calls),
                    "?" if k.flops is None else f"{k.flops / 1e6:.1f}",
                    "-" if not total or k.flops is None else f"{100 * k.flops / total:.1f}%",
                    k.rule or "-",
                    decision,
                    gain,
                )
            )
            if k.why_not and k.flops:
                notes.append(f"{k.name}: {k.why_not}")
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [head, ""]
        for r in rows:
            cells = [
                r[i].ljust(widths[i]) if i in (0, 4, 5) else r[i].rjust(widths[i])
                for i in range(len(r))
            ]
            lines.append("  ".join(cells).rstrip())
        if notes:
            lines += ["", "why not:"]
            for note in notes:
                lines += textwrap.wrap(note, 100, initial_indent="  ", subsequent_indent="    ")
        return "\n".join(lines)


def model_report(
    mod: tvm.IRModule,
    target,
    *,
    num_sms=None,
    blocks_per_sm=None,
    policy: str = "heuristic",
    fixup: str = "auto",
    splits: int | None = None,
    variant: str | None = None,
) -> ModelReport:
    """Report, per fused kernel of the Relax model ``mod``, its work and its Stream-K decision.

    Parameters
    ----------
    mod : IRModule
        The Relax model, as a frontend imports it (``from_onnx``, ``from_exported_program``).
    target : Target or str
        The CUDA target to schedule for, as for :func:`tvm_streamk.relax_pipeline`.
    num_sms, blocks_per_sm, policy, fixup, splits, variant
        As for :func:`tvm_streamk.relax_pipeline`.

    Returns
    -------
    ModelReport

    Examples
    --------
    ::

        from tvm.relax.frontend.onnx import from_onnx
        model = from_onnx(onnx.load("resnet50.onnx"))
        report = tvm_streamk.model_report(model, "nvidia/nvidia-h100")
        print(report)             # the table
        report.decided_share      # 0.996
    """
    label = target if isinstance(target, str) else None
    target = as_target(target)
    require_sm_count(target, num_sms, "model_report")
    with target:
        fused = tvm.transform.Sequential(fusion_passes(target))(mod)
    calls = _call_counts(fused)
    rule = StreamKMatmul(num_sms, blocks_per_sm, policy, fixup, splits=splits, variant=variant)
    rules = schedule_rules(rule)
    report = ModelReport(_label(target, label))
    for gv, func in fused.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        report.kernels.append(
            _row(gv.name_hint, func, calls.get(gv.name_hint, 0), rule, rules, target)
        )
    return report


def _row(name, func, calls, rule, rules, target) -> KernelRow:
    flops = kernel_flops(func)
    total = None if flops is None else flops * calls
    if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
        return KernelRow(name, calls, total, None, None, None, "scheduled before the pipeline")
    # The key the rules record this kernel under (they share one record).
    key = rule.decisions.key(func)
    taken = None
    with target:
        for candidate in rules:
            if isinstance(candidate.apply(func, target, False), Schedule):
                taken = type(candidate).__name__
                break
    if key in rule.decided:
        plan = rule.decided[key]
        return KernelRow(name, calls, total, taken, plan, _speedup(plan), None)
    if key in rule.skipped:
        why = rule.skipped[key]
    elif taken is None:
        why = "no dlight rule schedules it"
    elif taken in CROSS_THREAD_RULES:
        why = (
            f"dlight's {taken} schedules it as a reduction across the threads of a block, "
            "which Stream-K does not split (its K loop is not a serial panel loop)"
        )
    else:
        why = (
            f"no Stream-K rule takes it (not a matmul or convolution, a low-batch matmul with a "
            f"K-major weight or a short depthwise reduction); dlight's {taken} schedules it"
        )
    return KernelRow(name, calls, total, taken, None, None, why)


def _label(target, given: str | None) -> str:
    return (
        given or target_tag(target) or f"{target.kind.name} {target.attrs.get('arch', '')}".strip()
    )


def _speedup(plan: Plan) -> float | None:
    """The cost model's predicted gain of ``plan`` over data-parallel, where it has one."""
    if plan.policy == "data_parallel":
        return 1.0
    try:
        return explain(plan, print_=False).speedup
    except (ValueError, TypeError):
        return None


def _call_counts(mod: tvm.IRModule) -> dict[str, int]:
    """How many times the Relax functions of ``mod`` call each TensorIR function."""
    ops = {tvm.ir.Op.get(name) for name in CALL_OPS}
    counts: dict[str, int] = {}

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and any(expr.op.same_as(op) for op in ops):
            callee = expr.args[0]
            if isinstance(callee, tvm.ir.GlobalVar):
                counts[callee.name_hint] = counts.get(callee.name_hint, 0) + 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts

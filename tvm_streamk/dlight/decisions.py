"""What the project's dlight rules share: their knobs, their record of decisions, the step that
adds a Stream-K decision to a dlight-style schedule, and the binding of left-over blocks."""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import tirx

from .._compat import Schedule, dlight, param_buffers
from ..analysis import blocks_under, first_site, is_reduction, refusals
from ..decision import Request, validate
from ..decomposition import check_policy_args
from ..errors import StreamKError
from ..gpus import UnknownGPUError, num_sms_for_target
from ..schedule import stream_k


@dataclass(frozen=True)
class Config:
    """Knobs of the rules, as for :func:`tvm_streamk.stream_k`; ``num_sms=None`` reads the
    target's tag or arch, ``splits`` serves ``policy="split_k"``, ``variant`` a policy's
    variant (``"two_tile"`` of the hybrid) and ``batch_invariant`` every decision
    (docs/batch_invariance.md)."""

    num_sms: int | None = None
    blocks_per_sm: int | None = None
    policy: str = "heuristic"
    fixup: str = "auto"
    splits: int | None = None
    variant: str | None = None
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        # What no kernel's shape decides is refused here, not once per kernel in ``skipped``:
        # the policy's arguments, then every knob stream_k checks before it looks at a
        # schedule (a fix-up batch invariance cannot take, say).
        check_policy_args(self.policy, self.splits, self.variant)
        validate(Request(**self.stream_k_kwargs))

    @property
    def stream_k_kwargs(self) -> dict:
        """The knobs :func:`tvm_streamk.stream_k` takes as they are (all but the SM count,
        which a rule reads for each target)."""
        return {k: v for k, v in self.rule_kwargs.items() if k != "num_sms"}

    @property
    def rule_kwargs(self) -> dict:
        """The keywords a rule's constructor takes to carry these knobs."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Decisions:
    """Per kernel, the plan a rule recorded (``decided``) or why it did not apply
    (``skipped``), keyed by :func:`kernel_key`. Rules of one pipeline share one record."""

    decided: dict[str, object] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def key(self, func: tirx.PrimFunc) -> str:
        return kernel_key(func, taken=self.decided.keys() | self.skipped.keys())


class RecordsDecisions:
    """The knobs and the record of a Stream-K dlight rule (mixed into each rule class, before
    the dlight base whose constructor it calls)."""

    def __init__(
        self,
        num_sms=None,
        blocks_per_sm=None,
        policy="heuristic",
        fixup="auto",
        decisions=None,
        *,
        splits=None,
        variant=None,
        batch_invariant=False,
    ):
        super().__init__()
        self.config = Config(
            num_sms, blocks_per_sm, policy, fixup, splits, variant, batch_invariant
        )
        self.decisions = Decisions() if decisions is None else decisions

    @property
    def decided(self) -> dict:
        """Kernel key -> the plan recorded on it."""
        return self.decisions.decided

    @property
    def skipped(self) -> dict:
        """Kernel key -> why the rule scheduled it without a decision."""
        return self.decisions.skipped


class OwnScheduleRule(RecordsDecisions, dlight.gpu.base.GPUScheduleRule):
    """A rule that writes its own schedule (:meth:`schedule`, or :meth:`scheduled` for one
    built from the function), then records a decision on it."""

    def schedule(self, sch: Schedule) -> bool:
        """Schedule ``sch`` in place; False (``sch`` untouched) when the rule does not apply."""
        raise NotImplementedError

    def scheduled(self, func: tirx.PrimFunc) -> Schedule | None:
        """The rule's schedule of ``func``, or None when the rule does not apply (at once for a
        function without a reduction, which no such rule takes: an elementwise kernel)."""
        if not any(is_reduction(block) for block in blocks_under(func.body)):
            return None
        sch = Schedule(func)
        return sch if self.schedule(sch) else None

    def apply(self, func: tirx.PrimFunc, target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = self.scheduled(func)
        if sch is None:
            return None
        decide(self, self.decisions.key(func), sch, target)
        return sch


def only_reduction(sch: Schedule):
    """The one block under the root that reduces, or None when there are none or several."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    reducing = [b for b in blocks if is_reduction(sch.get(b))]
    return reducing[0] if len(reducing) == 1 else None


def decide(rule, name: str, sch: Schedule, target) -> None:
    """Record in ``rule.decisions`` a Stream-K decision on the reduction of ``sch`` under
    ``name`` with ``rule.config``, or why not."""
    decisions, config = rule.decisions, rule.config
    block = _stream_k_block(sch)
    if block is None:
        decisions.skipped[name] = _why_no_site(sch)
        return
    try:
        num_sms = num_sms_for_target(config.num_sms, target)
    except UnknownGPUError as err:
        raise StreamKError.stated(
            "num-sms", f"{err}; for this rule: {type(rule).__name__}(num_sms=...)"
        ) from None
    try:
        decisions.decided[name] = stream_k(
            sch, block, num_sms=num_sms, target=target, **config.stream_k_kwargs
        )
    except StreamKError as err:
        decisions.skipped[name] = str(err)


FALLBACK_THREADS = 256


def bind_leftovers(sch: Schedule) -> None:
    """Bind every block still outside a thread-bound loop (a dropout's mask beside the kernel's
    main nest) one element per thread, as dlight's ``gpu.Fallback`` does."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        if not loops or sch.get(loops[0]).kind == tirx.ForKind.THREAD_BINDING:
            continue
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        bx, tx = sch.split(fused, [None, FALLBACK_THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")


def kernel_key(func: tirx.PrimFunc, taken=()) -> str:
    """A readable name for a kernel: its symbol when it has one, else its buffer shapes
    (``"kernel(4256x4096 float32, 4096x256 float32, 4256x256 float32)"``), made unique
    against ``taken`` with ``#2``, ``#3``, ..."""
    symbol = func.attrs.get("global_symbol", None) if func.attrs is not None else None
    if symbol:
        base = str(symbol)
    else:
        shapes = [
            "x".join(str(int(d)) if isinstance(d, tirx.IntImm) else str(d) for d in buf.shape)
            + f" {buf.dtype}"
            for buf in param_buffers(func)
            if hasattr(buf, "shape")
        ]
        base = f"kernel({', '.join(shapes)})"
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}#{n}"
    return key


def _why_no_site(sch: Schedule) -> str:
    """Why no block of the schedule is a Stream-K site: the first reduction's refusal."""
    (func,) = [f for f in sch.mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    found = refusals(func)
    if not found:
        return "no reduction block in dlight's schedule"
    block, reason = next(iter(found.items()))
    more = f" (and {len(found) - 1} more reduction block(s))" if len(found) > 1 else ""
    return f"block {block!r}: {reason}{more}"


def _stream_k_block(sch: Schedule) -> str | None:
    """The block of the scheduled function that Stream-K accepts, by analysis not name."""
    (func,) = [f for f in sch.mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    site = first_site(func)
    return None if site is None else site.block.name_hint

"""How a Stream-K decision is recorded on a block, so that traces print, serialise and replay.

Python cannot register a trace instruction, so :func:`tvm_streamk.stream_k` records its decision as
stock ``annotate`` instructions on the reduction block. Every value is an ``int32`` ``IntImm`` (or
an ``ExprRV`` sampled by MetaSchedule), never a string: that keeps the trace JSON-serialisable and
keeps the stock postprocs, which expect TIR values, happy. The lowering pass reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from ._compat import SBlock, structural_map
from .decomposition import policy as policies
from .errors import StreamKError
from .transform import fixup as fixups
from .transform._ir import replace_block

PREFIX = "tvm_streamk."
KEY_POLICY = PREFIX + "policy"
KEY_NUM_SMS = PREFIX + "num_sms"
KEY_BLOCKS_PER_SM = PREFIX + "blocks_per_sm"
KEY_SPLITS = PREFIX + "splits"
KEY_FIXUP = PREFIX + "fixup"
KEY_GROUP = PREFIX + "group"
KEYS = (KEY_POLICY, KEY_NUM_SMS, KEY_BLOCKS_PER_SM, KEY_SPLITS, KEY_FIXUP, KEY_GROUP)

# A policy is recorded by its registered code (tvm_streamk.decomposition.policy). Concrete
# policies only: "heuristic" is resolved before it is recorded, so a replayed trace never re-runs
# the model.
# A fix-up is recorded by its registered code (tvm_streamk.transform.fixup).
# num_sms recorded as 0 means: read the multiprocessor count of the device at run time.
DEVICE_SMS = 0
# num_sms recorded as -1 means: take the SM count of the target the module is compiled for.
TARGET_SMS = -1


@dataclass(frozen=True)
class Decision:
    """A decoded Stream-K decision."""

    policy: str
    variant: str | None
    num_sms: int
    blocks_per_sm: int
    splits: int
    fixup: str
    group: int

    def as_annotations(self) -> dict[str, tirx.IntImm]:
        def imm(v: int) -> tirx.IntImm:
            return tirx.IntImm("int32", int(v))

        return {
            KEY_POLICY: imm(policies.get(self.policy, self.variant).code),
            KEY_NUM_SMS: imm(self.num_sms),
            KEY_BLOCKS_PER_SM: imm(self.blocks_per_sm),
            KEY_SPLITS: imm(self.splits),
            KEY_FIXUP: imm(fixups.get(self.fixup).code),
            KEY_GROUP: imm(self.group),
        }


def stripped(annotations) -> dict:
    """A block's annotations without its Stream-K decision."""
    return {k: v for k, v in annotations.items() if not k.startswith(PREFIX)}


def without_decisions(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every Stream-K decision removed: the data-parallel kernels as scheduled."""

    def strip(block: SBlock) -> SBlock:
        if not any(key.startswith(PREFIX) for key in block.annotations):
            return block
        return replace_block(block, annotations=stripped(block.annotations))

    out = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            func = func.with_body(structural_map(func.body, (SBlock, strip)))
        out[gv] = func
    return tvm.IRModule(out, attrs=mod.attrs)


def has_decision(annotations) -> bool:
    return KEY_POLICY in annotations


def decision_of(annotations, where: str) -> Decision:
    """:func:`decode`, refusing a malformed decision with a ``StreamKError`` (condition
    ``decision``), as the lowering and the MetaSchedule annotation report it."""
    try:
        return decode(annotations, where)
    except ValueError as err:
        raise StreamKError(
            "decision",
            str(err),
            "Record decisions with tvm_streamk.stream_k (or the codes of tvm_streamk.annotations).",
        ) from None


def decode(annotations, where: str) -> Decision:
    """Read a :class:`Decision` from a block's annotations; ``where`` names the block in errors."""
    missing = [k for k in KEYS if k not in annotations]
    if missing:
        raise ValueError(f"block {where!r} carries a partial Stream-K decision: {missing} missing")

    def as_int(key: str) -> int:
        value = annotations[key]
        if not isinstance(value, tirx.IntImm | int):
            raise ValueError(f"annotation {key} of block {where!r} must be an int; found {value!r}")
        return int(value.value if isinstance(value, tirx.IntImm) else value)

    policy_code, fixup_code = as_int(KEY_POLICY), as_int(KEY_FIXUP)
    rule = policies.by_code(policy_code)
    if rule is None:
        raise ValueError(
            f"annotation {KEY_POLICY}={policy_code} of block {where!r} is not one of "
            f"{sorted(policies.codes())}"
        )
    fix = fixups.by_code(fixup_code)
    if fix is None:
        raise ValueError(
            f"annotation {KEY_FIXUP}={fixup_code} of block {where!r} is not one of "
            f"{sorted(fixups.get(n).code for n in fixups.names())}"
        )
    return Decision(
        policy=rule.name,
        variant=rule.variant,
        num_sms=as_int(KEY_NUM_SMS),
        blocks_per_sm=as_int(KEY_BLOCKS_PER_SM),
        splits=as_int(KEY_SPLITS),
        fixup=fix.name,
        group=as_int(KEY_GROUP),
    )

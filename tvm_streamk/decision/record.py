"""How a decision is recorded on a block, so that traces print, serialise and replay.

Python cannot register a trace instruction, so :func:`tvm_streamk.stream_k` records its decision
as stock ``annotate`` instructions on the reduction block. Every value is an ``int32``
``IntImm`` (or an ``ExprRV`` sampled by MetaSchedule), never a string: that keeps the trace
JSON-serialisable and the stock postprocs, which expect TIR values, happy. The lowering reads
them back with :func:`decode`.

A policy is recorded by its registered code (:mod:`tvm_streamk.decomposition.policy`), concrete
policies only: a chooser such as ``"heuristic"`` is resolved before it is recorded, so a replayed
trace never re-runs the model. A fix-up is recorded by its registered code
(:mod:`tvm_streamk.fixup_registry`).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from .. import fixup_registry
from .._compat import SBlock, replace_block, structural_map
from ..decomposition import policy as policies
from ..errors import StreamKError

PREFIX = "tvm_streamk."
KEY_POLICY = PREFIX + "policy"
KEY_NUM_SMS = PREFIX + "num_sms"
KEY_BLOCKS_PER_SM = PREFIX + "blocks_per_sm"
KEY_SPLITS = PREFIX + "splits"
KEY_FIXUP = PREFIX + "fixup"
KEY_GROUP = PREFIX + "group"
KEYS = (KEY_POLICY, KEY_NUM_SMS, KEY_BLOCKS_PER_SM, KEY_SPLITS, KEY_FIXUP, KEY_GROUP)

# num_sms recorded as 0: read the multiprocessor count of the device at run time.
DEVICE_SMS = 0
# num_sms recorded as -1: take the SM count of the target the module is compiled for.
TARGET_SMS = -1
COND_DECISION = "decision"


@dataclass(frozen=True)
class Decision:
    """A concrete decision: what the lowering rewrites a block with.

    Attributes
    ----------
    policy, variant : str, str or None
        A registered concrete policy (never a chooser) and its variant.
    num_sms : int
        The SM count planned for, or :data:`DEVICE_SMS` / :data:`TARGET_SMS`.
    blocks_per_sm : int
        Resident blocks per SM of the persistent grid.
    splits : int
        Split-K's factor (1 for the other policies).
    fixup : str
        A registered fix-up (never ``"auto"``).
    group : int
        Tile rows per group of the swizzled order (0: row-major).
    """

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
            KEY_FIXUP: imm(fixup_registry.get(self.fixup).code),
            KEY_GROUP: imm(self.group),
        }


def has_decision(annotations) -> bool:
    return KEY_POLICY in annotations


def stripped(annotations) -> dict:
    """A block's annotations without its decision."""
    return {k: v for k, v in annotations.items() if not k.startswith(PREFIX)}


def without_decisions(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every decision removed: the data-parallel kernels as scheduled."""

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


def decode(annotations, where: str) -> Decision:
    """The :class:`Decision` a block's annotations record; ``where`` names the block.

    Raises
    ------
    StreamKError
        Condition ``decision``: a partial decision, a value that is not an int, an unknown
        policy or fix-up code.
    """
    missing = [k for k in KEYS if k not in annotations]
    if missing:
        _refuse(f"block {where!r} carries a partial Stream-K decision: {missing} missing")

    def as_int(key: str) -> int:
        value = annotations[key]
        if not isinstance(value, tirx.IntImm | int):
            _refuse(f"annotation {key} of block {where!r} is {value!r}, not an int")
        return int(value.value if isinstance(value, tirx.IntImm) else value)

    policy_code, fixup_code = as_int(KEY_POLICY), as_int(KEY_FIXUP)
    rule = policies.by_code(policy_code)
    if rule is None:
        _refuse(
            f"annotation {KEY_POLICY}={policy_code} of block {where!r}, not one of "
            f"{sorted(policies.codes())}"
        )
    fix = fixup_registry.by_code(fixup_code)
    if fix is None:
        known = sorted(fixup_registry.get(n).code for n in fixup_registry.names())
        _refuse(f"annotation {KEY_FIXUP}={fixup_code} of block {where!r}, not one of {known}")
    return Decision(
        policy=rule.name,
        variant=rule.variant,
        num_sms=as_int(KEY_NUM_SMS),
        blocks_per_sm=as_int(KEY_BLOCKS_PER_SM),
        splits=as_int(KEY_SPLITS),
        fixup=fix.name,
        group=as_int(KEY_GROUP),
    )


def _refuse(found: str):
    raise StreamKError(
        COND_DECISION,
        found,
        "Record decisions with tvm_streamk.stream_k, or with the codes of "
        "tvm_streamk.decision.record (policy and fix-up registries).",
    )

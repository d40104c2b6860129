"""How a decision is recorded on a block, so that traces print, serialise and replay.

Python cannot register a trace instruction, so :func:`tvm_streamk.stream_k` records its decision
as stock ``annotate`` instructions on the reduction block, which traces print, serialise to JSON
and replay. The policy and the fix-up are recorded by name, so a trace reads
``ann_key="tvm_streamk.policy", ann_val="hybrid_one_tile"`` (the policy's
:attr:`~tvm_streamk.decomposition.policy.Policy.key`); the numbers as ``int32`` ``IntImm``
values (plain Python ints make stock postprocs choke). MetaSchedule samples a policy and a
fix-up among their registered codes (an ``ExprRV`` cannot be a string), so :func:`decode` reads
either form.

Concrete policies only: a chooser such as ``"heuristic"`` is resolved before it is recorded, so
a replayed trace never re-runs the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from .. import fixup_registry
from .._compat import SBlock, replace_block, structural_map, structural_walk
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
# Recorded only by a decision that has it: the tile counts a run-time choice takes Stream-K
# for, as the model decided them (``"1-2,5-6"``; ``""`` for none).
KEY_BUCKETS = PREFIX + "buckets"
# Recorded only by a batch-invariant decision: the K-panels of one chunk
# (:mod:`tvm_streamk.decomposition.chunks`).
KEY_CHUNK = PREFIX + "chunk"
# Recorded only by a decision whose kernel declares its grid's resident blocks per SM to ptxas
# (``__launch_bounds__``, :mod:`tvm_streamk.transform.declare_occupancy`).
KEY_DECLARES = PREFIX + "declares_occupancy"
OPTIONAL_KEYS = (KEY_BUCKETS, KEY_CHUNK, KEY_DECLARES)
# Not a decision: the mark :class:`tvm_streamk.meta_schedule.StreamKRule` leaves in a
# batch-invariant space on a multiply-accumulate block it could give no batch-invariant
# decision. The block as tiled reduces K in an order of its own, and the postproc
# :class:`tvm_streamk.postproc.RechunkStreamK` rejects the candidate.
KEY_NOT_INVARIANT = PREFIX + "not_invariant"

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
    buckets : tuple of (int, int), or None
        A run-time choice's Stream-K tile counts as decided
        (:attr:`~tvm_streamk.decomposition.Plan.buckets`); None for the other policies.
    chunk : int
        Batch invariance: the K-panels of one chunk, the unit the plan's iterations count
        (:mod:`tvm_streamk.decomposition.chunks`); 0 when the kernel is not batch-invariant.
    declares_occupancy : bool
        Whether the CUDA kernel declares ``blocks_per_sm`` in its ``__launch_bounds__``, so
        that ptxas holds its registers to the grid's count (chosen where the kernel so built
        neither spills nor loses a block: :func:`tvm_streamk.schedule.stream_k`).
    """

    policy: str
    variant: str | None
    num_sms: int
    blocks_per_sm: int
    splits: int
    fixup: str
    group: int
    buckets: tuple | None = None
    chunk: int = 0
    declares_occupancy: bool = False

    @property
    def batch_invariant(self) -> bool:
        return self.chunk > 0

    def as_annotations(self) -> dict[str, tirx.IntImm]:
        def imm(v: int) -> tirx.IntImm:
            return tirx.IntImm("int32", int(v))

        out = {
            KEY_POLICY: policies.get(self.policy, self.variant).key,
            KEY_NUM_SMS: imm(self.num_sms),
            KEY_BLOCKS_PER_SM: imm(self.blocks_per_sm),
            KEY_SPLITS: imm(self.splits),
            KEY_FIXUP: fixup_registry.get(self.fixup).name,
            KEY_GROUP: imm(self.group),
        }
        if self.buckets is not None:
            out[KEY_BUCKETS] = ",".join(f"{lo}-{hi}" for lo, hi in self.buckets)
        if self.chunk:
            out[KEY_CHUNK] = imm(self.chunk)
        if self.declares_occupancy:
            out[KEY_DECLARES] = imm(1)
        return out


def has_decision(annotations) -> bool:
    return KEY_POLICY in annotations


def decided_blocks(mod: tvm.IRModule) -> list[tuple[str, tirx.PrimFunc, SBlock]]:
    """``(function name, function, block)`` for every block of ``mod`` that carries a decision,
    in program order."""
    found = []
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue

        def visit(block: SBlock, name=gv.name_hint, func=func) -> None:
            if has_decision(block.annotations):
                found.append((name, func, block))

        structural_walk(func.body, (SBlock, visit), order="pre")
    return found


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

    def named(key: str, by_name, by_code, known: list[str]):
        value = annotations[key]
        if isinstance(value, str):
            name = str(value)
            found = by_name(name)
        else:
            name = as_int(key)
            found = by_code(name)
        if found is None:
            _refuse(f"annotation {key}={name!r} of block {where!r}, not one of {known}")
        return found

    rule = named(KEY_POLICY, _policy_by_key, policies.by_code, [p.key for p in policies.concrete()])
    fix = named(
        KEY_FIXUP,
        lambda n: fixup_registry.get(n) if n in fixup_registry.names() else None,
        fixup_registry.by_code,
        list(fixup_registry.names()),
    )
    return Decision(
        policy=rule.name,
        variant=rule.variant,
        num_sms=as_int(KEY_NUM_SMS),
        blocks_per_sm=as_int(KEY_BLOCKS_PER_SM),
        splits=as_int(KEY_SPLITS),
        fixup=fix.name,
        group=as_int(KEY_GROUP),
        buckets=_buckets(annotations.get(KEY_BUCKETS), where),
        chunk=as_int(KEY_CHUNK) if KEY_CHUNK in annotations else 0,
        declares_occupancy=KEY_DECLARES in annotations and as_int(KEY_DECLARES) != 0,
    )


def _buckets(value, where: str) -> tuple | None:
    """The ranges of a :data:`KEY_BUCKETS` annotation (None when absent)."""
    if value is None:
        return None
    text = str(value)
    try:
        pairs = [tuple(int(x) for x in part.split("-")) for part in text.split(",") if part]
    except ValueError:
        pairs = [()]
    if any(len(p) != 2 or p[0] > p[1] for p in pairs):
        _refuse(f"annotation {KEY_BUCKETS}={text!r} of block {where!r}, not ranges 'lo-hi,lo-hi'")
    return tuple(pairs)


def _policy_by_key(key: str):
    try:
        return policies.by_key(key)
    except ValueError:
        return None


def _refuse(found: str):
    raise StreamKError(
        COND_DECISION,
        found,
        "Record decisions with tvm_streamk.stream_k, or with the names (or codes) of the "
        "registered policies and fix-ups.",
    )

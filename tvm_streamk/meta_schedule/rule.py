"""``StreamKRule``: add a Stream-K twin of every tiled reduction candidate to the design space."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.ir.utils import derived_object

from .. import gpus
from .._compat import Schedule, meta_schedule
from ..analysis import (
    StreamKSite,
    blockized_parent,
    find_block_path,
    function_of,
    is_reduction,
    sblock_rv,
)
from ..analysis.flops import multiply_accumulates
from ..decision import counts_chunks, record, rules
from ..decomposition import chunks
from ..decomposition.policy import by_key
from ..errors import StreamKError
from .annotate import (
    annotate_stream_k,
    applicable_fixups,
    fixup_code,
    policy_code,
    site_of,
)


@dataclass(frozen=True)
class StreamKKnobs:
    """The values each Stream-K knob is sampled from.

    Attributes
    ----------
    policies : tuple of str
        Policy keys (:func:`tvm_streamk.meta_schedule.annotate.policy_code`). ``data_parallel`` is
        left out by default: the rule keeps the unannotated candidate, which is data-parallel.
    blocks_per_sm : tuple of int
        Resident blocks per SM the persistent grid is sized for.
    splits : tuple of int
        Split counts for ``split_k``; those above the panel count of a tiling are dropped.
    groups : tuple of int
        Tile-row groups of the tile visiting order; 0 is row-major.
    fixups : tuple of str, optional
        Fix-ups to choose from; by default every one of
        registered fix-up (:mod:`tvm_streamk.transform.fixup`) the kernel can use.
    batch_invariant : bool
        Every candidate batch-invariant (docs/batch_invariance.md): the rule then replaces each
        tiled reduction by its batch-invariant twin instead of adding one (the kernel as tiled
        is not invariant), ``data_parallel`` joins the sampled policies, splits are counted in
        chunks and only the fix-ups that merge chunks in chunk order are sampled.
    """

    policies: tuple[str, ...] = ("stream_k", "hybrid_two_tile", "hybrid_one_tile", "split_k")
    blocks_per_sm: tuple[int, ...] = (1, 2)
    splits: tuple[int, ...] = (2, 3, 4, 8)
    groups: tuple[int, ...] = (0,)
    fixups: tuple[str, ...] | None = None
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        for name in ("policies", "blocks_per_sm", "splits", "groups"):
            if not getattr(self, name):
                raise ValueError(f"StreamKKnobs.{name} must not be empty")
        for name in self.policies:
            policy_code(name)
        for name in self.fixups or ():
            fixup_code(name)
        for name, lowest in (("blocks_per_sm", 1), ("splits", 2), ("groups", 0)):
            bad = [v for v in getattr(self, name) if not isinstance(v, int) or v < lowest]
            if bad:
                raise ValueError(f"StreamKKnobs.{name} must hold ints >= {lowest}; found {bad}")


def _blockized_parent(sch: Schedule, block):
    """The blockized reduction ``block`` is the inner block of, or None."""
    inner = sch.get(sblock_rv(sch, block))
    return blockized_parent(find_block_path(function_of(sch.mod, inner), inner.name_hint))


def _tiled_reduction(sch: Schedule, block) -> tuple[str | None, StreamKSite] | None:
    """The Stream-K site of ``block``, or of the blockized reduction it is the inner block of
    (with that block's name): the tensor-core tiling rules blockize the update and keep the
    rule's random variable on the inner block. None when neither qualifies."""
    try:
        return None, site_of(sch, block)
    except StreamKError:
        pass
    parent = _blockized_parent(sch, block)
    if parent is None:
        return None
    try:
        return parent.name_hint, site_of(sch, parent.name_hint)
    except StreamKError:
        return None


def _uniform(n: int) -> list[float]:
    return [1.0 / n] * n


@derived_object
class StreamKRule(meta_schedule.schedule_rule.PyScheduleRule):
    """Keep each tiled reduction candidate and add its Stream-K twin with sampled knobs.

    Meant to run right after ``MultiLevelTiling``: for the GPU that rule fuses the outer tile
    loops into one ``blockIdx.x`` loop, splits the reduction into a serial panel loop inside it,
    accumulates in a ``local`` cache and writes it back under the thread loops, which is exactly
    the kernel :func:`tvm_streamk.analysis.analyze` accepts. For a block that qualifies the rule
    returns the candidate unchanged (data-parallel) and a copy annotated by
    :func:`~tvm_streamk.meta_schedule.annotate.annotate_stream_k`, each knob drawn by
    ``sample_categorical`` so the trace records it and :class:`MutateStreamK` can change it. Any
    other block is returned unchanged. In the ``cuda-tensorcore`` space the rule runs after
    ``MultiLevelTilingTensorCore``, which blockizes the update, marks it for tensorization and
    leaves the rule's block variable on the inner block: the twin's decision goes on the
    blockized update, and only aligned splits of its fragment accumulator are sampled.
    The reduction keeps its ``T.init`` here; the postprocs
    ``RewriteReductionBlock``, :class:`~tvm_streamk.postproc.RewriteStreamKInit` and
    :class:`~tvm_streamk.postproc.VerifyStreamK` finish the candidate.

    Parameters
    ----------
    num_sms : int, optional
        SMs (compute units) of the device. By default looked up from the tuning target's tag or
        arch (:func:`tvm_streamk.gpus.resolve_num_sms`); required for other targets.
    knobs : StreamKKnobs, optional
        What the knobs are sampled from.

    Examples
    --------
    >>> rules = ms.ScheduleRule.create("cuda")
    >>> rules.insert(2, StreamKRule(num_sms=132))  # right after MultiLevelTiling
    """

    def __init__(self, num_sms: int | None = None, knobs: StreamKKnobs | None = None) -> None:
        super().__init__()
        self.num_sms = num_sms
        self.knobs = knobs or StreamKKnobs()
        self.target: tvm.target.Target | None = None
        self._resolved_sms: int | None = num_sms

    def _initialize_with_tune_context(self, context) -> None:
        self.target = context.target
        self._resolved_sms = gpus.num_sms_for_target(self.num_sms, self.target)

    def apply(self, sch: Schedule, block) -> list[Schedule]:
        if self._resolved_sms is None:
            raise StreamKError(
                "num-sms",
                "a StreamKRule used outside a tune context without num_sms",
                "Pass StreamKRule(num_sms=...) or use it through a TuneContext.",
            )
        found = _tiled_reduction(sch, block)
        if found is None:
            return [self._without_twin(sch, block)]
        block_name, site = found
        if record.has_decision(site.block.annotations):
            return [sch]
        fixups = applicable_fixups(site, self.target)
        if self.knobs.fixups is not None:
            fixups = tuple(f for f in fixups if f in self.knobs.fixups)
        chunk, planned = 0, site
        candidates = list(self.knobs.policies)
        if self.knobs.batch_invariant:
            chunk = chunks.chunk_panels(site.kernel_panels)
            fixups = tuple(f for f in fixups if f in rules.invariant_fixups())
            candidates = [rules.original_policy(), *candidates]
            if counts_chunks(site, chunk):
                planned = site.chunked(chunk)
        splits = [s for s in self.knobs.splits if s <= planned.panels]
        takes_splits = {p: by_key(p).takes_splits for p in candidates}
        policies = [p for p in candidates if not takes_splits[p] or splits]
        if site.fragment_accumulator:
            # Tensor-core fragments have no addressable elements: only splits of whole,
            # equal panel ranges can be merged (tvm_streamk.decision.rules.check_fragment_plan).
            splits = [s for s in splits if site.panels % s == 0]
            if chunk:
                # Batch-invariant: one block per chunk, the only order-keeping split.
                try:
                    count = rules.fragment_chunks(site, chunk)
                except StreamKError:
                    return [self._without_twin(sch, block_name or block)]
                splits = [count] if count > 1 else []
            policies = [p for p in policies if takes_splits[p]] if splits else []
        if not fixups or not policies:
            return [self._without_twin(sch, block_name or block)]

        # A band fused into one blockIdx loop (MultiLevelTiling's) has no tile rows to group.
        groups = list(self.knobs.groups) if len(site.band) > 1 else [0]
        twin = sch.copy()
        twin.seed(sch.fork_seed())
        if block_name is not None:
            block = twin.get_sblock(block_name)
        values = {
            "policy": [policy_code(p) for p in policies],
            "blocks_per_sm": list(self.knobs.blocks_per_sm),
            "splits": splits or [1],
            "fixup": [fixup_code(f) for f in fixups],
            "group": groups,
        }
        sampled = {
            name: twin.sample_categorical(candidates=choices, probs=_uniform(len(choices)))
            for name, choices in values.items()
        }
        # The copy shares the block's random variable (or names the blockized parent); every
        # value sampled above is valid for this tiling, so annotating cannot fail.
        annotate_stream_k(
            twin, block, num_sms=self._resolved_sms, target=self.target, chunk=chunk, **sampled
        )
        # A batch-invariant space holds only invariant kernels: the twin replaces the tiling.
        return [twin] if chunk else [sch, twin]

    def _without_twin(self, sch: Schedule, block) -> Schedule:
        """``sch`` unchanged; in a batch-invariant space its multiply-accumulate ``block``
        (an ``SBlockRV`` or a name) marked as left without an invariant decision, which
        :class:`~tvm_streamk.postproc.RechunkStreamK` rejects: the space must not hold a
        kernel that reduces K in an order of its own."""
        if not self.knobs.batch_invariant:
            return sch
        block_rv = sblock_rv(sch, block)
        found = sch.get(block_rv)
        # Tensorization replaces the inner block of a blockized update: mark the update.
        parent = _blockized_parent(sch, block_rv)
        if parent is not None:
            block_rv, found = sch.get_sblock(parent.name_hint), parent
        if is_reduction(found) and multiply_accumulates(found):
            sch.annotate(block_rv, record.KEY_NOT_INVARIANT, tvm.tirx.IntImm("int32", 1))
        return sch

    def clone(self) -> StreamKRule:
        rule = StreamKRule(num_sms=self.num_sms, knobs=self.knobs)
        rule.target = self.target
        rule._resolved_sms = self._resolved_sms
        return rule

"""The preconditions of a decision, each stated once.

Preconditions of the block alone (its loops, accumulator, write-back) are found by
:mod:`tvm_streamk.analysis`; the ones here combine the analysed site with a decision. They take
a policy by name, concrete or a chooser (``"heuristic"``), and ask the policy registry what the
policy can do: nothing here switches on a policy's name. :func:`tvm_streamk.decision.check`
calls them in order; the primitive also asks the ones that bound what a chooser may choose
before it chooses.
"""

from __future__ import annotations

from .. import fixup_registry
from ..analysis.ragged import COND_RAGGED
from ..decomposition import chunks
from ..decomposition import policy as policies
from ..errors import StreamKError
from ..memory_model import for_target
from .record import COND_DECISION, DEVICE_SMS, TARGET_SMS, Decision

# Condition names of the rules below, as StreamKError.condition reports them.
COND_RUNTIME_GRID = "num-sms"
COND_INDEX_WIDTH = "index-width"
COND_GROUP = "group"
COND_FRAGMENT_SPLIT = "fragment-aligned-split"
COND_PANEL_CHAIN = "panel-loop"
COND_RUNTIME_TILES = "runtime-tiles"
COND_BATCH_INVARIANT = "batch-invariant"


def _where(site) -> str:
    return f"block {site.block.name_hint!r}"


def walks_run_time_tiles(policy: str, on_device: bool = False) -> bool:
    """Whether ``policy`` can walk a tile count known only at run time: its closed forms take
    one the host knows (``Policy.runtime_tiles``; with ``on_device``, one only the device
    knows, ``Policy.runtime_grid``), or it is the kernel as written; a chooser picks among
    those."""
    if policies.chooser(policy) is not None:
        return True
    rule = policies.get(policy)
    return (rule.runtime_grid if on_device else rule.runtime_tiles) or rule.is_original


def original_policy() -> str:
    """The policy that is the kernel as written (data-parallel)."""
    return next(p.name for p in policies.concrete() if p.is_original)


def aligned_policy() -> str:
    """The policy that cuts every tile into equal panel ranges (split-K): what a tensor-core
    fragment takes."""
    return next(p.name for p in policies.concrete() if p.takes_splits)


def run_time_walker() -> str:
    """The policy whose closed forms take a grid and a tile count known at run time
    (Stream-K): what a grouped GEMM's tiles are walked by."""
    return next(p.name for p in policies.concrete() if p.runtime_grid)


def _run_time_capable(on_device: bool = False) -> str:
    """``policy='data_parallel' or 'stream_k' or 'heuristic'``: what takes a run-time tile
    count (:func:`walks_run_time_tiles`)."""
    names = [p.name for p in policies.concrete() if walks_run_time_tiles(p.name, on_device)]
    names = [*dict.fromkeys(names), *policies.choosers()]
    return "policy=" + " or ".join(map(repr, names))


def _capability(target, name: str, default):
    """The memory model's ``name`` for ``target`` (:mod:`tvm_streamk.memory_model`);
    ``default`` before a target is known, or for a kind without a model."""
    if target is None:
        return default
    try:
        return getattr(for_target(target), name)
    except StreamKError:
        return default


def takes_aligned_nest(plan, chunked: bool, target) -> bool:
    """Whether ``plan`` is lowered as the aligned nest: an aligned split (blocks
    ``tile * S + s``, the band's loops kept in their row-major order) of a plan that does not
    count chunks, on a target whose grid has ``blockIdx.z`` (``MemoryModel.grid_z``)."""
    if plan.aligned_splits is None or chunked:
        return False
    return target is None or for_target(target).grid_z


def walks_reserved_grid_z(site, target) -> bool:
    """Whether the kernel as written binds ``blockIdx.z`` (a batch, a group, even one wide) on
    a target whose runtime reserves it (``MemoryModel.grid_z``): a data-parallel decision is
    then lowered as a persistent walk of one block per tile, which binds ``blockIdx.x`` only,
    where the kernel as written would not build."""
    if target is None or for_target(target).grid_z:
        return False
    return "blockIdx.z" in site.band_tags


def check_recorded(decision: Decision, site) -> None:
    """Refuse recorded numbers outside their domain (a decision written by hand, or sampled)."""
    if (
        decision.num_sms < TARGET_SMS
        or decision.group < 0
        or decision.blocks_per_sm < 1
        or decision.splits < 1
        or decision.chunk < 0
    ):
        raise StreamKError(
            COND_DECISION,
            f"num_sms={decision.num_sms}, blocks_per_sm={decision.blocks_per_sm}, "
            f"splits={decision.splits}, group={decision.group}, chunk={decision.chunk} on "
            f"{_where(site)}",
            f"Record a positive SM count (or {DEVICE_SMS} for the device's, {TARGET_SMS} for "
            "the compile target's), blocks_per_sm and splits >= 1, and a group and a chunk "
            ">= 0.",
        )


def check_one_panel_loop(site) -> None:
    """Refuse a reduction whose K-panels are several nested loops (``rh, rw, rc_0``).

    Splitting the outermost alone would give Stream-K ``rh`` panels; the loops must be fused
    into one panel loop first, which :func:`tvm_streamk.stream_k` does (a ``fuse`` in the
    trace).
    """
    if len(site.panel_chain) <= 1:
        return
    names = [loop.loop_var.name for loop in site.panel_chain]
    raise StreamKError(
        COND_PANEL_CHAIN,
        f"the reduction of {_where(site)} runs over the nested loops {names}, "
        f"{' x '.join(str(int(loop.extent)) for loop in site.panel_chain)} panels",
        f"Fuse them into one K-panel loop first (sch.fuse over {names}); "
        "tvm_streamk.stream_k does so itself.",
    )


def check_fixup(site, fixup: str, target) -> None:
    """Refuse a fix-up the site (or the target, None before one is known) cannot use: the
    fix-up's own check (:mod:`tvm_streamk.fixup_registry`)."""
    fixup_registry.get(fixup).check(site, target)


def check_group(group: int | None, site) -> None:
    """Refuse a tile-row group (``group=g``) on a band of fewer than two dimensions.

    The grouped order walks ``g`` tile rows column-major, which needs a row and a column axis;
    MetaSchedule's MultiLevelTiling fuses its tiles into one ``blockIdx`` loop.
    """
    if group and len(site.band_extents) < 2:
        raise StreamKError(
            COND_GROUP,
            f"group={group} for the one-dimensional tile band {tuple(site.band_extents)} of "
            f"{_where(site)}",
            "Drop group (the fused band has no tile rows to group), or keep the tile loops "
            "unfused (one blockIdx loop per axis).",
        )


def check_ragged(site, policy: str, target=None) -> None:
    """Refuse a decision a grouped GEMM cannot take.

    Its tile count is read on the device (:mod:`tvm_streamk.analysis.ragged`), in 64 bits,
    so no target of narrower integers (WebGPU) takes any policy, and only a policy that
    walks a run-time tile count can take it (:func:`walks_run_time_tiles`); a tensor-core
    fragment only the kernel as written.
    """
    if site.ragged is None:
        return
    bits = _capability(target, "index_bits", 64)
    if bits < 64:
        # Found by a WebGPU campaign of the workload fuzz: data-parallel was refused for want
        # of a fix-up, with the advice to use data-parallel, then did not build.
        raise StreamKError(
            COND_INDEX_WIDTH,
            f"the {site.ragged.kind} of {_where(site)}, whose tile count its kernels read on "
            f"the device in 64-bit integers (data-parallel's too), past the {bits}-bit "
            f"integers of a {target.kind.name} kernel",
            "Build a GEMM per group of a fixed row count, or run it on another target.",
        )
    if not walks_run_time_tiles(policy, on_device=True):
        raise StreamKError(
            COND_RAGGED,
            f"policy={policy!r} for the {site.ragged.kind} of {_where(site)}, whose tile count "
            "only the device knows",
            f"Pass {_run_time_capable(on_device=True)}.",
        )
    original = policies.chooser(policy) is None and policies.get(policy).is_original
    if site.fragment_accumulator and not original:
        raise StreamKError(
            COND_RAGGED,
            f"a tensor-core fragment accumulator in the {site.ragged.kind} of {_where(site)}",
            "Fragments take only aligned splits fixed at compile time: use policy="
            "'data_parallel', or accumulate in registers.",
        )
    if site.ragged.reduction and not original and site.init_block is None:
        raise StreamKError(
            COND_RAGGED,
            f"the grouped weight gradient of {_where(site)} initialises its accumulator inside "
            "the update block (T.init)",
            "The tiles of an empty group are written from the initial zero alone: "
            "decompose_reduction at the panel loop (tvm_streamk.workloads.reference_schedule "
            "does), or use policy='data_parallel'.",
        )


def check_runtime_tiles(site, policy: str, group: int | None) -> None:
    """Refuse a decision a tile count known only at run time (a dynamic M) cannot take.

    The grid is then computed at run time and the kernel evaluates the closed forms on the
    run-time count: only a policy that walks a run-time tile count can
    (:func:`walks_run_time_tiles`); a chooser records one of those chosen per count when the
    kernel runs (:mod:`tvm_streamk.run_time_choice`). Tensor-core fragments take only aligned
    splits: asked for by name (or by batch invariance, one block per chunk), the aligned
    split-K, whose tiles x S grid keeps the band's loops; a chooser keeps them data-parallel.
    The grouped tile order divides by the band's extents.
    """
    if not site.runtime_tiles:
        return
    found = f"the run-time tile count {site.tile_count} of {_where(site)}"
    if not walks_run_time_tiles(policy):
        raise StreamKError(
            COND_RUNTIME_TILES,
            f"policy={policy!r} for {found}",
            f"Pass {_run_time_capable()}, or specialise the shape (one kernel per M) for the "
            "other policies.",
        )
    chooser = policies.chooser(policy) is not None
    if not chooser and policies.get(policy).is_original:
        return
    # A chooser keeps a fragment kernel data-parallel; the aligned split keeps its grid of
    # tiles x S blocks at any count.
    if site.fragment_accumulator and not chooser and not policies.get(policy).takes_splits:
        raise StreamKError(
            COND_RUNTIME_TILES,
            f"a tensor-core fragment accumulator with policy={policy!r} and {found}",
            f"Fragments take only aligned splits: use policy={aligned_policy()!r} with splits "
            "dividing the K-panels, or policy='data_parallel', or specialise the shape.",
        )
    if group:
        raise StreamKError(
            COND_RUNTIME_TILES,
            f"group={group} with {found}",
            "Drop group: the grouped order needs compile-time tile extents.",
        )


def check_runtime_grid(policy: str, site, target=None) -> None:
    """Refuse a grid read from the device at run time (``num_sms="device"``) where it cannot
    work.

    Only a policy whose closed forms take a grid variable can; the others fix their grid from
    the SM count at compile time, and a chooser needs the count to choose. Tensor-core
    fragments take only the aligned split-K, whose grid is the tile count times the split.
    Only a target whose devices report their multiprocessor count
    (:attr:`~tvm_streamk.memory_model.MemoryModel.device_sms`; not WebGPU). Every fix-up works:
    the workspace is sized for the largest grid the run time launches
    (:meth:`~tvm_streamk.decomposition.Plan.runtime_grid_bound`).
    """
    if not _capability(target, "device_sms", True):
        raise StreamKError(
            COND_RUNTIME_GRID,
            f"num_sms='device' for a {target.kind.name} kernel ({_where(site)})",
            f"{target.kind.name} devices report no multiprocessor count to read at run time: "
            "pass num_sms (for lavapipe, tvm_streamk.webgpu.compute_units()).",
        )
    if site.fragment_accumulator:
        raise StreamKError(
            COND_RUNTIME_GRID,
            f"num_sms='device' for the tensor-core fragment accumulator of {_where(site)}",
            "The aligned split of fragments fixes its grid at compile time; pass num_sms.",
        )
    capable = list(dict.fromkeys(p.name for p in policies.concrete() if p.runtime_grid))
    chooser = policies.chooser(policy) is not None
    if chooser or not policies.get(policy).runtime_grid:
        raise StreamKError(
            COND_RUNTIME_GRID,
            f"num_sms='device' with policy={policy!r} on {_where(site)}",
            f"Only policy {' or '.join(map(repr, capable))} derives its work split from the "
            "run-time grid; pass num_sms for the other policies.",
        )


def check_fragment_plan(plan, site) -> None:
    """Refuse a plan a tensor-core fragment accumulator cannot take.

    Fragments have no addressable elements and the software pipeline over K panels needs a
    constant trip count, so a fragment tile is only ever computed whole (a policy that is the
    kernel as written) or cut into ``S`` equal panel ranges with ``S`` dividing the panel count
    (:meth:`~tvm_streamk.decomposition.policy.Policy.aligned_splits`).
    """
    if not site.fragment_accumulator or plan.scheme.is_original or plan.aligned_splits is not None:
        return
    divisors = [d for d in range(2, plan.panels + 1) if plan.panels % d == 0]
    raise StreamKError(
        COND_FRAGMENT_SPLIT,
        f"a {plan.label} decomposition of {plan.panels} panels for the tensor-core fragment "
        f"accumulator of {_where(site)}",
        f"Fragments take only aligned splits: split_k with a split that divides the panel "
        f"count, one of {divisors}, or data_parallel (policy 'stream_k' or 'heuristic' picks "
        "one for you in tvm_streamk.stream_k).",
    )


def invariant_fixups() -> list[str]:
    """The fix-ups that merge a batch-invariant kernel's chunks in chunk order."""
    return [n for n in fixup_registry.names() if fixup_registry.get(n).orders_chunks]


def check_invariant_ragged(site) -> None:
    """Refuse batch invariance for a ragged reduction (a grouped weight gradient), with the
    reason. A grouped GEMM's K is the same for every tile, and its chunks are the plain GEMM's:
    a token's output then has the same bits whatever the other groups hold."""
    if site.ragged is None or not site.ragged.reduction:
        return
    raise StreamKError(
        COND_BATCH_INVARIANT,
        f"batch_invariant=True for the {site.ragged.kind} of {_where(site)}",
        "Not built for a ragged K: a group's chunk grid would follow its own token count, "
        "which only the device knows. Drop batch_invariant; policy='data_parallel' sums every "
        "tile in token order in one block, the same bits whatever the other groups hold.",
    )


def check_batch_invariant_fixup(fixup: str) -> None:
    """Refuse a fix-up that cannot keep the canonical order of a batch-invariant kernel (what
    the primitive checks before it looks at the schedule, and :func:`check_batch_invariant`
    after)."""
    if fixup_registry.get(fixup).orders_chunks:
        return
    raise StreamKError(
        COND_BATCH_INVARIANT,
        f"fixup={fixup!r} with batch_invariant=True",
        f"The {fixup} fix-up merges partial sums in the order blocks arrive, which changes from "
        f"run to run and with the grid; use fixup={invariant_fixups()[0]!r} (or 'auto'), which "
        "sums each tile's chunks in chunk order.",
    )


def fragment_chunks(site, chunk: int) -> int:
    """The aligned split a tensor-core fragment's batch-invariant kernel takes: one block per
    chunk (``S = n``), which needs chunks of equal panels."""
    panels = site.kernel_panels
    count = chunks.chunk_count(panels, chunk)
    if count * chunk != panels:
        raise StreamKError(
            COND_BATCH_INVARIANT,
            f"batch_invariant=True for the tensor-core fragment accumulator of {_where(site)}: "
            f"{panels} K-panels cut into chunks of {chunk} leave a shorter last chunk",
            "Fragments are split only into equal panel ranges: choose a panel depth that makes "
            f"the panel count a multiple of {chunks.CHUNKS} (or below it), or accumulate in "
            "registers.",
        )
    return count


def check_batch_invariant(site, decision: Decision) -> None:
    """Refuse a batch-invariant decision (``chunk > 0``) the site cannot keep to the canonical
    order (:mod:`tvm_streamk.decomposition.chunks`): a chunk longer than the tile's panels, a
    grouped GEMM, a fix-up that merges in arrival order, a tensor-core fragment not split one
    block per chunk."""
    if not decision.chunk:
        return
    panels = site.kernel_panels
    if decision.chunk > panels:
        raise StreamKError(
            COND_BATCH_INVARIANT,
            f"chunk={decision.chunk} K-panels for the {panels} panels of {_where(site)}",
            f"Record a chunk of at most {panels} panels (tvm_streamk.stream_k records "
            f"{chunks.chunk_panels(panels)}).",
        )
    check_invariant_ragged(site)
    check_batch_invariant_fixup(decision.fixup)
    if not site.fragment_accumulator:
        return
    count = fragment_chunks(site, decision.chunk)
    rule = policies.get(decision.policy, decision.variant)
    one_per_chunk = rule.takes_splits and decision.splits == count
    if count == 1 and rule.is_original or count > 1 and one_per_chunk:
        return
    raise StreamKError(
        COND_BATCH_INVARIANT,
        f"policy={decision.policy!r} (splits={decision.splits}) for the batch-invariant "
        f"tensor-core fragment accumulator of {_where(site)}, whose K is {count} chunks",
        f"Fragments keep the canonical order only split one block per chunk: "
        f"policy={aligned_policy()!r} with splits={count}"
        + (f" or {original_policy()!r}" if count == 1 else "")
        + " (tvm_streamk.stream_k picks it for policy 'heuristic', 'stream_k' or "
        "'data_parallel').",
    )


def check_index_width(plan, site, target) -> None:
    """Refuse a plan whose closed forms need wider integers than the target's kernels have
    (WebGPU: 32 bits, :attr:`tvm_streamk.memory_model.MemoryModel.index_bits`). ``site`` is
    the site as the decision plans it (:func:`~.resolve.planned_site`). A data-parallel plan
    is the kernel as written, which computes none, unless its own closed forms walk it: a
    batch-invariant one of several chunks (``site.chunk``: ``plan`` counts chunks), or one
    whose kernel as written binds the ``blockIdx.z`` the target reserves
    (:func:`walks_reserved_grid_z`)."""
    bits = _capability(target, "index_bits", 64)
    if bits >= 64:
        return
    advice = "Use fewer blocks (num_sms, blocks_per_sm), larger tiles, or policy='data_parallel'."
    if plan.scheme.is_original and not (site.chunk and plan.panels > 1):
        if not walks_reserved_grid_z(site, target) or site.runtime_tiles:
            return
        advice = (
            "Use larger tiles, or a schedule that does not bind blockIdx.z (the kernel as "
            "written binds it, so it is walked one block per tile)."
        )
    if site.runtime_tiles:
        # No compile-time bound: the closed forms are 64-bit (transform._ir.index_dtype).
        raise StreamKError(
            COND_INDEX_WIDTH,
            f"a {plan.label} plan of a tile count known only at run time for {_where(site)}, "
            f"whose closed forms take 64-bit integers, past the {bits}-bit integers of a "
            f"{target.kind.name} kernel",
            "Specialise the shape (one kernel per size, or per bucket of sizes), or use "
            "policy='data_parallel'.",
        )
    need = plan.largest_intermediate()
    if need >= 2 ** (bits - 1):
        raise StreamKError(
            COND_INDEX_WIDTH,
            f"a {plan.label} plan of {plan.tiles} tiles x {plan.panels} panels on grid "
            f"{plan.grid} for {_where(site)}, whose closed forms reach {need:,}, past the "
            f"{bits}-bit integers of a {target.kind.name} kernel",
            advice,
        )

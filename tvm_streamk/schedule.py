"""The ``stream_k`` schedule primitive: validate a tiled reduction, record a Stream-K decision."""

from __future__ import annotations

import tvm

from . import annotations as ann
from . import cost_model, decomposition, gpus, occupancy, ptxas, resources
from ._compat import Schedule, target_arch
from .analysis import StreamKSite, analyze_block, sblock_rv
from .decomposition import policy as policies
from .errors import StreamKError
from .legality import (
    check_fragment_plan,
    check_group,
    check_one_panel_loop,
    check_ragged,
    check_runtime_grid,
    check_runtime_tiles,
)
from .run_time_choice import StreamKOrDataParallel, describe, stream_k_buckets
from .transform import fixup as fixups
from .transform.fixup_atomic import atomic_dtype_error
from .transform.lower_stream_k import check_fixup

# Accumulator dtypes whose atomic merge is exact (int) or as accurate as the serial sum (fp32/64).
EXACT_ENOUGH_FOR_ATOMICS = ("float32", "float64", "int32")


def _resolve_target(target) -> tvm.target.Target | None:
    if target is None:
        return tvm.target.Target.current(allow_none=True)
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


def _resolve_num_sms(num_sms, target: tvm.target.Target | None, deferrable: bool) -> int | None:
    """The SM count to plan for now, or None to leave it to the compile target.

    With no count and no target in tables, a decision whose policy does not need the count to
    choose is recorded for the target it will be compiled for (:data:`annotations.TARGET_SMS`):
    a CUDA tag of the table, or the OpenCL device's compute units.
    """
    try:
        return gpus.num_sms_for_target(num_sms, target)
    except ValueError as err:
        unknown_cuda = target is not None and target.kind.name != "opencl"
        if num_sms is None and deferrable and not unknown_cuda:
            return None
        raise StreamKError("num-sms", str(err), "Pass num_sms=<the GPU's SM count>.") from None


def stream_k(
    sch: Schedule,
    block,
    *,
    num_sms: int | str | None = None,
    blocks_per_sm: int | None = None,
    fixup: str = "auto",
    deterministic: bool = False,
    policy: str = "stream_k",
    splits: int | None = None,
    variant: str | None = None,
    group: int | None = None,
    target=None,
) -> decomposition.Plan:
    """Turn the tiled GPU reduction around ``block`` into a persistent Stream-K kernel.

    The kernel must own one output tile per GPU block: ``block`` sits under a band of
    ``blockIdx``-bound loops (the outermost loops), reduces with an associative Add over a serial
    K-panel loop inside that band into an accumulator in registers (``local``), and a write-back
    block after the panel loop stores the accumulator to a global buffer. The primitive checks all
    of that, chooses the decomposition and records it as annotations on ``block``; the
    ``tvm_streamk`` TIR pipeline (:class:`tvm_streamk.transform.LowerStreamK`) performs the
    rewrite. If ``block`` still has a ``T.init``, the reduction is first decomposed at the panel
    loop (a ``decompose_reduction`` instruction in the trace). Calling it again on the same block
    replaces the decision. Build with ``tir_pipeline="tvm_streamk"``: after ``import tvm_streamk``
    TVM's own pipelines refuse a module that still carries a decision.

    Parameters
    ----------
    sch : tvm.s_tir.Schedule
        The schedule.
    block : SBlockRV or str
        The reduction (update) block.
    num_sms : int or "device", optional
        Streaming multiprocessors of the GPU. Defaults to the table of known GPUs for the target
        (``target`` or the current target scope); an unknown GPU needs it explicitly.
        ``"device"`` (``policy="stream_k"``, either fix-up) reads the count from the device at
        run time: the host sizes the grid (at most ``decomposition.MAX_RUNTIME_SMS`` SMs' worth)
        and the kernel takes its work split from the launched grid, so one build fits any GPU.
        With neither a count nor a target the table knows (no target at all, or an OpenCL
        target), a concrete policy's decision is left to the target the module is compiled for:
        ``tvm.compile(mod, target="nvidia/nvidia-h100", tir_pipeline="tvm_streamk")`` plans for
        its 132 SMs, an OpenCL build for the PoCL device's compute units. ``"heuristic"`` and
        tensor-core fragments need the count now. In both cases the returned plan is the one
        for a single SM.
    blocks_per_sm : int, optional
        Resident blocks per SM; the persistent grid is ``blocks_per_sm * num_sms``. By default
        the kernel's own occupancy on a CUDA target whose arch :mod:`tvm_streamk.occupancy`
        knows: the data-parallel kernel and then the Stream-K kernel are built, ptxas counts
        their registers, and the grid is sized for the blocks of the built kernel one SM holds
        (as CUTLASS sizes its persistent grid). Without nvcc, for OpenCL, or with no target: 1.
    fixup : str
        How partial tiles are merged. ``"atomic"``: atomic adds into an output zeroed by a
        prologue kernel (the accumulator dtype needs a device atomic add and the write-back must
        be a plain copy). ``"workspace"``: partials go to a workspace and the last block to
        arrive at the tile's counter sums them in a fixed order and runs the original write-back,
        epilogue included (bit-reproducible). ``"auto"`` (default): atomics where they are legal
        and exact enough (fp32, fp64, int32 accumulators written back unchanged), else workspace.
    deterministic : bool
        Force the workspace fix-up, whose results do not depend on arrival order.
    policy : str
        ``"stream_k"`` (default), ``"data_parallel"``, ``"split_k"`` (with ``splits``),
        ``"hybrid"`` (data-parallel full waves + Stream-K over the rest) or ``"heuristic"``
        (resolved here by :mod:`tvm_streamk.cost_model`; the trace records the concrete choice).
    splits : int, optional
        The number of K splits for ``policy="split_k"``.
    variant : str, optional
        ``"one_tile"`` or ``"two_tile"`` (the default) for ``policy="hybrid"``.
    group : int, optional
        Visit tiles in groups of ``group`` tile rows (swizzled order, for L2 locality).
    target : Target or str, optional
        Used to look up ``num_sms`` and to check that atomics exist for the accumulator dtype.

    Returns
    -------
    Plan
        The decomposition, as :func:`tvm_streamk.plan` computes it.

    Raises
    ------
    StreamKError
        Naming the first unmet precondition, what was found and what to do.

    Examples
    --------
    Before, a data-parallel kernel (abridged)::

        for i_0 in T.thread_binding(3, thread="blockIdx.y"):
            for j_0 in T.thread_binding(2, thread="blockIdx.x"):
                for i_1 in T.thread_binding(8, thread="threadIdx.y"):
                    for j_1 in T.thread_binding(8, thread="threadIdx.x"):
                        for i_2_init, j_2_init in T.grid(4, 4):
                            with T.sblock("C_init"): ...
                        for k_0 in range(5):
                            ...  # stage A, B panels in shared memory
                            for k_1, i_2, j_2 in T.grid(8, 4, 4):
                                with T.sblock("C_update"): ...
                        for ax0, ax1 in T.grid(4, 4):
                            with T.sblock("C_local"): ...  # C[...] = C_local[...]

    Schedule::

        tvm_streamk.stream_k(sch, sch.get_sblock("C_update"), num_sms=4)
        # or, once tvm_streamk is imported: sch.stream_k(sch.get_sblock("C_update"), num_sms=4)

    After, the block carries the decision; ``tvm_streamk.lower(mod, target)`` shows the persistent
    kernel: a ``blockIdx.x`` loop of 4 blocks, each walking its share of the 30 (tile, panel)
    iterations one tile segment at a time, plus a prologue kernel zeroing the split tiles (see
    ``tests/test_lower_structural.py`` for a complete expected IR).
    """
    block_rv = sblock_rv(sch, block)
    if fixup != "auto" and fixup not in fixups.names():
        raise StreamKError("fixup", f"fixup={fixup!r}", f"Use one of {['auto', *fixups.names()]}.")
    if deterministic and fixup != "auto" and not fixups.get(fixup).deterministic:
        raise StreamKError(
            "fixup",
            f"deterministic=True with fixup={fixup!r}",
            "Its merges depend on arrival order; use fixup='workspace' or 'auto'.",
        )
    if group is not None and (not isinstance(group, int) or group < 1):
        raise StreamKError("group", f"group={group!r}", "Pass a positive int, or None.")
    target = _resolve_target(target)
    # Everything is checked before the schedule changes: a refused call leaves it as it was.
    site = _analyze(sch, block_rv)
    # Several nested loops over reduction axes (rh, rw, rc_0) become one K-panel loop.
    fuse = _panel_chain_rvs(sch, block_rv, site)
    if fuse:
        trial = sch.copy()
        trial.fuse(*fuse)
        site = _analyze(trial, block_rv)
    check_one_panel_loop(site)
    if fixup == "auto":
        fixup = "workspace" if deterministic else _auto_fixup(site, target)
    check_fixup(site, fixup, target)
    check_group(group, site.band_extents)
    check_ragged(site, policy)
    check_runtime_tiles(site, policy, group)
    device_mode = num_sms == "device"
    recorded_sms = None
    if device_mode:
        check_runtime_grid(policy, site.fragment_accumulator)
        recorded_sms = ann.DEVICE_SMS
    else:
        # A chooser, and the aligned split of fragments, need the count to choose.
        deferrable = policies.chooser(policy) is None and not site.fragment_accumulator
        sms = _resolve_num_sms(num_sms, target, deferrable)
        if sms is None:
            recorded_sms = ann.TARGET_SMS
    if recorded_sms is not None:
        # Plan for one SM: the lowering evaluates the same closed forms on the run-time grid,
        # or plans again for the compile target's count.
        sms = 1

    def choose(bps: int, dp=None) -> decomposition.Plan:
        """The plan for ``bps`` resident blocks; ``dp`` is the data-parallel kernel's
        occupancy when known."""
        dp_bps = None if dp is None else dp.blocks
        busy = None if dp is None else cost_model.saturation(dp.warps_per_block, dp.blocks)
        try:
            if site.runtime_tiles:
                return _run_time_plan(site, sms, bps, policy, device_mode, fixup)
            if site.fragment_accumulator:
                return _aligned_plan(site, sms, bps, policy, splits, dp_bps, busy)
            return decomposition.plan(
                site.tiles,
                site.panels,
                sms,
                blocks_per_sm=bps,
                policy=policy,
                splits=splits,
                variant=variant,
                fixup=fixup,
                dp_blocks_per_sm=dp_bps,
                saturation=busy,
            )
        except ValueError as err:
            raise StreamKError("decomposition", str(err), "Fix the policy arguments.") from None

    def record(on: Schedule, chosen: decomposition.Plan, bps: int) -> None:
        panel_rv = on.fuse(*fuse) if fuse else None
        if site.has_init and on.get(block_rv).init is not None:
            # The persistent kernel re-initialises the accumulator per segment, before its panels.
            on.decompose_reduction(block_rv, panel_rv or _panel_loop_rv(on, block_rv, site))
        decision = ann.Decision(
            policy=chosen.policy,
            variant=chosen.variant,
            num_sms=sms if recorded_sms is None else recorded_sms,
            blocks_per_sm=bps,
            splits=chosen.splits,
            fixup=fixup,
            group=group or 0,
        )
        # A second call replaces the first decision (TVM's annotate keeps an existing key's
        # value, so the old keys are removed first; the trace records both steps and replays to
        # the same).
        existing = on.get(block_rv).annotations
        for key in ann.KEYS:
            if key in existing:
                on.unannotate(block_rv, key)
        for key, value in decision.as_annotations().items():
            on.annotate(block_rv, key, value)

    if blocks_per_sm is not None:
        bps, chosen, note = blocks_per_sm, choose(blocks_per_sm), None
    else:
        bps, chosen, note = _occupancy_plan(sch, target, choose, record)
    if recorded_sms is not None:
        when = "the run-time grid" if device_mode else "the compile target's SM count"
        also = f"{chosen.reason}; " if site.runtime_tiles else ""
        chosen = chosen.with_reason(f"{also}planned for one SM: the kernel uses {when}")
    if note:
        chosen = chosen.with_reason(f"{chosen.reason}; {note}")
    record(sch, chosen, bps)
    return chosen


def _no_occupancy(target: tvm.target.Target | None) -> str | None:
    """Why the resident blocks of a kernel cannot be counted for ``target`` (None if they can)."""
    if target is None:
        return "no target to count resident blocks for"
    if target.kind.name != "cuda":
        return f"one block per compute unit on {target.kind.name}"
    arch = target_arch(target) or ""
    try:
        occupancy.arch_limits(arch)
    except KeyError:
        return f"no occupancy limits for arch {arch or None!r}"
    if not ptxas.available():
        return "no nvcc on PATH to count the kernel's registers"
    return None


def _occupancy_plan(sch: Schedule, target, choose, record):
    """``(blocks_per_sm, plan, note)`` for the kernel's resident blocks per SM.

    The data-parallel kernel as scheduled is built and read by ptxas first; the plan made for
    its occupancy is then built as the Stream-K kernel on a copy of the schedule, and when that
    kernel holds a different number of blocks per SM the plan is made again for it, as CUTLASS
    sizes its persistent grid by the occupancy of the kernel it launches.
    """
    why = _no_occupancy(target)
    if why is not None:
        return 1, choose(1), f"1 block/SM ({why})"
    try:
        _, dp = resources.resident_blocks(ann.without_decisions(sch.mod), target, "tvm_streamk")
        if dp.blocks < 1:
            raise StreamKError(
                "occupancy",
                f"the data-parallel kernel does not fit one SM ({dp.by_limit} blocks by limit)",
                "Use smaller tiles or fewer threads per block, or pass blocks_per_sm.",
            )
        chosen = choose(dp.blocks, dp)
        trial = sch.copy()
        record(trial, chosen, dp.blocks)
        _, built = resources.resident_blocks(trial.mod, target, "tvm_streamk")
    except StreamKError:
        raise
    except Exception as err:  # noqa: BLE001 - TVM and nvcc fail with assorted exception types
        # A kernel that does not build here still gets a decision: one block per SM, and why.
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        return 1, choose(1), f"1 block/SM (the kernel did not build for its occupancy: {first})"
    bps = built.blocks if built.blocks >= 1 else dp.blocks
    if bps != dp.blocks:
        chosen = choose(bps, dp)
    note = (
        f"{bps} resident block(s)/SM of the built kernel ({built.limiter} limit; data-parallel "
        f"kernel {dp.blocks})"
    )
    return bps, chosen, note


def _aligned_plan(
    site: StreamKSite, sms: int, blocks_per_sm: int, policy: str, splits, dp_bps=None, busy=None
) -> decomposition.Plan:
    """The plan a tensor-core fragment accumulator allows (see
    :func:`tvm_streamk.legality.check_fragment_plan`).

    An explicit policy is checked as it is; ``stream_k``/``heuristic`` choose the aligned split
    ``S`` (a divisor of the panel count, 1 being data-parallel) with the cost model.
    """
    panels = site.panels
    if policy not in ("stream_k", "heuristic"):
        chosen = decomposition.plan(site.tiles, panels, sms, blocks_per_sm, policy, splits=splits)
        check_fragment_plan(chosen, site.fragment_accumulator)
        return chosen
    divisors = [d for d in range(1, panels + 1) if panels % d == 0]
    dp_bps = blocks_per_sm if dp_bps is None else dp_bps
    candidates = [decomposition.plan(site.tiles, panels, sms, dp_bps, "data_parallel")]
    candidates += [
        decomposition.plan(site.tiles, panels, sms, blocks_per_sm, "split_k", d)
        for d in divisors[1:]
    ]
    times = [cost_model.predicted_time(c, sms, saturation=busy) for c in candidates]
    best = min(range(len(candidates)), key=lambda i: (times[i], i))
    return candidates[best]


def _run_time_plan(site: StreamKSite, sms: int, bps: int, policy: str, device_mode, fixup):
    """The plan of a run-time tile count: ``heuristic`` becomes Stream-K or data-parallel
    chosen per tile count when the kernel runs (:mod:`tvm_streamk.run_time_choice`), or
    data-parallel for a tensor-core fragment (whose splits are fixed at compile time)."""
    if site.ragged is not None and policy != "data_parallel":
        chosen = decomposition.plan_at_run_time(
            site.tile_count, site.panels, sms, bps, "stream_k", runtime_sms=device_mode
        )
        return chosen.with_reason(
            "Stream-K over the grouped GEMM's tiles: their count is known only on the device, "
            "so the grid is the persistent one and the kernel reads the count from the group "
            "offsets (the kernel as written launches a tile per group for the largest group's "
            "every row tile)"
        )
    if policy != "heuristic":
        return decomposition.plan_at_run_time(
            site.tile_count, site.panels, sms, bps, policy, runtime_sms=device_mode
        )
    if site.fragment_accumulator:
        chosen = decomposition.plan_at_run_time(
            site.tile_count, site.panels, sms, bps, "data_parallel"
        )
        return chosen.with_reason(
            "data-parallel: a tensor-core fragment takes only splits fixed at compile time, and "
            "the tile count is known only at run time"
        )
    chosen = decomposition.plan_at_run_time(
        site.tile_count, site.panels, sms, bps, "stream_k", variant=StreamKOrDataParallel.variant
    )
    return chosen.with_reason(describe(stream_k_buckets(site.panels, sms, bps, fixup)))


def _auto_fixup(site: StreamKSite, target) -> str:
    atomic_ok = (
        not site.epilogue
        and not site.fragment_accumulator
        and site.accumulator_dtype in EXACT_ENOUGH_FOR_ATOMICS
        and (target is None or atomic_dtype_error(site.accumulator_dtype, target) is None)
    )
    return "atomic" if atomic_ok else "workspace"


def _analyze(sch: Schedule, block_rv) -> StreamKSite:
    return analyze_block(sch.mod, sch.get(block_rv))


def _panel_chain_rvs(sch: Schedule, block_rv, site: StreamKSite) -> list:
    """The LoopRVs of the site's panel chain when it has more than one loop, else []."""
    if len(site.panel_chain) <= 1:
        return []
    chain_vars = [loop.loop_var for loop in site.panel_chain]
    return [
        rv
        for rv in sch.get_loops(block_rv)
        if any(sch.get(rv).loop_var.same_as(v) for v in chain_vars)
    ]


def _panel_loop_rv(sch: Schedule, block_rv, site: StreamKSite):
    for loop_rv in sch.get_loops(block_rv):
        if sch.get(loop_rv).loop_var.same_as(site.panel_loop.loop_var):
            return loop_rv
    raise AssertionError("the analysed panel loop is not an ancestor of its block")


def _method(self: Schedule, block, **kwargs) -> decomposition.Plan:
    return stream_k(self, block, **kwargs)


_method.__doc__ = stream_k.__doc__
Schedule.stream_k = _method

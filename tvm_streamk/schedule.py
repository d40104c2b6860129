"""The ``stream_k`` schedule primitive: validate a tiled reduction, record a Stream-K decision."""

from __future__ import annotations

import dataclasses
import functools

import tvm

from . import decomposition, occupancy, ptxas, resources
from ._compat import Schedule, target_arch
from .analysis import StreamKSite, analyze_block, sblock_rv
from .decision import Decision, Request, decide, record, validate
from .decision.decide import PTXAS
from .errors import StreamKError


def _resolve_target(target) -> tvm.target.Target | None:
    if target is None:
        return tvm.target.Target.current(allow_none=True)
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


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
    batch_invariant: bool = False,
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
    blocks_per_sm : int or "ptxas", optional
        Resident blocks per SM; the persistent grid is ``blocks_per_sm * num_sms``. By default
        (None) the kernel's own occupancy on a CUDA target whose arch
        :mod:`tvm_streamk.occupancy` knows, read from its IR without nvcc: threads and shared
        memory of the scheduled kernel, and an upper bound of its registers
        (:mod:`tvm_streamk.register_estimate`), a few milliseconds. The bound errs towards
        fewer blocks (up to two fewer than ptxas counts over the test suite's kernels), never
        towards a grid that does not fit. ``"ptxas"``: the count of the built
        kernel, as CUTLASS sizes its persistent grid: the data-parallel kernel and, where its
        registers decide, the Stream-K kernel are built, ptxas counts their registers (0.2-1.2
        s of nvcc each), and a Stream-K kernel over the data-parallel registers + 16 or
        spilling is built declaring the data-parallel count in its ``__launch_bounds__``, kept
        so where ptxas meets it cleanly (:mod:`tvm_streamk.transform.declare_occupancy`).
        For OpenCL, with no target, or (``"ptxas"``) without nvcc: 1.
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
        Visit tiles in groups of ``group`` tile rows (swizzled order, for L2 locality). An
        aligned split-K (``splits`` dividing the K-panels, blocks ``tile * S + s``) keeps the
        band's loops in their row-major order, and the group does not apply to it.
    batch_invariant : bool
        Reduce every output element in one order fixed by K and the panel depth alone, so a
        row has the same bits whatever M, the grid, the SM count or the policy: K is cut into
        chunks (:mod:`tvm_streamk.decomposition.chunks`), each summed from zero, and the
        workspace fix-up adds them in chunk order, in every decomposition, data-parallel
        included. Needs the workspace fix-up (``"auto"`` takes it); the returned plan counts
        chunks. docs/batch_invariance.md says what it costs and covers.
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
    ``tests/transform/test_lower_structural.py`` for a complete expected IR).
    """
    request = Request(
        num_sms=num_sms,
        blocks_per_sm=blocks_per_sm,
        fixup=fixup,
        deterministic=deterministic,
        policy=policy,
        splits=splits,
        variant=variant,
        group=group,
        batch_invariant=batch_invariant,
    )
    validate(request)
    block_rv = sblock_rv(sch, block)
    target = _resolve_target(target)
    # Step 1. Check: analyse the kernel as the decision will see it and decide. Nothing changes
    # the schedule before every precondition holds: a refused call leaves it as it was.
    site, fuse = _site(sch, block_rv)
    if blocks_per_sm == PTXAS:
        decision, chosen = _decide_for_occupancy(sch, block_rv, fuse, site, request, target)
    elif blocks_per_sm is None:
        decision, chosen = _decide_for_estimated_occupancy(sch, site, request, target)
    else:
        decision, chosen = decide(site, request, target, blocks_per_sm)
    # Step 2. Mutate: fuse the panel loops, decompose the reduction, record the decision.
    _record(sch, block_rv, site, fuse, decision)
    return chosen


def _site(sch: Schedule, block_rv) -> tuple[StreamKSite, list]:
    """The site the decision applies to, and the loops to fuse into one K-panel loop first
    (several nested loops over reduction axes, ``rh, rw, rc_0``; [] when there is one)."""
    site = _analyze(sch, block_rv)
    fuse = _panel_chain_rvs(sch, block_rv, site)
    if fuse:
        trial = sch.copy()
        trial.fuse(*fuse)
        site = _analyze(trial, block_rv)
    return site, fuse


def _record(on: Schedule, block_rv, site: StreamKSite, fuse: list, decision) -> None:
    """Fuse the panel chain, decompose the reduction at the panel loop and record ``decision``
    on the block (replacing an earlier one)."""
    panel_rv = on.fuse(*fuse) if fuse else None
    if site.has_init and on.get(block_rv).init is not None:
        # The persistent kernel re-initialises the accumulator per segment, before its panels.
        on.decompose_reduction(block_rv, panel_rv or _panel_loop_rv(on, block_rv, site))
    # TVM's annotate keeps an existing key's value, so the old keys are removed first; the
    # trace records both steps and replays to the same.
    existing = on.get(block_rv).annotations
    for key in record.KEYS + record.OPTIONAL_KEYS:
        if key in existing:
            on.unannotate(block_rv, key)
    for key, value in decision.as_annotations().items():
        on.annotate(block_rv, key, value)


def _decide_for_estimated_occupancy(sch: Schedule, site, request, target):
    """``(decision, plan)`` for the resident blocks per SM the scheduled kernel's IR allows
    (:func:`tvm_streamk.resources.estimated_uses`): no nvcc, no lowering past compaction.
    Without a CUDA target or an arch with known limits: one block per SM, and the plan says
    why."""
    why = _no_occupancy(target, needs_nvcc=False)
    if why is not None:
        return _one_block_per_sm(site, request, target, why)
    arch = target_arch(target)
    try:
        uses = resources.estimated_uses(
            record.without_decisions(sch.mod), target, group_walk=site.ragged is not None
        )
    except Exception as err:  # noqa: BLE001 - TVM's passes fail with assorted exception types
        # A kernel TVM's lowering cannot take this far still gets a decision, as on the ptxas
        # path: one block per SM, and why.
        return _one_block_per_sm(
            site, request, target, f"the kernel's IR could not be read: {_first_line(err)}"
        )
    name, held = resources.fewest_blocks(uses, arch)
    if held.by_limit.get("shared", 1) < 1 or held.by_limit["threads"] < 1:
        raise _does_not_fit(held)
    # A bound above what one block's threads may have still launches: ptxas fits one block.
    bps = max(1, held.blocks)
    occupancy_of_dp = {"dp_blocks_per_sm": bps, "warps_per_block": held.warps_per_block}
    decision, chosen = decide(site, request, target, bps, **occupancy_of_dp)
    note = (
        f"{bps} resident block(s)/SM estimated from the IR (<= {uses[name].registers} "
        f"registers, {held.limiter} limit; blocks_per_sm='ptxas' counts them with nvcc)"
    )
    return decision, chosen.with_reason(f"{chosen.reason}; {note}")


# Registers per thread the Stream-K kernel may use beyond the data-parallel kernel's: its
# segment walk and fix-up keep a few more values live (dlight's fp32 kernel on sm_80: 72
# registers data-parallel, 80 Stream-K); the ptxas suite holds every kernel it builds to it.
REGISTER_HEADROOM = 16


def _decide_for_occupancy(sch: Schedule, block_rv, fuse, site, request, target):
    """``(decision, plan)`` for the resident blocks per SM of the kernel being built.

    The data-parallel kernel as scheduled is built and read by ptxas first (once per CUDA
    source: :func:`tvm_streamk.ptxas.resources` keeps what it read); the decision made for its
    occupancy is then lowered as the Stream-K kernel on a copy of the schedule
    (:func:`_stream_k_occupancy`), and when that holds a different number of blocks per SM the
    decision is made again for it, as CUTLASS sizes its persistent grid by the occupancy of the
    kernel it launches. Without a CUDA target, an arch with known limits or nvcc: one block per
    SM, and the plan says why.
    """
    why = _no_occupancy(target, needs_nvcc=True)
    if why is not None:
        return _one_block_per_sm(site, request, target, why)
    try:
        arch = target_arch(target)
        uses = resources.kernel_uses(record.without_decisions(sch.mod), target, "tvm_streamk")
        name, dp = resources.fewest_blocks(uses, arch)
        dp_registers = uses[name].registers
        if dp.blocks < 1:
            raise _does_not_fit(dp)
        occupancy_of_dp = {"dp_blocks_per_sm": dp.blocks, "warps_per_block": dp.warps_per_block}
        decision, chosen = decide(site, request, target, dp.blocks, **occupancy_of_dp)

        def lowered(d: Decision):
            trial = sch.copy()
            _record(trial, block_rv, site, fuse, d)
            return trial.mod

        built, declared = _stream_k_occupancy(lowered, decision, target, dp, dp_registers)
    except StreamKError:
        raise
    except Exception as err:  # noqa: BLE001 - TVM and nvcc fail with assorted exception types
        # A kernel that does not build here still gets a decision: one block per SM, and why.
        return _one_block_per_sm(
            site, request, target, f"the kernel did not build for its occupancy: {_first_line(err)}"
        )
    # A declared kernel may hold more blocks than it declares; the grid counts what it declares.
    bps = dp.blocks if declared or built.blocks < 1 else built.blocks
    if bps != dp.blocks:
        decision, chosen = decide(site, request, target, bps, **occupancy_of_dp)
    if declared:
        decision = dataclasses.replace(decision, declares_occupancy=True)
    how = "declared by" if declared else "of"
    note = (
        f"{bps} resident block(s)/SM {how} the built kernel ({built.limiter} limit; "
        f"data-parallel kernel {dp.blocks})"
    )
    return decision, chosen.with_reason(f"{chosen.reason}; {note}")


def _stream_k_occupancy(lowered, decision: Decision, target, dp, dp_registers: int):
    """``(occupancy, declared)``: the resident blocks per SM of the Stream-K kernel of
    ``lowered(decision)``, and whether it declares them.

    Its threads and shared memory come from its IR. Where the data-parallel kernel's registers
    and :data:`REGISTER_HEADROOM` hold as many blocks as the data-parallel registers alone, any
    register count in between gives that count, and nvcc need not run. Otherwise ptxas counts
    the kernel's registers. Where it then takes more than the data-parallel registers and the
    headroom, or spills, the kernel is built again declaring the data-parallel kernel's count
    in its ``__launch_bounds__`` (:mod:`tvm_streamk.transform.declare_occupancy`), and kept so
    where ptxas meets it without spills or stack (the ragged-K walk on sm_80: 44-48 registers
    and 5 blocks, against 64-72 and 4). A kernel within the budget is not declared: a tighter
    bound can cost instructions in the K loop (dlight's fp32 kernel of a run-time M on sm_90,
    K = 3072: 401 SASS instructions declaring 8 blocks, 64 registers, against data-parallel's
    319; the ptxas suite holds the K loop within 15%).
    """
    mod = lowered(decision)
    _, roomy = resources.resident_blocks(
        mod, target, "tvm_streamk", registers=dp_registers + REGISTER_HEADROOM
    )
    _, tight = resources.resident_blocks(mod, target, "tvm_streamk", registers=dp_registers)
    if roomy.blocks == tight.blocks:
        return roomy, False
    arch = target_arch(target)

    def built(mod):
        uses = resources.kernel_uses(mod, target, "tvm_streamk")
        _, fewest = resources.fewest_blocks(uses, arch)
        clean = all(use.spills == 0 and use.stack == 0 for use in uses.values())
        lean = max(use.registers for use in uses.values()) <= dp_registers + REGISTER_HEADROOM
        return fewest, clean, lean

    written, clean, lean = built(mod)
    if (clean and lean) or tight.blocks != dp.blocks or dp.blocks < 2:
        return written, False
    declared, clean, _ = built(lowered(dataclasses.replace(decision, declares_occupancy=True)))
    if clean and declared.blocks >= dp.blocks:
        return declared, True
    return written, False


def _one_block_per_sm(site, request, target, why: str):
    """``(decision, plan)`` for one resident block per SM, the plan saying ``why``."""
    decision, chosen = decide(site, request, target, 1)
    return decision, chosen.with_reason(f"{chosen.reason}; 1 block/SM ({why})")


def _first_line(err: Exception) -> str:
    """The first line of ``err``'s message (its type where it has none), for a plan's reason."""
    text = str(err).strip()
    return text.splitlines()[0][:160] if text else type(err).__name__


def _does_not_fit(held: occupancy.Occupancy) -> StreamKError:
    return StreamKError(
        "occupancy",
        f"the data-parallel kernel does not fit one SM ({held.by_limit} blocks by limit)",
        "Use smaller tiles or fewer threads per block, or pass blocks_per_sm.",
    )


def _no_occupancy(target: tvm.target.Target | None, needs_nvcc: bool) -> str | None:
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
    if needs_nvcc and not ptxas.available():
        return "no nvcc on PATH to count the kernel's registers"
    return None


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


@functools.wraps(stream_k)
def _method(self: Schedule, block, **kwargs) -> decomposition.Plan:
    return stream_k(self, block, **kwargs)


# help(sch.stream_k) shows stream_k's keywords and docstring (functools.wraps).
Schedule.stream_k = _method

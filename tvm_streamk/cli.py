"""The ``tvm-streamk`` command line (also ``python -m tvm_streamk``).

Subcommands
-----------
demo
    Build a GEMM, schedule it the usual data-parallel way, apply Stream-K, run both kernels on the
    default device (a CUDA GPU when TVM can use one, else PoCL on the CPU), check both against
    float64 numpy, time both and explain the decomposition. Exits 1 when a check fails.
source
    Print the CUDA (or OpenCL) source of the Stream-K GEMM for a target, built offline.
explain
    Print the decomposition of a number of tiles and K-panels over a number of SMs; builds nothing.

Errors in the arguments (an unknown GPU, a policy argument out of its domain, a schedule that
Stream-K cannot rewrite) exit with status 2 and a message on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import textwrap
import time

import numpy as np

from . import cost_model, decomposition, fixup_registry, gpus, workloads
from . import device as devices
from .decomposition import DecompositionError
from .errors import StreamKError
from .explain import ExplainError, explain

# Elementwise tolerance of the checks, relative to the largest output: fp32 accumulation of K
# products of values in [-1, 1] stays within 1e-5 of float64 for the K the demo runs; int8 inputs
# accumulate exactly in int32.
TOLERANCE = {"float32": 1e-5, "float16": 1e-5, "int8": 0.0}
DTYPES = tuple(TOLERANCE)
DEFAULT_TARGET = "nvidia/nvidia-h100"
EXAMPLE_JSON_TARGET = '\'{"kind": "cuda", "arch": "sm_80"}\''
# K of the demo: long enough that one tile is real work, short enough for a few seconds on PoCL.
DEFAULT_K = 2048


class _UsageError(Exception):
    """An argument the command cannot use; reported on stderr with exit status 2."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, found {value}")
    return value


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"expected a shape such as 128x128, found {text!r}")
    return dims


def _add_tiling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bm", type=_positive, default=32, help="tile rows (default 32)")
    p.add_argument("--bn", type=_positive, default=32, help="tile columns (default 32)")
    p.add_argument("--bk", type=_positive, default=8, help="K-panel depth (default 8)")


def _add_gemm(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--m",
        type=_positive,
        help="rows of C (default: one tile more than a full wave, (num_sms * blocks_per_sm + 1) "
        "* bm, the case data-parallel handles worst)",
    )
    p.add_argument("--n", type=_positive, help="columns of C (default: bn, one tile column)")
    p.add_argument("--k", type=_positive, default=DEFAULT_K, help=f"K (default {DEFAULT_K})")
    _add_tiling(p)
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of A and B")


def _schedule_fixups() -> tuple[str, ...]:
    """What ``stream_k(fixup=)`` takes: ``auto`` and every registered fix-up."""
    return (fixup_registry.AUTO, *fixup_registry.names())


def _needs_num_sms(policy: str) -> bool:
    return decomposition.policy.chooser(policy) is not None or (
        decomposition.policy.get(policy).needs_num_sms
    )


def _add_policy(p: argparse.ArgumentParser, default: str, fixups) -> None:
    p.add_argument(
        "--policy",
        choices=decomposition.policy.names(),
        default=default,
        help=f"decomposition (default {default}); 'heuristic' asks the cost model",
    )
    p.add_argument("--splits", type=_positive, help="K splits, for --policy split_k")
    p.add_argument(
        "--variant", choices=decomposition.policy.variants("hybrid"), help="for --policy hybrid"
    )
    p.add_argument(
        "--blocks-per-sm",
        type=_positive,
        help="resident blocks per SM (default: the built kernel's occupancy for a CUDA target, "
        "else 1)",
    )
    # "auto" (where the primitive offers it) lets it pick atomics where they are exact enough.
    default_fixup = "auto" if "auto" in fixups else "atomic"
    p.add_argument(
        "--fixup",
        choices=fixups,
        default=default_fixup,
        help=f"how split tiles merge (default {default_fixup})",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tvm-streamk``."""
    parser = argparse.ArgumentParser(
        prog="tvm-streamk",
        description="Stream-K work decomposition for Apache TVM TensorIR GPU kernels.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="run a data-parallel and a Stream-K GEMM on the default device; check and time them",
        description="Build a GEMM, apply Stream-K, run it and the data-parallel kernel on the "
        "default device, check both against float64 numpy, time both, explain the plan.",
    )
    _add_gemm(demo)
    demo.add_argument(
        "--num-sms", type=_positive, help="SMs to plan for (default: the device's own count)"
    )
    _add_policy(demo, "stream_k", _schedule_fixups())
    demo.add_argument(
        "--device",
        choices=devices.DEVICES,
        help="where to run (default: cuda when TVM can use a GPU, else pocl)",
    )
    demo.add_argument("--repeat", type=_positive, default=5, help="timed runs per kernel (median)")
    demo.add_argument("--seed", type=int, help="seed of the random inputs (default: fresh)")
    demo.set_defaults(run=_demo)

    source = sub.add_parser(
        "source",
        help="print the CUDA source of the Stream-K GEMM for a target",
        description="Build the Stream-K GEMM offline for a target and print its device source.",
    )
    source.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"a TVM target tag or a JSON target (default {DEFAULT_TARGET})",
    )
    _add_gemm(source)
    source.add_argument(
        "--num-sms", type=_positive, help="SMs to plan for (default: from the target's tag)"
    )
    _add_policy(source, "stream_k", _schedule_fixups())
    source.set_defaults(run=_source)

    expl = sub.add_parser(
        "explain",
        help="print the decomposition of tiles x K-panels over SMs (builds nothing)",
        description="Print the plan for a number of tiles and K-panels, beside data-parallel. "
        "Give --tiles and --panels, or a GEMM shape (--m --n --k with --bm --bn --bk).",
    )
    expl.add_argument("--tiles", type=_positive, help="output tiles")
    expl.add_argument("--panels", type=_positive, help="K-panels per tile")
    expl.add_argument("--m", type=_positive, help="rows of C (instead of --tiles)")
    expl.add_argument("--n", type=_positive, help="columns of C (instead of --tiles)")
    expl.add_argument("--k", type=_positive, help="K (instead of --panels)")
    _add_tiling(expl)
    expl.add_argument(
        "--tile-shape", type=_shape, help="output elements per tile, e.g. 128x128 (for bytes)"
    )
    expl.add_argument("--num-sms", type=_positive, help="SMs of the GPU")
    expl.add_argument(
        "--target",
        help="a TVM target tag, or a GPU of tvm_streamk.cost_model.GPU_SPECS (e.g. "
        "nvidia/nvidia-h200): its SM count when --num-sms is not given, and with --m --n --k "
        "the predicted times in microseconds on it",
    )
    expl.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="dtype of A and B (for microseconds)"
    )
    expl.add_argument(
        "--instruction",
        choices=("ffma", "mma"),
        help="CUDA cores or tensor cores (default: tensor cores for 16-bit inputs)",
    )
    # Reports need no kernel, so every registered fix-up is accepted, built or not.
    _add_policy(expl, "heuristic", fixup_registry.names())
    expl.add_argument("--json", action="store_true", help="print the report as JSON")
    expl.set_defaults(run=_explain)
    return parser


def _check_policy_flags(parser: argparse.ArgumentParser, args) -> None:
    """Refuse policy flags that do not go together, naming the flags (not the Python keywords
    they become)."""
    policy = getattr(args, "policy", None)
    if policy is None or decomposition.policy.chooser(policy) is not None:
        takes_splits, variants = False, ()
    else:
        takes_splits = decomposition.policy.get(policy).takes_splits
        variants = decomposition.policy.variants(policy)
    if takes_splits and args.splits is None:
        parser.error(f"--policy {policy} needs --splits N (K splits per tile, at least 2)")
    if not takes_splits and args.splits is not None:
        users = [p.name for p in decomposition.policy.concrete() if p.takes_splits]
        parser.error(f"--splits goes with --policy {' or '.join(users)}, not --policy {policy}")
    if args.variant is not None and args.variant not in variants:
        owners = [p.name for p in decomposition.policy.concrete() if p.variant == args.variant]
        parser.error(
            f"--variant {args.variant} goes with --policy {' or '.join(owners)}, not --policy "
            f"{policy}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run ``tvm-streamk`` with ``argv`` (default: the process arguments); return the status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        # No command: say which there are, as `git` and `pip` do.
        parser.print_help(sys.stderr)
        return 2
    _check_policy_flags(parser, args)
    try:
        return args.run(args)
    except (
        _UsageError,
        StreamKError,
        DecompositionError,
        ExplainError,
        gpus.UnknownGPUError,
        workloads.WorkloadError,
        devices.NoDeviceError,
    ) as err:
        print(f"tvm-streamk {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader closed the pipe (``tvm-streamk source | head``): not an error, but Python
        # would report the failed flush of stdout at exit unless stdout points elsewhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _policy_kwargs(args) -> dict:
    return {
        "blocks_per_sm": args.blocks_per_sm,
        "policy": args.policy,
        "splits": args.splits,
        "variant": args.variant,
    }


def _gemm_shape(args, num_sms: int) -> tuple[int, int, int]:
    m = args.m or (num_sms * (args.blocks_per_sm or 1) + 1) * args.bm
    n = args.n or args.bn
    return m, n, args.k


def _schedule(func, args):
    return workloads.reference_schedule(func, bm=args.bm, bn=args.bn, bk=args.bk)


def _timed(what: str, fn):
    print(f"{what} ...", end=" ", flush=True)
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def _check(func, kernel, dtype: str, rng: np.random.Generator) -> tuple[float, bool]:
    """Run ``kernel`` on fresh inputs, output poisoned; its relative error and verdict."""
    arrays = workloads.random_args(func, rng)
    out = kernel.run(*arrays)[-1]
    err = workloads.relative_error(out, workloads.reference(func, arrays))
    return err, err <= TOLERANCE[dtype]


def _demo(args) -> int:
    device = args.device or devices.default_device()
    num_sms = args.num_sms or devices.num_sms(device)
    target = devices.target(device)
    m, n, k = _gemm_shape(args, num_sms)
    print(
        f"tvm-streamk demo: C = A @ B, {m}x{n}x{k} {args.dtype}, {args.bm}x{args.bn} tiles, "
        f"K-panels of {args.bk}, on {device} planning for {num_sms} SMs"
    )
    func = workloads.gemm(m, n, k, in_dtype=args.dtype)
    baseline = _schedule(func, args)
    stream_k = _schedule(func, args)
    plan = stream_k.stream_k(
        "C_update", num_sms=num_sms, fixup=args.fixup, target=target, **_policy_kwargs(args)
    )
    # The Stream-K kernel is named after its plan; a data_parallel plan still goes through the
    # tvm_streamk pipeline, which must leave it as it was.
    label = plan.label if not plan.scheme.is_original else f"{plan.label} (tvm_streamk)"
    kernels = {}
    for name, sch, pipeline in (
        ("data-parallel", baseline, "default"),
        (label, stream_k, "tvm_streamk"),
    ):
        kernels[name], seconds = _timed(
            f"building {name} kernel", lambda s=sch, p=pipeline: devices.compile(s, device, p)
        )
        print(f"{seconds:.1f} s")

    rng = np.random.default_rng(args.seed)
    passed = True
    tol = TOLERANCE[args.dtype]
    for name, kernel in kernels.items():
        (err, ok), _ = _timed(
            f"running {name} kernel", lambda kn=kernel: _check(func, kn, args.dtype, rng)
        )
        passed &= ok
        print(f"max relative error {err:.2e} (tolerance {tol:g}): {'PASS' if ok else 'FAIL'}")

    print(f"timing (median of {args.repeat} runs) ...", flush=True)
    arrays = workloads.random_args(func, rng)
    times = {name: kernel.time(*arrays, repeat=args.repeat) for name, kernel in kernels.items()}
    on_cpu = devices.is_cpu(device)
    t_dp = times["data-parallel"]
    width = max(map(len, times))
    for name, seconds in times.items():
        what = "CPU time ratio" if on_cpu else "measured speed-up"
        ratio = "" if name == "data-parallel" else f"   {what} {t_dp / seconds:.2f}x"
        print(f"  {name:<{width}} {seconds * 1e3:9.3f} ms{ratio}")
    if on_cpu:
        print(
            f"  ({device} runs blocks as CPU threads: these times show that the kernels run and "
            "what their\n   bookkeeping costs, not the speed-up a GPU would see; the model's "
            "prediction is below)"
        )
    print()
    report = explain(stream_k)
    heuristic = decomposition.plan(
        plan.tiles,
        plan.panels,
        num_sms,
        blocks_per_sm=plan.blocks_per_sm,
        policy="heuristic",
        fixup=report.fixup,
    )
    choice = f"the heuristic would choose {heuristic.label}: {heuristic.reason}"
    print("\n" + textwrap.fill(choice, width=96, subsequent_indent="  ", break_on_hyphens=False))
    print("\nPASS" if passed else "\nFAIL: a kernel disagrees with float64 numpy")
    return 0 if passed else 1


def _parse_target(text: str):
    from ._compat import target as as_target

    if text.lstrip().startswith("{"):
        try:
            config = json.loads(text)
        except json.JSONDecodeError as err:
            raise _UsageError(f"--target is not valid JSON ({err}): {text!r}") from None
        return None, as_target(config)
    try:
        return text, as_target(text)
    except Exception as err:  # noqa: BLE001 - TVM raises its own error types for unknown tags
        raise _UsageError(
            f"--target {text!r} is not a TVM target tag ({err}); use a tag such as "
            f"{DEFAULT_TARGET!r} or a JSON target such as {EXAMPLE_JSON_TARGET}"
        ) from None


def _resident_blocks(args, target) -> int:
    """Resident blocks per SM of the data-parallel kernel of ``args``' tiling on ``target``
    (its shape does not change them): ``tvm_streamk.occupancy``'s count, 1 when it cannot be
    had (no CUDA target, no nvcc)."""
    from . import resources

    probe = _schedule(workloads.gemm(2 * args.bm, args.bn, args.k, in_dtype=args.dtype), args)
    try:
        _, held = resources.resident_blocks(probe.mod, target)
    except (ValueError, RuntimeError):
        return 1
    return max(1, held.blocks)


def _target_num_sms(num_sms, tag, target) -> int:
    try:
        return gpus.num_sms_for_target(num_sms, target, tag=tag)
    except gpus.UnknownGPUError as err:
        raise _UsageError(f"{err}; on the command line: --num-sms N") from None


def _source(args) -> int:
    import tvm

    tag, target = _parse_target(args.target)
    num_sms = _target_num_sms(args.num_sms, tag, target)
    # A full wave is every resident block of every SM: the default shape has one tile more.
    if args.blocks_per_sm is None:
        args.blocks_per_sm = _resident_blocks(args, target)
    m, n, k = _gemm_shape(args, num_sms)
    func = workloads.gemm(m, n, k, in_dtype=args.dtype)
    sch = _schedule(func, args)
    plan = sch.stream_k(
        "C_update", num_sms=num_sms, fixup=args.fixup, target=target, **_policy_kwargs(args)
    )
    fixup = explain(sch, print_=False).fixup  # the concrete choice behind "auto"
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    device_modules = list(lib.mod.imports)
    if not device_modules:
        raise _UsageError(f"target {args.target!r} produced no device module to print")
    print(
        f"// tvm-streamk: C = A @ B, {m}x{n}x{k} {args.dtype}, {args.bm}x{args.bn} tiles, "
        f"K-panels of {args.bk}\n// {plan.label}: {plan.tiles} tiles x {plan.panels} panels "
        f"on grid {plan.grid} ({num_sms} SMs x {plan.blocks_per_sm} block(s)/SM), {fixup} fixup, "
        f"target {target.kind.name} "
        f"{target.attrs.get('arch', '')}".rstrip()
    )
    for module in device_modules:
        print(module.inspect_source())
    return 0


def _explain_cost(args, spec, tile_shape):
    """The model's constants in microseconds for ``args``' GEMM on ``spec`` (None without a
    priced GPU or a GEMM shape, or for a tile the model cannot price)."""
    if spec is None or not (args.m and args.n and args.k):
        return None
    instruction = args.instruction or ("ffma" if args.dtype == "float32" else "mma")
    traits = cost_model.KernelTraits(
        tile_m=math.prod(tile_shape[:-1]),
        tile_n=tile_shape[-1],
        panel_k=args.bk,
        in_dtype=args.dtype,
        acc_dtype="float32",
        out_dtype=args.dtype,
        instruction=instruction,
        m=args.m,
        n=args.n,
        k=args.k,
    )
    try:
        return cost_model.priced(cost_model.price(traits, spec, args.fixup))
    except cost_model.UnpricedError as err:
        raise _UsageError(f"cannot predict microseconds on {spec.name}: {err}") from None


def _explain(args) -> int:
    if args.tiles is not None or args.panels is not None:
        if args.tiles is None or args.panels is None:
            raise _UsageError("give both --tiles and --panels, or a shape with --m --n --k")
        if args.m or args.n or args.k:
            raise _UsageError("give either --tiles and --panels or --m --n --k, not both")
        tiles, panels, tile_shape = args.tiles, args.panels, args.tile_shape
    elif args.m and args.n and args.k:
        tiles = -(-args.m // args.bm) * -(-args.n // args.bn)
        panels = -(-args.k // args.bk)
        tile_shape = args.tile_shape or (args.bm, args.bn)
    else:
        raise _UsageError("give --tiles and --panels, or a GEMM shape with --m --n --k")
    num_sms = args.num_sms
    spec = None if args.target is None else cost_model.spec_for(args.target)
    if num_sms is None and spec is not None:
        num_sms = spec.sms
    elif num_sms is None and args.target is not None:
        tag, target = _parse_target(args.target)
        num_sms = _target_num_sms(None, tag, target)
    if num_sms is None and _needs_num_sms(args.policy):
        raise _UsageError(
            f"--policy {args.policy} sizes the grid from the SM count: give --num-sms N or "
            "--target TAG"
        )
    kwargs = {**_policy_kwargs(args), "blocks_per_sm": args.blocks_per_sm or 1}
    cost = _explain_cost(args, spec, tile_shape)
    plan = decomposition.plan(tiles, panels, num_sms, fixup=args.fixup, cost=cost, **kwargs)
    report = explain(plan, tile_shape=tile_shape, fixup=args.fixup, cost=cost, print_=False)
    # A target named but no microseconds: say why (the JSON's predicted_us are null).
    if cost is None and spec is not None:
        why = "microseconds need the GEMM's shape: give --m --n --k (and --bm --bn --bk)"
        report = dataclasses.replace(report, unpriced=f"{why}, not --tiles --panels")
    elif args.target is not None and spec is None:
        priced = ", ".join(sorted(cost_model.GPU_SPECS))
        why = cost_model.not_a_gpu(args.target)
        report = dataclasses.replace(report, unpriced=f"{why} (it prices {priced})")
    print(json.dumps(report.as_dict(), indent=2) if args.json else report)
    return 0

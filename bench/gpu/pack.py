"""Build the GPU proof pack: every kernel of a shape set, exported, with a manifest and a runtime.

No GPU is needed. For each shape of ``--shapes`` (:mod:`bench.gpu.shapes`) and each kernel of
its suite (:data:`bench.gpu.kernels.SUITES`) the kernel is built for ``nvidia/nvidia-h100``
(sm_90, 132 SMs, as the H200) with the ``tvm_streamk`` pipeline, exported with
``export_library`` and its CUDA source compiled to a cubin by nvcc. The pack holds::

    manifest.json            every kernel: files, shape, dtypes, schedule source, plan,
                             predicted time, argument order and output index
    run.py                   the runner (stdlib only; torch on the GPU machine)
    kernels/NAME.so          the exported library (host code + CUDA source)
    kernels/NAME.cubin       the source compiled for the target's arch
    runtime/tvm, tvm_ffi     TVM without its compiler, for the GPU machine's Python
    runtime-fallback/        typing_extensions, used only where the machine has none

    device_run.sh            the one command to run on the GPU machine
    runner/                  what run.py runs

and ``OUT.tar.gz`` of it, which is what travels: at most :data:`MAX_BYTES` for its shape set
(16 MiB for ``tiny``, 48 MiB for ``sweep``), with no wheel inside; a bigger archive fails the
build. Usage::

    python -m bench.gpu.pack --shapes tiny --out /tmp/pack
    python -m bench.gpu.pack --shapes sweep --out /tmp/pack --jobs 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import multiprocessing
import os
import shutil
import sys
import tarfile
import time
import traceback
from pathlib import Path

# The most the archive (OUT.tar.gz) may weigh, per shape set; the device tool carries 64 MiB.
MAX_BYTES = {"tiny": 16 * 2**20, "sweep": 48 * 2**20, "custom": 48 * 2**20}
HERE = Path(__file__).resolve().parent
# What travels with the kernels: the runner and the staged command.
RUNNER_FILES = ("run.py", "device_run.sh")
RUNNER_PACKAGE = "runner"


class PackSizeError(RuntimeError):
    """The archive is over its limit, or holds a file that must not travel."""


def _build_one(task: tuple) -> dict:
    """Worker: build one kernel into ``kernels_dir``; a record, or the error."""
    shape, variant, kernels_dir = task
    start = time.perf_counter()
    try:
        from bench.gpu import kernels

        if shape.run_ms:
            built = kernels.build_dynamic(variant, shape.n, shape.k, shape.run_ms)
        else:
            built = kernels.build(variant, shape.m, shape.n, shape.k)
        if built is None:
            return {"skipped": f"{shape.key}-{variant.label}", "why": "no Stream-K-able block"}
        lib, binary, records = built
        records = records if isinstance(records, list) else [records]
        # A dynamic-M kernel is one library for all of its records.
        name = f"{shape.key}-{variant.label}" if shape.run_ms else records[0]["name"]
        lib.export_library(str(Path(kernels_dir) / f"{name}.so"))
        (Path(kernels_dir) / f"{name}.cubin").write_bytes(binary)
        for record in records:
            record.update(
                task=f"{shape.key}-{variant.label}",
                file=f"kernels/{name}.so",
                cubin=f"kernels/{name}.cubin",
                shape_class=shape.cls,
                suite=shape.suite,
                note=shape.note,
                build_seconds=round(time.perf_counter() - start, 2),
            )
        return {"records": records} if shape.run_ms else records[0]
    except Exception as err:  # noqa: BLE001 - one failed kernel must not stop the pack
        return {
            "failed": f"{shape.key}-{variant.label}",
            "error": f"{type(err).__name__}: {err}"[:2000],
            "traceback": traceback.format_exc()[-4000:],
        }


def _tasks(shape_set, kernels_dir: Path) -> list[tuple]:
    from bench.gpu import kernels, shapes

    chosen = shapes.SETS[shape_set]() if isinstance(shape_set, str) else list(shape_set)
    return [
        (shape, variant, str(kernels_dir))
        for shape in chosen
        for variant in kernels.SUITES[shape.suite]
    ]


def _progress(done: int, total: int, result: dict, started: float) -> str:
    elapsed = time.perf_counter() - started
    eta = elapsed / done * (total - done)
    head = f"[{done}/{total} {elapsed:6.0f}s eta {eta:5.0f}s]"
    if "records" in result:
        first = result["records"][0]
        ms = ", ".join(str(r["shape"]["m"]) for r in result["records"])
        return f"{head} {first['task']}: one build, run at m = {ms} ({first['build_seconds']:.1f}s)"
    if "failed" in result:
        return f"{head} FAILED {result['failed']}: {result['error'].splitlines()[0][:160]}"
    if "skipped" in result:
        return f"{head} skipped {result['skipped']}: {result['why']}"
    p = result["plan"]
    return (
        f"{head} {result['name']}: {p['label']} grid {p['grid']} ({p['blocks_per_sm']}/SM), "
        f"predicted {result['predicted_units']:.0f} vs dp {result['predicted_dp_units']:.0f} "
        f"units ({result['build_seconds']:.1f}s)"
    )


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def build_pack(
    out: Path,
    shape_set="tiny",
    python: str = "3.12",
    wheel_dir: Path | None = None,
    jobs: int | None = None,
    log=print,
) -> dict:
    """Build the pack into ``out`` (emptied first) and return its manifest.

    ``shape_set`` is a name of :data:`bench.gpu.shapes.SETS` or a list of
    :class:`~bench.gpu.shapes.Shape`.
    """
    from bench.gpu import kernels, runtime_bundle

    started = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    kernels_dir = out / "kernels"
    kernels_dir.mkdir(parents=True)
    tasks = _tasks(shape_set, kernels_dir)
    jobs = jobs or os.cpu_count() or 1
    set_name = shape_set if isinstance(shape_set, str) else "custom"
    log(f"building {len(tasks)} kernels of the {set_name!r} shapes with {jobs} process(es)")
    results = []
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [pool.submit(_build_one, task) for task in tasks]
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            result = future.result()
            results.extend(result["records"] if "records" in result else [result])
            log(_progress(done, len(tasks), result, started))
    order = {f"{s.key}-{v.label}": i for i, (s, v, _) in enumerate(tasks)}

    def position(r: dict) -> int:
        return order.get(r.get("failed") or r.get("skipped"), -1)

    records = sorted((r for r in results if "name" in r), key=lambda r: order[r["task"]])
    runtime = runtime_bundle.bundle(out / "runtime", python, wheel_dir)
    fallback = out / "runtime-fallback"
    fallback.mkdir()
    import typing_extensions

    shutil.copy2(typing_extensions.__file__, fallback / "typing_extensions.py")
    copy_runner(out)
    manifest = {
        "format": 2,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "shapes": set_name,
        "target": kernels.TARGET,
        "num_sms": kernels.NUM_SMS,
        "runtime": runtime,
        "kernels": records,
        "failed": sorted((r for r in results if "failed" in r), key=position),
        "skipped": sorted((r for r in results if "skipped" in r), key=position),
        "build_seconds": round(time.perf_counter() - started, 1),
        "jobs": jobs,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    manifest["bytes"] = _size(out)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def copy_runner(out: Path) -> None:
    """The runner and the staged command into the pack's folder."""
    for name in RUNNER_FILES:
        shutil.copy2(HERE / name, out / name)
    shutil.copytree(
        HERE / RUNNER_PACKAGE,
        out / RUNNER_PACKAGE,
        ignore=shutil.ignore_patterns("__pycache__"),
        dirs_exist_ok=True,
    )


def check_archive(path: Path, shape_set: str) -> int:
    """The archive's size; raises :class:`PackSizeError` when it is over the set's limit or
    holds a wheel."""
    limit = MAX_BYTES.get(shape_set, MAX_BYTES["custom"])
    with tarfile.open(path) as tar:
        wheels = [m.name for m in tar.getmembers() if m.name.endswith(".whl")]
    if wheels:
        raise PackSizeError(f"{path} holds wheels ({wheels[:3]}): keep --wheels outside the pack")
    size = path.stat().st_size
    if size > limit:
        raise PackSizeError(
            f"{path} is {size / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB limit of the "
            f"{shape_set!r} pack; build fewer shapes (--shapes tiny) or leave kernels out"
        )
    return size


def archive(out: Path) -> Path:
    """``OUT.tar.gz`` of the pack's folder, what travels to the GPU machine (the exported
    libraries are mostly zeros and CUDA text: about an eighth of their size compressed)."""
    path = out.parent / f"{out.name}.tar.gz"
    with tarfile.open(path, "w:gz", compresslevel=9) as tar:
        tar.add(out, arcname=out.name)
    return path


def main(argv=None) -> int:
    from bench.gpu import shapes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", choices=sorted(shapes.SETS), default="tiny")
    parser.add_argument("--out", type=Path, required=True, help="the pack's folder (emptied)")
    parser.add_argument(
        "--python",
        default="3.12",
        help="Python of the machine that runs the pack (wheels from pip's index), or 'local' "
        "for this interpreter's installed tvm/tvm_ffi (default 3.12, the GPU machine's)",
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        help="where the wheels are, or are downloaded to (default: ~/.cache/tvm-streamk/wheels; "
        "never inside the pack)",
    )
    parser.add_argument("--jobs", type=int, help="build processes (default: all CPUs)")
    args = parser.parse_args(argv)
    manifest = build_pack(args.out, args.shapes, args.python, args.wheels, args.jobs)
    packed = archive(args.out)
    try:
        size = check_archive(packed, args.shapes)
    except PackSizeError as err:
        print(err)
        return 1
    print(
        f"pack {args.out}: {len(manifest['kernels'])} kernels, {len(manifest['failed'])} failed, "
        f"{len(manifest['skipped'])} skipped, {manifest['bytes'] / 2**20:.1f} MiB "
        f"({packed}: {size / 2**20:.1f} MiB), built in {manifest['build_seconds']:.0f}s"
    )
    if manifest["failed"]:
        print(
            "failed:",
            *(f"  {f['failed']}: {f['error'][:300]}" for f in manifest["failed"]),
            sep="\n",
        )
    return 1 if manifest["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

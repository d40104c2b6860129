"""``PoclRunner``: measure MetaSchedule candidates on the PoCL CPU device, for real."""

from __future__ import annotations

import subprocess

import numpy as np
from tvm.ir.utils import derived_object
from tvm.support.popen_pool import PopenPoolExecutor

from .._compat import meta_schedule
from .builder import ir_path

# Relative error (max |out - ref| / max |ref|) a Stream-K kernel may show against its
# data-parallel twin: only the order of the K-sum differs, so fp32 stays near its epsilon.
CHECK_TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


class MismatchError(ValueError):
    """A Stream-K kernel's output differs from its data-parallel twin's on the same inputs."""


def random_arguments(args_info, rng: np.random.Generator) -> list[np.ndarray]:
    """Fresh random arrays for ``args_info`` (MetaSchedule's ``TensorInfo`` JSON objects).

    Floats are uniform in [-1, 1), integers in [-4, 4]: values whose products and sums stay
    exact or well-conditioned for every reduction length a GEMM candidate may have.

    Examples
    --------
    >>> [a.shape for a in random_arguments([("TENSOR", "float32", [4, 8])], rng)]
    [(4, 8)]
    """
    arrays = []
    for kind, dtype, shape in args_info:
        if kind != "TENSOR":
            raise TypeError(f"PoclRunner measures tensor arguments only; found a {kind} argument")
        shape = tuple(int(s) for s in shape)
        if dtype.startswith(("int", "uint")):
            arrays.append(rng.integers(-4, 5, size=shape).astype(dtype))
        elif dtype == "bfloat16":
            import ml_dtypes

            arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(ml_dtypes.bfloat16))
        else:
            arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))
    return arrays


def _check_against_twin(kernel, mod, arrays) -> None:
    """Raise :class:`MismatchError` unless ``kernel`` computes what its data-parallel twin does."""
    from tvm_streamk import pocl

    from .annotate import without_stream_k

    twin = pocl.compile(without_stream_k(mod))
    for n, (got, want) in enumerate(zip(kernel.run(*arrays), twin.run(*arrays))):
        dtype = str(want.dtype)
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        scale = max(float(np.max(np.abs(want), initial=0.0)), np.finfo(np.float64).tiny)
        err = float(np.max(np.abs(got - want), initial=0.0)) / scale
        if not np.all(np.isfinite(got)) or err > CHECK_TOLERANCE.get(dtype, 0.0):
            raise MismatchError(
                f"argument {n} ({dtype}) differs from the data-parallel kernel's by relative "
                f"error {err:.3g} (allowed {CHECK_TOLERANCE.get(dtype, 0.0):g}); the Stream-K "
                "kernel is wrong for this schedule"
            )


def measure(
    artifact_path: str, args_info, repeat: int, number: int, warmup: int, check: bool
) -> list[float]:
    """Seconds of ``repeat`` samples, each the median of ``number`` calls, of one candidate.

    Runs in the runner's worker process: loads the IRModule the builder saved beside the
    artifact, builds it for OpenCL through the ``tvm_streamk`` pipeline with
    :func:`tvm_streamk.pocl.compile`, and times its kernels with PoCL's profiling events on fresh
    random inputs (:func:`random_arguments`). With ``check``, a Stream-K candidate is first run
    once and compared with its data-parallel twin on the same inputs.
    """
    import tvm

    from tvm_streamk import pocl
    from tvm_streamk.pipeline import NAME

    from ..lowered_view import has_stream_k

    with open(ir_path(artifact_path)) as f:
        mod = tvm.ir.load_json(f.read())
    kernel = pocl.compile(mod, pipeline=NAME)
    arrays = random_arguments(args_info, np.random.default_rng())
    if check and has_stream_k(mod):
        _check_against_twin(kernel, mod, arrays)
    return [kernel.time(*arrays, repeat=number, warmup=warmup) for _ in range(repeat)]


@derived_object
class PoclRunner(meta_schedule.runner.PyRunner):
    """Measure candidates on the PoCL CPU device in a worker process, with a timeout.

    Candidates must be built by :func:`~tvm_streamk.meta_schedule.stream_k_builder`, which
    saves each candidate's scheduled IRModule beside its artifact; the worker rebuilds it for
    OpenCL (PoCL cannot load TVM's exported OpenCL module) and times it with
    :meth:`tvm_streamk.pocl.CompiledKernel.time`. PoCL runs work-groups concurrently, so the
    times include the real contention of a persistent grid. A failure to build or run, a
    Stream-K result that disagrees with the data-parallel kernel, a crash, or a run longer than
    ``timeout_sec`` is reported as a ``RunnerResult`` error, never as a time; the worker is
    restarted after a crash or a timeout.

    Parameters
    ----------
    timeout_sec : float
        Seconds one candidate may take, build for PoCL and check included.
    repeat : int
        Time samples per candidate (``RunnerResult.run_secs``).
    number : int
        Calls per sample; a sample is their median.
    warmup : int
        Untimed calls before each sample.
    check : bool
        Compare each Stream-K candidate's outputs with its data-parallel twin's before timing.

    Examples
    --------
    >>> runner = PoclRunner(repeat=3)
    >>> futures = runner.run([ms.runner.RunnerInput(path, "opencl", args_info)])
    >>> futures[0].result().run_secs
    [T.float32(0.0012...), ...]
    """

    def __init__(
        self,
        timeout_sec: float = 60.0,
        repeat: int = 3,
        number: int = 3,
        warmup: int = 1,
        check: bool = True,
    ) -> None:
        super().__init__()
        if repeat < 1 or number < 1 or warmup < 0:
            raise ValueError(
                f"PoclRunner needs repeat >= 1, number >= 1, warmup >= 0; found repeat={repeat}, "
                f"number={number}, warmup={warmup}"
            )
        self.timeout_sec = timeout_sec
        self.repeat = repeat
        self.number = number
        self.warmup = warmup
        self.check = check
        # One worker: candidates must not compete for the CPU cores PoCL runs them on. Its
        # stderr is dropped as LocalRunner's is: errors come back as exceptions.
        self.pool = PopenPoolExecutor(max_workers=1, timeout=timeout_sec, stderr=subprocess.DEVNULL)

    def run(self, runner_inputs):
        futures = []
        for runner_input in runner_inputs:
            future = self.pool.submit(
                measure,
                str(runner_input.artifact_path),
                tuple(arg.as_json() for arg in runner_input.args_info),
                self.repeat,
                self.number,
                self.warmup,
                self.check,
            )
            secs, error = None, None
            try:
                secs = future.result()
            except TimeoutError:
                error = f"PoclRunner: timeout, killed after {self.timeout_sec} seconds"
            except ChildProcessError:
                error = "PoclRunner: the measuring process died (a crash in the kernel or PoCL)"
            except Exception as err:  # noqa: BLE001 - reported to MetaSchedule as the error
                error = f"PoclRunner: {type(err).__name__}: {err}"
            futures.append(meta_schedule.runner.LocalRunnerFuture(res=secs, error_message=error))
        return futures

"""Compiling lowered kernels with pyopencl and running them on the PoCL CPU device."""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import device
from .errors import KernelBuildError, PoclError
from .kernel_cache import KernelCache
from .launch import BufferArg, LaunchPlan, ScalarArg, WorkspaceArg, extract_launches
from .lowering import Lowered, lower, select_primfunc
from .signature import Param, check_arguments, signature

# Workspaces start as all-ones bytes (NaN for floats, -1 for integers), as a GPU allocation would
# start with garbage: a kernel that reads a workspace before writing it shows up in the results.
_POISON = np.uint8(0xFF)


@dataclass(frozen=True)
class _DeviceBuffers:
    """One call's OpenCL buffers: per parameter (``None`` for scalars) and per workspace."""

    params: list
    workspaces: list


class CompiledKernel:
    """A PrimFunc lowered for OpenCL and compiled by PoCL, ready to run many times.

    Attributes
    ----------
    name : str
        The PrimFunc's name.
    params : tuple[Param, ...]
        Its signature; :meth:`run` takes one argument per entry.
    source : str
        The OpenCL C source that was compiled.
    launches : tuple[Launch, ...]
        The kernel launches one call makes, in order: kernel name, arguments, grid and block.
    workspaces : tuple[Workspace, ...]
        Global buffers the host function allocates between launches.
    """

    def __init__(self, lowered: Lowered, params: tuple[Param, ...], plan: LaunchPlan):
        import pyopencl as cl

        # The kernel stays on the executor it was built for, whatever is current later.
        self.executor = device.current()
        context = self.executor.context
        self.name = lowered.name
        self.params = params
        self.source = lowered.source
        self.launches = plan.launches
        self.workspaces = plan.workspaces
        self._plan = plan
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", cl.CompilerWarning)
                program = cl.Program(context, self.source).build(
                    options=list(self.executor.build_options)
                )
        except cl.Error as err:
            raise KernelBuildError(
                f"PoCL could not compile the OpenCL generated for {self.name!r}: {err}"
            ) from err
        self.build_log = "\n".join(str(w.message) for w in caught)
        self._kernels = {k.function_name: k for k in program.all_kernels()}
        self._program = program

    def __repr__(self) -> str:
        launches = "; ".join(str(launch) for launch in self.launches)
        return f"CompiledKernel({self.name} on {self.executor.key}: {launches})"

    @property
    def _queue(self):
        return self.executor.queue

    @property
    def outputs(self) -> tuple[int, ...]:
        """Indices of the parameters some launch may write."""
        return tuple(
            sorted(
                {
                    arg.param
                    for launch in self.launches
                    for arg in launch.args
                    if isinstance(arg, BufferArg) and arg.written
                }
            )
        )

    def run(self, *arrays) -> list[np.ndarray]:
        """Run every launch once on fresh copies of ``arrays``; return all arguments after it.

        Buffers come back as new numpy arrays (the inputs are not modified), scalars as 0-d
        arrays, in the order of the signature.

        Raises
        ------
        ArgumentError
            If ``arrays`` do not match :attr:`params`.
        """
        return self.run_repeated(*arrays, launches=1)[0]

    def run_repeated(
        self, *arrays, launches: int, poison_outputs: bool = False
    ) -> list[list[np.ndarray]]:
        """Call the function ``launches`` times on one set of device buffers.

        Workspaces are allocated and poisoned once, before the first call, so a kernel that must
        leave its workspace reusable (semaphores reset, for instance) is held to it. Parameters
        carry over from call to call; with ``poison_outputs`` every parameter a launch may write
        (:attr:`outputs`) is refilled with all-ones bytes (NaN / -1) before each call, so no call
        can pass on its predecessor's results.

        Returns
        -------
        list[list[np.ndarray]]
            For each call, all arguments after it, as :meth:`run` returns them.
        """
        import pyopencl as cl

        if launches < 1:
            raise ValueError(f"launches must be at least 1; found {launches}")
        values = check_arguments(self.name, self.params, arrays)
        buffers, resolved = self._prepare(values)
        q = self._queue
        results = []
        for _ in range(launches):
            if poison_outputs:
                for index in self.outputs:
                    self._poison(buffers.params[index], values[index].nbytes)
            for launch in resolved:
                self._enqueue(launch, buffers)
            call = []
            for param, value, buf in zip(self.params, values, buffers.params):
                if not param.is_buffer:
                    call.append(value)
                    continue
                out = np.empty(value.shape, value.dtype)
                if out.nbytes:
                    cl.enqueue_copy(q, out, buf)
                call.append(out)
            results.append(call)
        q.finish()
        return results

    def time(self, *arrays, repeat: int = 10, warmup: int = 1) -> float:
        """Median seconds of one call's kernels (the sum of its launches), over ``repeat`` calls.

        Inputs are copied to the device once; transfers are not timed. Outputs are discarded.
        """
        if repeat < 1:
            raise ValueError(f"repeat must be at least 1; found {repeat}")
        values = check_arguments(self.name, self.params, arrays)
        buffers, launches = self._prepare(values)
        samples = []
        for i in range(warmup + repeat):
            events = [self._enqueue(launch, buffers) for launch in launches]
            self._queue.finish()
            if i >= warmup:
                spans = [e.profile.end - e.profile.start for e in events if e is not None]
                samples.append(sum(spans) * 1e-9)
        return statistics.median(samples)

    def plan_call(self, *arrays) -> tuple[list, list[int]]:
        """The launches and workspace byte sizes a call with ``arrays`` makes, without running
        it: its host checks run (a run-time size beyond what a kernel's index arithmetic holds
        raises as the compiled host function does), no buffer is allocated, and ``arrays`` may
        be broadcast views of any size.

        Raises
        ------
        ArgumentError
            If ``arrays`` do not match :attr:`params`.
        """
        return self._plan.resolve(check_arguments(self.name, self.params, arrays))

    def _prepare(self, values: Sequence):
        import pyopencl as cl

        ctx = self.executor.context
        mf = cl.mem_flags
        launches, ws_sizes = self._plan.resolve(values)
        params = []
        for param, value in zip(self.params, values):
            if not param.is_buffer:
                params.append(None)
            elif value.nbytes:
                host = np.ascontiguousarray(value)
                params.append(cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host))
            else:
                params.append(cl.Buffer(ctx, mf.READ_WRITE, 1))
        workspaces = []
        for size in ws_sizes:
            buf = cl.Buffer(ctx, mf.READ_WRITE, max(size, 1))
            # Oclgrind keeps a never-written buffer uninitialised and reports any read of it
            # before a write: a stricter poison than bytes (its fill would also race with the
            # shadow state of later kernels).
            if not self.executor.is_simulator:
                self._poison(buf, max(size, 1))
            workspaces.append(buf)
        return _DeviceBuffers(params, workspaces), launches

    def _poison(self, buf, size: int) -> None:
        """Fill ``size`` bytes of ``buf`` with all-ones bytes."""
        import pyopencl as cl

        if not size:
            return
        if self.executor.is_simulator:
            # Oclgrind's uninitialised-value shadow misses kernel stores after a fill command.
            cl.enqueue_copy(self._queue, buf, np.full(size, _POISON, np.uint8))
        else:
            cl.enqueue_fill_buffer(self._queue, buf, _POISON, 0, size)

    def _enqueue(self, launch, buffers):
        """Enqueue one resolved launch; return its event (``None`` for an empty grid)."""
        import pyopencl as cl

        if not launch.enabled or 0 in launch.grid or 0 in launch.block:
            return None
        args = []
        for arg in launch.args:
            if isinstance(arg, BufferArg):
                args.append(buffers.params[arg.param])
            elif isinstance(arg, WorkspaceArg):
                args.append(buffers.workspaces[arg.workspace])
            else:
                assert isinstance(arg, ScalarArg)
                args.append(np.dtype(arg.dtype).type(arg.value))
        kernel = self._kernels[launch.kernel]
        global_size = tuple(g * b for g, b in zip(launch.grid, launch.block))
        try:
            kernel.set_args(*args)
            return cl.enqueue_nd_range_kernel(self._queue, kernel, global_size, launch.block)
        except cl.Error as err:
            raise PoclError(
                f"launching {launch.kernel} with grid {launch.grid} and block {launch.block} "
                f"failed: {err}"
            ) from err


def compile(mod, pipeline: str = "default", *, func_name: str | None = None) -> CompiledKernel:  # noqa: A001
    """Lower ``mod`` for OpenCL through the TIR pipeline ``pipeline`` and compile it with PoCL.

    Parameters
    ----------
    mod : PrimFunc, IRModule or Schedule
        A GPU-scheduled PrimFunc (blockIdx/threadIdx bound), or a module holding one public
        PrimFunc (``func_name`` picks among several).
    pipeline : str
        A name known to ``tvm.tirx.get_tir_pipeline``; ``"default"`` is ``"s_tir"``.

    Raises
    ------
    UnsupportedKernelError
        Before compiling, for tensor-core intrinsics, warp-fragment buffers, CUDA-only device
        functions, dynamic shared memory, and host code that is more than a launch sequence.
    KernelBuildError
        When TVM or PoCL fail to build the kernel.
    """
    name, func = select_primfunc(mod, func_name)
    params = signature(func, name)
    lowered = lower(name, func, pipeline)
    plan = extract_launches(lowered.host_func, lowered.device_funcs, params, name)
    return CompiledKernel(lowered, params, plan)


_cache = KernelCache(lambda *a, **k: compile(*a, **k), key=lambda: (device.current().key,))


def run(mod, *arrays, pipeline: str = "default", func_name: str | None = None) -> list:
    """Build ``mod`` for PoCL (cached) and run it once; see :meth:`CompiledKernel.run`."""
    return _cache.get(mod, pipeline, func_name).run(*arrays)


def time(  # noqa: A001
    mod,
    *arrays,
    pipeline: str = "default",
    func_name: str | None = None,
    repeat: int = 10,
    warmup: int = 1,
) -> float:
    """Median kernel seconds of ``mod`` on PoCL (cached build); see :meth:`CompiledKernel.time`."""
    return _cache.get(mod, pipeline, func_name).time(*arrays, repeat=repeat, warmup=warmup)

"""Running lowered WGSL kernels through ``wgpu`` with the host function's launch sequence.

One call of a PrimFunc is one command submission: a compute pass per launch, in the order the
host function launches them, each with its own ``PODArgs`` uniform. WebGPU orders a dispatch's
storage writes before the next dispatch's reads (a usage-scope boundary), which is what the
separate fix-up's second kernel relies on; nothing orders two workgroups of one dispatch.
"""

from __future__ import annotations

import statistics
import time as _time
from collections.abc import Sequence

import numpy as np

from ..pocl.kernel_cache import KernelCache
from ..pocl.launch import BufferArg, LaunchPlan, ScalarArg, WorkspaceArg, extract_launches
from ..pocl.signature import Param, check_arguments, signature
from . import device
from .errors import ShaderBuildError, WebGPUError
from .lowering import POD_DTYPES, Lowered, lower, select_primfunc

# Workspaces and poisoned outputs start as all-ones bytes (NaN for floats, -1 for integers).
_POISON = 0xFF


def _padded(nbytes: int) -> int:
    """Storage buffer sizes are multiples of 4 bytes in WebGPU (and never 0)."""
    return max(4, (nbytes + 3) // 4 * 4)


class CompiledShader:
    """A PrimFunc lowered to WGSL and compiled by the adapter, ready to run many times.

    Attributes
    ----------
    name : str
        The PrimFunc's name.
    params : tuple[Param, ...]
        Its signature; :meth:`run` takes one argument per entry.
    sources : dict[str, str]
        The WGSL of each kernel, by name.
    launches, workspaces
        As :class:`tvm_streamk.pocl.CompiledKernel`'s.
    """

    def __init__(self, lowered: Lowered, params: tuple[Param, ...], plan: LaunchPlan):
        import wgpu

        self.adapter = device.current()
        self.name = lowered.name
        self.params = params
        self.sources = {name: k.source for name, k in lowered.kernels.items()}
        self.launches = plan.launches
        self.workspaces = plan.workspaces
        self._plan = plan
        self._lowered = lowered
        self._pipelines = {}
        gpu = self.adapter.device
        for name, kernel in lowered.kernels.items():
            if kernel.uses_f16 and "shader-f16" not in self.adapter.features:
                raise ShaderBuildError(
                    f"kernel {name!r} uses f16, and the adapter {self.adapter.describe()} has no "
                    "'shader-f16' feature; compute in float32, or run on an adapter with it"
                )
            storage = wgpu.BufferBindingType.storage
            entries = [
                {
                    "binding": i,
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": storage if w else wgpu.BufferBindingType.read_only_storage},
                }
                for i, w in enumerate(kernel.writable)
            ]
            entries.append(
                {
                    "binding": len(kernel.writable),
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": wgpu.BufferBindingType.uniform},
                }
            )
            try:
                layout = gpu.create_bind_group_layout(entries=entries)
                module = gpu.create_shader_module(code=kernel.source)
                pipeline = gpu.create_compute_pipeline(
                    layout=gpu.create_pipeline_layout(bind_group_layouts=[layout]),
                    compute={"module": module, "entry_point": name},
                )
            except Exception as err:  # noqa: BLE001 - naga and wgpu-core report variously
                raise ShaderBuildError(
                    f"the adapter could not compile the WGSL TVM generated for {name!r}: {err}"
                ) from err
            self._pipelines[name] = (pipeline, layout)

    def __repr__(self) -> str:
        launches = "; ".join(str(launch) for launch in self.launches)
        return f"CompiledShader({self.name} on WebGPU {self.adapter.describe()}: {launches})"

    @property
    def source(self) -> str:
        """Every kernel's WGSL, one after the other."""
        return "\n".join(f"// kernel {n}\n{s}" for n, s in self.sources.items())

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
        """Run every launch once on fresh copies of ``arrays``; return all arguments after it
        (buffers as new numpy arrays, scalars as 0-d arrays, in the signature's order)."""
        return self.run_repeated(*arrays, launches=1)[0]

    def run_repeated(
        self, *arrays, launches: int, poison_outputs: bool = False
    ) -> list[list[np.ndarray]]:
        """Call the function ``launches`` times on one set of device buffers, as
        :meth:`tvm_streamk.pocl.CompiledKernel.run_repeated` does (workspaces poisoned once;
        with ``poison_outputs`` every written parameter refilled with all-ones bytes before
        each call)."""
        if launches < 1:
            raise ValueError(f"launches must be at least 1; found {launches}")
        values = check_arguments(self.name, self.params, arrays)
        buffers, workspaces, resolved = self._prepare(values)
        queue = self.adapter.device.queue
        results = []
        for _ in range(launches):
            if poison_outputs:
                for index in self.outputs:
                    self._poison(buffers[index], values[index].nbytes)
            self._submit(resolved, buffers, workspaces)
            call = []
            for param, value, buf in zip(self.params, values, buffers):
                if not param.is_buffer:
                    call.append(value)
                    continue
                raw = queue.read_buffer(buf)[: value.nbytes] if value.nbytes else b""
                call.append(np.frombuffer(bytes(raw), value.dtype).reshape(value.shape).copy())
            results.append(call)
        return results

    def time(self, *arrays, repeat: int = 10, warmup: int = 1) -> float:
        """Median wall seconds of one call's submission until the queue is idle (waited for by
        reading back 4 bytes: wgpu 0.32's ``on_submitted_work_done_sync`` fails)."""
        if repeat < 1:
            raise ValueError(f"repeat must be at least 1; found {repeat}")
        values = check_arguments(self.name, self.params, arrays)
        buffers, workspaces, resolved = self._prepare(values)
        queue = self.adapter.device.queue
        fence = self._buffer(4)
        samples = []
        for i in range(warmup + repeat):
            start = _time.perf_counter()
            self._submit(resolved, buffers, workspaces)
            queue.read_buffer(fence)
            if i >= warmup:
                samples.append(_time.perf_counter() - start)
        return statistics.median(samples)

    def plan_call(self, *arrays) -> tuple[list, list[int]]:
        """The launches and workspace byte sizes a call with ``arrays`` makes, without running."""
        return self._plan.resolve(check_arguments(self.name, self.params, arrays))

    def _buffer(self, nbytes: int):
        import wgpu

        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        return self.adapter.device.create_buffer(size=_padded(nbytes), usage=usage)

    def _poison(self, buf, nbytes: int) -> None:
        if nbytes:
            self.adapter.device.queue.write_buffer(buf, 0, bytes([_POISON]) * _padded(nbytes))

    def _prepare(self, values: Sequence):
        resolved, ws_sizes = self._plan.resolve(values)
        queue = self.adapter.device.queue
        buffers = []
        for param, value in zip(self.params, values):
            if not param.is_buffer:
                buffers.append(None)
                continue
            buf = self._buffer(value.nbytes)
            if value.nbytes:
                data = np.ascontiguousarray(value).tobytes()
                queue.write_buffer(buf, 0, data + bytes(_padded(len(data)) - len(data)))
            buffers.append(buf)
        workspaces = []
        for size in ws_sizes:
            buf = self._buffer(size)
            self._poison(buf, size)
            workspaces.append(buf)
        return buffers, workspaces, resolved

    def _submit(self, resolved, buffers, workspaces) -> None:
        import wgpu

        gpu = self.adapter.device
        encoder = gpu.create_command_encoder()
        for launch in resolved:
            if not launch.enabled or 0 in launch.grid or 0 in launch.block:
                continue
            pipeline, layout = self._pipelines[launch.kernel]
            entries, pods = [], []
            for arg in launch.args:
                if isinstance(arg, BufferArg):
                    entries.append(buffers[arg.param])
                elif isinstance(arg, WorkspaceArg):
                    entries.append(workspaces[arg.workspace])
                else:
                    assert isinstance(arg, ScalarArg)
                    pods.append(_pod(launch.kernel, arg))
            dispatch, pack_x = self._dispatch(launch)
            pods.append(np.uint32(pack_x).tobytes())
            uniform_bytes = b"".join(pods)
            uniform_bytes += bytes(-len(uniform_bytes) % 16)
            uniform = gpu.create_buffer_with_data(
                data=uniform_bytes, usage=wgpu.BufferUsage.UNIFORM
            )
            group = gpu.create_bind_group(
                layout=layout,
                entries=[
                    {"binding": i, "resource": {"buffer": b}}
                    for i, b in enumerate([*entries, uniform])
                ],
            )
            compute = encoder.begin_compute_pass()
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*dispatch)
            compute.end()
        gpu.queue.submit([encoder.finish()])

    def _dispatch(self, launch) -> tuple[tuple[int, int, int], int]:
        """The workgroup counts of ``launch`` and its ``packGridDimX``, as TVM's runtime folds
        a grid wider than a dimension allows into ``blockIdx.z``."""
        gx, gy, gz = launch.grid
        limit = int(self.adapter.device.limits["max-compute-workgroups-per-dimension"])
        if gz != 1:
            raise WebGPUError(
                f"{launch.kernel} launches {gz} blocks along blockIdx.z, which TVM's WebGPU "
                "runtime reserves for folding wide grids; bind blockIdx.x/y only"
            )
        if gy > limit:
            raise WebGPUError(
                f"{launch.kernel} launches {gy} blocks along blockIdx.y, past the adapter's "
                f"{limit} per dimension; fuse the grid onto blockIdx.x"
            )
        x, z = gx, 1
        while x > limit:
            if x % 2:
                # TVM's WGSL returns early only past packGridDimX (``>``), so a padded fold would
                # run one block past the grid; refuse rather than run it.
                raise WebGPUError(
                    f"{launch.kernel} launches {gx} blocks along blockIdx.x: TVM's runtime folds "
                    f"it past {limit} by halving with padding, and its WGSL then runs block {gx}"
                    " (its bound check is `>`, not `>=`); launch an even or smaller grid"
                )
            x, z = x // 2, z * 2
        return (x, gy, z), gx


# The numpy type of each WGSL scalar of the PODArgs uniform.
_WGSL_SCALARS = {"i32": "int32", "u32": "uint32", "f32": "float32"}


def _pod(kernel: str, arg: ScalarArg) -> bytes:
    """The 4 bytes of scalar ``arg`` in the PODArgs uniform. An int64 goes as the i32 TVM's
    WGSL declares for it (:data:`.lowering.POD_DTYPES`), where its value fits."""
    dtype = _WGSL_SCALARS[POD_DTYPES[arg.dtype]]
    if dtype != arg.dtype and not np.iinfo(dtype).min <= int(arg.value) <= np.iinfo(dtype).max:
        raise WebGPUError(
            f"{kernel} takes {arg.name} = {int(arg.value)}, which the {dtype} TVM's WGSL gives "
            f"that {arg.dtype} scalar cannot hold (WGSL has no 64-bit integers). Run it at a "
            "smaller size."
        )
    return np.array(arg.value, dtype=dtype).tobytes()


def compile(mod, pipeline: str = "default", *, func_name: str | None = None) -> CompiledShader:  # noqa: A001
    """Lower ``mod`` to WGSL through the TIR pipeline ``pipeline`` and compile it on the adapter.

    Parameters
    ----------
    mod : PrimFunc, IRModule or Schedule
        A GPU-scheduled PrimFunc (blockIdx/threadIdx bound), or a module holding one public
        PrimFunc (``func_name`` picks among several).
    pipeline : str
        A name known to ``tvm.tirx.get_tir_pipeline``; ``"tvm_streamk"`` rewrites Stream-K
        decisions (for WebGPU: the separate fix-up).

    Raises
    ------
    WebGPUUnavailableError
        No usable adapter (the probe's findings and the remedy).
    ShaderBuildError
        When TVM or the adapter fail to build a kernel.
    """
    device.current()
    name, func = select_primfunc(mod, func_name)
    params = signature(func, name)
    lowered = lower(name, func, pipeline)
    plan = extract_launches(lowered.host_func, lowered.device_funcs, params, name)
    return CompiledShader(lowered, params, plan)


_cache = KernelCache(lambda *a, **k: compile(*a, **k))


def run(mod, *arrays, pipeline: str = "tvm_streamk", func_name: str | None = None) -> list:
    """Build ``mod`` for WebGPU (cached) and run it once; see :meth:`CompiledShader.run`."""
    return _cache.get(mod, pipeline, func_name).run(*arrays)


def time(  # noqa: A001
    mod,
    *arrays,
    pipeline: str = "tvm_streamk",
    func_name: str | None = None,
    repeat: int = 10,
    warmup: int = 1,
) -> float:
    """Median seconds of one call of ``mod`` on the adapter (cached build)."""
    return _cache.get(mod, pipeline, func_name).time(*arrays, repeat=repeat, warmup=warmup)


__all__ = ["CompiledShader", "compile", "run", "time"]

"""The WebGPU adapter kernels run on, through the ``wgpu`` package (wgpu-native), probed once.

``wgpu`` opens the first adapter its backends find (Vulkan on Linux; Metal on macOS; D3D12 on
Windows). On a machine with no GPU, Mesa's lavapipe (``mesa-vulkan-drivers``, a CPU Vulkan) is
that adapter: it runs every workgroup of a dispatch on a pool of CPU threads, so races between
workgroups are as real as between PoCL's work-groups. The adapter is *probed* the first time it
is asked for: a trivial shader is dispatched and read back, and the adapter is usable only if
that works. A failure names what is missing and the remedy (``bash scripts/install-webgpu``, or
``pip install wgpu``).

The device is created with every feature the kernels may need and the adapter has
(``shader-f16`` for half-precision storage). WebGPU does not tell how many compute units an
adapter has; :func:`compute_units` knows lavapipe's (one thread per CPU core, Mesa's
``LP_NUM_THREADS`` overriding it) and asks for ``num_sms`` on any other adapter.

The Vulkan loader warns on stderr when ``XDG_RUNTIME_DIR`` is unset (compute needs no display);
this module points it at a private temporary folder first, when it is unset.
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass

import numpy as np

from .errors import WebGPUUnavailableError

# Features requested when the adapter has them: what TVM's WGSL may enable.
OPTIONAL_FEATURES = ("shader-f16",)
_INSTALL = (
    "Install them with `bash scripts/install-webgpu` (Debian's mesa-vulkan-drivers, the lavapipe "
    "CPU Vulkan, needs root) and `pip install wgpu` (or `pip install -e '.[webgpu]'`)."
)
# Mesa's llvmpipe caps its rasterizer/compute threads at LP_MAX_THREADS (32 in Mesa 22.3).
_LAVAPIPE_MAX_THREADS = 32

_PROBE = """
@group(0) @binding(0) var<storage, read_write> x : array<i32>;
@compute @workgroup_size(4, 1, 1)
fn tvm_streamk_probe(@builtin(global_invocation_id) i : vec3<u32>) {
  x[i.x] = x[i.x] * 2 + i32(i.x % 4u);
}
"""


@dataclass(frozen=True)
class Adapter:
    """The probed adapter and the device opened on it."""

    adapter: object
    device: object
    info: dict
    features: frozenset

    @property
    def is_lavapipe(self) -> bool:
        return "llvmpipe" in str(self.info.get("device", "")) or "llvmpipe" in str(
            self.info.get("vendor", "")
        )

    def describe(self) -> str:
        info = self.info
        return (
            f"{info.get('device', '?')} ({info.get('adapter_type', '?')}, "
            f"{info.get('backend_type', '?')}; {info.get('description', '')})"
        )


def _quiet_loader() -> None:
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tvm-streamk-xdg-")


@functools.lru_cache(maxsize=1)
def _probe() -> Adapter | str:
    """The usable adapter, or why there is none (cached: the probe runs once per process)."""
    try:
        import wgpu
    except ImportError as err:
        return f"the Python package wgpu is not installed ({err})"
    _quiet_loader()
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as err:  # noqa: BLE001 - wgpu-native reports a missing driver variously
        return f"wgpu found no adapter ({type(err).__name__}: {err})"
    if adapter is None:
        return "wgpu found no adapter (no Vulkan, Metal or D3D12 driver)"
    features = frozenset(f for f in OPTIONAL_FEATURES if f in adapter.features)
    try:
        device = adapter.request_device_sync(required_features=sorted(features))
        data = np.arange(8, dtype=np.int32)
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
        buf = device.create_buffer_with_data(data=data, usage=usage)
        module = device.create_shader_module(code=_PROBE)
        pipeline = device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "tvm_streamk_probe"}
        )
        group = device.create_bind_group(
            layout=pipeline.get_bind_group_layout(0),
            entries=[{"binding": 0, "resource": {"buffer": buf}}],
        )
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(2, 1, 1)
        compute.end()
        device.queue.submit([encoder.finish()])
        got = np.frombuffer(device.queue.read_buffer(buf), np.int32)
    except Exception as err:  # noqa: BLE001 - any failure of the probe means no usable adapter
        return f"the adapter {dict(adapter.info).get('device')!r} failed the probe shader: {err}"
    want = data * 2 + np.arange(8) % 4
    if not np.array_equal(got, want):
        return f"the adapter's probe shader computed {got.tolist()}, not {want.tolist()}"
    return Adapter(adapter, device, dict(adapter.info), features)


def current() -> Adapter:
    """The probed adapter.

    Raises
    ------
    WebGPUUnavailableError
        With the probe's findings and the remedy.
    """
    found = _probe()
    if isinstance(found, str):
        raise WebGPUUnavailableError(f"no usable WebGPU adapter: {found}. {_INSTALL}")
    return found


def available() -> bool:
    """Whether a WebGPU adapter passes the probe in this process."""
    return not isinstance(_probe(), str)


def why_unavailable() -> str | None:
    """The probe's findings when no adapter is usable, else None."""
    found = _probe()
    return f"{found}. {_INSTALL}" if isinstance(found, str) else None


def compute_units() -> int:
    """Workgroups the adapter runs at once: the ``num_sms`` of its plans.

    Known for lavapipe only (its thread pool: ``LP_NUM_THREADS`` when set, else the CPU count,
    at most 32); WebGPU exposes no compute-unit count for other adapters.

    Raises
    ------
    WebGPUUnavailableError
        No adapter.
    ValueError
        An adapter whose compute units WebGPU does not tell: pass ``num_sms`` to the plan.
    """
    adapter = current()
    if not adapter.is_lavapipe:
        raise ValueError(
            f"WebGPU does not expose the compute units of {adapter.describe()}; pass num_sms= "
            "(the GPU's compute units, cores or execution-unit clusters, from its vendor) to "
            "stream_k"
        )
    threads = os.environ.get("LP_NUM_THREADS")
    if threads is not None and threads.strip().isdigit():
        return max(1, int(threads))
    return max(1, min(os.cpu_count() or 1, _LAVAPIPE_MAX_THREADS))

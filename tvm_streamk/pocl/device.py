"""The PoCL CPU device, opened once per process.

PoCL's own environment variables (``POCL_MAX_PTHREAD_COUNT``, ``POCL_CACHE_DIR``, ...) are left to
the user: they are read by PoCL when the platform is first enumerated, so set them before the first
call into this module.
"""

from __future__ import annotations

import functools

from .errors import DeviceUnavailableError

# PoCL identifies itself by this platform name; other OpenCL platforms (a GPU driver's ICD) are
# never picked, so results do not depend on what else is installed.
_POCL_PLATFORM = "Portable Computing Language"


@functools.cache
def _open():
    """``(device, context, profiling queue)`` of the first PoCL CPU device, or raise."""
    try:
        import pyopencl as cl
    except ImportError as err:
        raise DeviceUnavailableError(
            f"pyopencl is not importable ({err}); install pyopencl and pocl-binary-distribution"
        ) from err
    try:
        platforms = cl.get_platforms()
    except cl.Error as err:
        raise DeviceUnavailableError(
            f"no OpenCL platform could be enumerated ({err}); install pocl-binary-distribution"
        ) from err
    found = [p.name for p in platforms]
    for platform in platforms:
        if platform.name != _POCL_PLATFORM:
            continue
        cpus = platform.get_devices(device_type=cl.device_type.CPU)
        if cpus:
            context = cl.Context([cpus[0]])
            queue = cl.CommandQueue(
                context, properties=cl.command_queue_properties.PROFILING_ENABLE
            )
            return cpus[0], context, queue
    raise DeviceUnavailableError(
        f"no PoCL CPU device among the OpenCL platforms {found}; "
        "install pocl-binary-distribution next to pyopencl"
    )


def available() -> bool:
    """Whether a PoCL CPU device can be opened in this process."""
    try:
        _open()
    except DeviceUnavailableError:
        return False
    return True


def device():
    """The ``pyopencl.Device`` kernels run on."""
    return _open()[0]


def context():
    """The shared ``pyopencl.Context`` (one per process, so compiled programs can be reused)."""
    return _open()[1]


def queue():
    """The shared in-order, profiling-enabled ``pyopencl.CommandQueue``."""
    return _open()[2]


def compute_units() -> int:
    """Compute units of the PoCL device: the number of work-groups that can run at once."""
    return int(device().max_compute_units)

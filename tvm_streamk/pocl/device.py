"""The OpenCL CPU executors kernels run on: every PoCL found, and Oclgrind, each probed once.

A machine may hold several OpenCL implementations for its CPU (pip's PoCL bundled with pyopencl,
Debian's ``pocl-opencl-icd``, the Oclgrind simulator), and not all of them work on every CPU:
pip's PoCL 3.0-rc2 (LLVM 14) builds no kernel on CPUs newer than LLVM 14 knows (AMD family 26,
Zen 5: ``unknown target CPU 'generic'``). So every implementation is *probed* the first time
this module is asked for a device: a trivial kernel is built and run, and the implementation is
usable only if that works. The first usable PoCL is the default executor; Oclgrind, a
simulator that checks every access (slow), runs only when chosen.

Choosing: the environment variable ``TVM_STREAMK_OPENCL`` names an executor by its key or a
part of it (``pocl-3.1``, ``pocl-3.0``, ``oclgrind``), read at the first call; in code,
``with tvm_streamk.pocl.use("oclgrind"): ...`` switches for the block (the test suite runs its
numeric tests once per usable PoCL this way).

Oclgrind is not registered with the OpenCL ICD loader by Debian's package. When its ICD is
installed and neither ``OCL_ICD_VENDORS`` nor ``OPENCL_VENDOR_PATH`` is set, this module points
``OCL_ICD_VENDORS`` at a folder listing the system's ICDs plus Oclgrind's before the platforms
are first enumerated, so all implementations are visible in one process (pyopencl's own PoCL is
found by its bundled loader either way). It also asks Oclgrind to report uninitialised values
and data races without a cap on their number (its API checker is left off: pyopencl's device
queries trip it). Oclgrind logs to a file of this process's own that :func:`oclgrind_reports`
reads, unless ``OCLGRIND_LOG`` names the user's: two processes running Oclgrind at once must
not share one (:func:`_own_oclgrind_log`). PoCL's own variables (``POCL_MAX_PTHREAD_COUNT``,
...) are left to the user and must be set before the first call.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import platform
import re
import tempfile
import threading
from dataclasses import dataclass, field, replace

import numpy as np

from .errors import DeviceUnavailableError, PoclError

ENV_EXECUTOR = "TVM_STREAMK_OPENCL"
# Implementations for the CPU: PoCL by its platform name, Oclgrind's simulator. Other platforms
# (a GPU driver's ICD) are never picked, so results do not depend on what else is installed.
_POCL_PLATFORM = "Portable Computing Language"
_OCLGRIND_PLATFORM = "Oclgrind"
_OCLGRIND_ICDS = (
    "/usr/lib/oclgrind/liboclgrind-rt-icd.so",
    "/usr/lib/*/oclgrind/liboclgrind-rt-icd.so",
)
_SYSTEM_VENDORS = "/etc/OpenCL/vendors"

_PROBE_SOURCE = """
__kernel void tvm_streamk_probe(__global int* x) {
  int i = get_global_id(0);
  x[i] = x[i] * 2 + (int)get_local_id(0);
}
"""

# PoCL versions whose optimiser miscompiles valid kernels of the Stream-K shape -- a segment
# loop holding barrier regions whose work is guarded by the work-item's coordinates -- and which
# therefore build without it. PoCL 3.1 (Debian 12, LLVM 15): guards in such regions are ignored
# for some work-items (../shared/repros/pocl31_conditional_barrier.py: 66 stores violate the
# guard, none without optimisation), and a workspace fix-up kernel whose barriers all stand in
# unconditional code still loses the accumulation of its predicated edge tiles
# (tests/backends/test_portability.py::test_workspace_fixup_with_predicated_edge_tiles; the canary
# test_pocl31_optimiser_is_off fails once PoCL 3.1 runs the first right optimised); pip's
# PoCL 3.0-rc2 and Oclgrind run both right. pip's PoCL 3.0-rc2 has a fault of the same family
# (an accumulator's zero-fill guarded by the work-item's row in such a loop: zeros for every
# output of a one-panel case on an Intel Xeon; test_portability.py,
# test_one_padded_panel_on_blocks_of_one_or_two_tiles) but keeps its optimiser: it is the
# executor that times kernels (the demo, the hot-loop bounds), and the marked suites run the
# numeric tests on every other usable PoCL and a subset under Oclgrind.
MISCOMPILING_POCL = ("pocl-3.1",)

_REMEDY = (
    "Install an OpenCL CPU implementation that knows this CPU: `bash scripts/install-opencl` "
    "(as root it runs `apt-get install pocl-opencl-icd oclgrind`, Debian's PoCL 3.1 with LLVM 15), "
    "or choose a working one with TVM_STREAMK_OPENCL=<key>."
)


@dataclass(frozen=True)
class Executor:
    """One OpenCL CPU implementation and what its probe found.

    Attributes
    ----------
    key : str
        Short name, ``"<implementation>-<version>"``: ``pocl-3.1+debian``, ``oclgrind-21.10``.
    platform, version, device : str
        The OpenCL platform name, platform version and device name.
    error : str or None
        The first error line of the probe build (or run); None when the implementation works.
    """

    key: str
    platform: str
    version: str
    device: str
    error: str | None = None
    _handles: tuple = field(default=(), repr=False, compare=False)

    @property
    def usable(self) -> bool:
        return self.error is None

    @property
    def is_simulator(self) -> bool:
        return self.platform == _OCLGRIND_PLATFORM

    @property
    def build_options(self) -> tuple[str, ...]:
        """OpenCL compiler options: none for a PoCL whose optimiser runs these kernels right;
        ``-cl-opt-disable`` for Oclgrind (its uninitialised-value checks see through
        unoptimised code only: the optimiser folds undefined values away) and for the PoCL
        versions of :data:`MISCOMPILING_POCL`."""
        if self.is_simulator or self.key.startswith(MISCOMPILING_POCL):
            return ("-cl-opt-disable",)
        return ()

    @property
    def cl_device(self):
        """The ``pyopencl.Device``."""
        return self._handles[0]

    @property
    def context(self):
        """The executor's ``pyopencl.Context`` (one per process, so programs can be reused;
        :func:`with_fresh_context` makes another)."""
        return self._handles[1]

    @property
    def queue(self):
        """The executor's in-order, profiling-enabled ``pyopencl.CommandQueue``."""
        return self._handles[2]

    def describe(self) -> str:
        state = "works" if self.usable else f"fails: {self.error}"
        return f"{self.key} ({self.device}): {state}"


def _oclgrind_icd() -> str | None:
    for pattern in _OCLGRIND_ICDS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def _expose_oclgrind() -> None:
    """Make Oclgrind's ICD visible to the loader (module docstring), where the user has not
    configured the loader."""
    icd = _oclgrind_icd()
    if icd is None or os.environ.get("OCL_ICD_VENDORS") or os.environ.get("OPENCL_VENDOR_PATH"):
        return
    folder = tempfile.mkdtemp(prefix="tvm_streamk_icd_")
    for path in sorted(glob.glob(os.path.join(_SYSTEM_VENDORS, "*.icd"))):
        with open(path) as src, open(os.path.join(folder, os.path.basename(path)), "w") as dst:
            dst.write(src.read())
    with open(os.path.join(folder, "tvm_streamk_oclgrind.icd"), "w") as f:
        f.write(icd + "\n")
    os.environ["OCL_ICD_VENDORS"] = folder
    os.environ.setdefault("OCLGRIND_UNINITIALIZED", "1")
    os.environ.setdefault("OCLGRIND_DATA_RACES", "1")
    # The cap counts over the whole process and would silence reports after the accepted ones.
    os.environ.setdefault("OCLGRIND_MAX_ERRORS", str(2**31 - 1))
    # One simulator thread: with several, two work-groups' reports can interleave in the log
    # (a run-time split-K check once read a report whose first line was "(0,0,0)"), and the
    # suite's two workers keep both cores busy anyway (the same CPU time, measured).
    os.environ.setdefault("OCLGRIND_NUM_THREADS", "1")


# The log this module chose for Oclgrind, so that a process it starts can tell an inherited
# choice (replaced) from the user's own ``OCLGRIND_LOG`` (kept).
_CHOSEN_LOG = "TVM_STREAMK_OCLGRIND_LOG"


def _own_oclgrind_log() -> None:
    """Give this process an Oclgrind log of its own, unless the user named one.

    Oclgrind opens ``OCLGRIND_LOG`` afresh (truncating it) for every context it creates and
    writes at its own file offset. Two processes on one file, such as the test suite's xdist
    workers that inherit the controller's environment, truncate and overwrite each other's
    reports: a check then read another worker's report, or a torn fragment of one (a problem
    with no kind and no source line). The variable is read when a context is created, so it is
    set here, before the probe creates this process's first one.
    """
    chosen = os.environ.get("OCLGRIND_LOG")
    if chosen and chosen != os.environ.get(_CHOSEN_LOG):
        return
    path = os.path.join(tempfile.mkdtemp(prefix="tvm_streamk_oclgrind_"), "oclgrind.log")
    os.environ["OCLGRIND_LOG"] = path
    os.environ[_CHOSEN_LOG] = path


def _key(platform_name: str, version: str) -> str:
    match = re.search(r"(PoCL|Oclgrind)\s+([^\s)]+)", version)
    if match:
        return f"{match.group(1).lower()}-{match.group(2)}"
    return re.sub(r"\W+", "-", f"{platform_name} {version}").strip("-").lower()


def _first_error_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for line in lines:
        if "error" in line.lower():
            return line[:300]
    return (lines[0] if lines else "the probe kernel failed without a message")[:300]


def _probe(cl, dev) -> tuple[str | None, tuple]:
    """``(first error or None, (context, queue))`` of building and running the probe kernel."""
    try:
        context = cl.Context([dev])
        queue = cl.CommandQueue(context, properties=cl.command_queue_properties.PROFILING_ENABLE)
        program = cl.Program(context, _PROBE_SOURCE).build()
        host = np.arange(8, dtype=np.int32)
        buf = cl.Buffer(context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
        program.tvm_streamk_probe(queue, (8,), (4,), buf)
        out = np.empty_like(host)
        cl.enqueue_copy(queue, out, buf)
        queue.finish()
    except cl.Error as err:
        return _first_error_line(str(err)), ()
    expected = np.arange(8, dtype=np.int32) * 2 + np.arange(8, dtype=np.int32) % 4
    if not np.array_equal(out, expected):
        return f"the probe kernel computed {out.tolist()}, expected {expected.tolist()}", ()
    return None, (context, queue)


@functools.cache
def executors() -> tuple[Executor, ...]:
    """Every OpenCL CPU implementation of this process, probed, in the loader's order."""
    _expose_oclgrind()
    _own_oclgrind_log()
    try:
        import pyopencl as cl
    except ImportError as err:
        raise DeviceUnavailableError(
            f"pyopencl is not importable ({err}); `pip install pyopencl pocl-binary-distribution`"
        ) from err
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    found = []
    for plat in platforms:
        if plat.name not in (_POCL_PLATFORM, _OCLGRIND_PLATFORM):
            continue
        kind = cl.device_type.ALL if plat.name == _OCLGRIND_PLATFORM else cl.device_type.CPU
        try:
            devices = plat.get_devices(device_type=kind)
        except cl.Error:
            continue
        for dev in devices:
            error, handles = _probe(cl, dev)
            found.append(
                Executor(
                    _key(plat.name, plat.version),
                    plat.name,
                    plat.version,
                    dev.name,
                    error,
                    (dev, *handles),
                )
            )
    return tuple(found)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _unavailable(found: tuple[Executor, ...], wanted: str | None = None) -> DeviceUnavailableError:
    tried = "; ".join(e.describe() for e in found) or "no PoCL or Oclgrind platform was found"
    asked = f" matching {ENV_EXECUTOR}={wanted!r}" if wanted else ""
    return DeviceUnavailableError(
        f"no usable OpenCL CPU executor{asked} on this CPU ({_cpu_name()}). "
        f"Tried: {tried}. {_REMEDY}"
    )


def find(name: str, source: str = "") -> Executor:
    """The usable executor whose key is or contains ``name`` (first match), else raise.
    ``source`` says where the name came from (the environment variable) in the error."""
    found = executors()
    matches = [e for e in found if e.key == name] or [e for e in found if name.lower() in e.key]
    if not matches:
        keys = [e.key for e in found] or ["none: no PoCL or Oclgrind platform was found"]
        raise DeviceUnavailableError(
            f"{source or ''}{name!r} names no OpenCL CPU executor of this machine; "
            f"expected one of {keys} "
            f"(or a part of one, such as 'pocl-3.1' or 'oclgrind'). Set {ENV_EXECUTOR} to one "
            "of them, or unset it to take the default."
        )
    usable = [e for e in matches if e.usable]
    if not usable:
        raise _unavailable(found, name)
    return usable[0]


_state = threading.local()


def _default() -> Executor:
    wanted = os.environ.get(ENV_EXECUTOR)
    if wanted:
        return find(wanted, source=f"{ENV_EXECUTOR}=")
    usable = usable_executors()
    if not usable:
        raise _unavailable(executors())
    return preferred(usable)


def preferred(usable: tuple[Executor, ...]) -> Executor:
    """The first executor that builds with its optimiser on, else the first: an unoptimised
    build (PoCL 3.1, :data:`MISCOMPILING_POCL`) runs the same kernel up to 9x slower."""
    return min(usable, key=lambda e: bool(e.build_options))


def current() -> Executor:
    """The executor kernels compile and run on in this thread (see the module docstring)."""
    chosen = getattr(_state, "executor", None)
    return chosen if chosen is not None else _default()


@contextlib.contextmanager
def use(executor: Executor | str):
    """Run the kernels compiled inside the ``with`` block on ``executor`` (an Executor or key)."""
    chosen = find(executor) if isinstance(executor, str) else executor
    if not chosen.usable:
        raise _unavailable((chosen,))
    previous = getattr(_state, "executor", None)
    _state.executor = chosen
    try:
        yield chosen
    finally:
        _state.executor = previous


def with_fresh_context(executor: Executor | str) -> Executor:
    """A copy of ``executor`` on a new context and queue of its device.

    Oclgrind keeps its uninitialised-value shadow memory per context and never drops the
    shadow of a released buffer (21.10 has no deallocation hook), while its allocator hands a
    released buffer's index to the next buffer. A buffer the host never writes (a workspace)
    then inherits a stale shadow: a shorter one makes the kernel's own stores past its end
    vanish and their reads count as uninitialised; a longer, clean one hides a real read before
    a write. A check that must see only its own buffers runs on a fresh context.
    """
    import pyopencl as cl

    base = find(executor) if isinstance(executor, str) else executor
    if not base.usable:
        raise _unavailable((base,))
    context = cl.Context([base.cl_device])
    queue = cl.CommandQueue(context, properties=cl.command_queue_properties.PROFILING_ENABLE)
    return replace(base, _handles=(base.cl_device, context, queue))


def usable_executors(simulators: bool = False) -> tuple[Executor, ...]:
    """The executors whose probe passed; Oclgrind only with ``simulators``."""
    return tuple(e for e in executors() if e.usable and (simulators or not e.is_simulator))


def available() -> bool:
    """Whether a usable OpenCL CPU executor exists (the one :func:`current` would give)."""
    try:
        current()
    except DeviceUnavailableError:
        return False
    return True


def device():
    """The ``pyopencl.Device`` of the current executor."""
    return current().cl_device


def context():
    """The current executor's ``pyopencl.Context``."""
    return current().context


def queue():
    """The current executor's ``pyopencl.CommandQueue``."""
    return current().queue


def compute_units() -> int:
    """Compute units of the current executor: the number of work-groups that can run at once."""
    return int(device().max_compute_units)


def _oclgrind_log() -> tuple[str | None, int | None]:
    """``(path, size)`` of Oclgrind's log: either is ``None`` where there is none."""
    path = os.environ.get("OCLGRIND_LOG")
    return path, (os.path.getsize(path) if path and os.path.exists(path) else None)


def oclgrind_log_offset() -> int:
    """Where Oclgrind's log ends now; pass it to :func:`oclgrind_reports` after a run."""
    return _oclgrind_log()[1] or 0


def oclgrind_reports(since: int) -> str:
    """What Oclgrind logged after offset ``since`` (its diagnostics of the kernels run since).

    Raises
    ------
    PoclError
        When the log cannot hold those reports: no ``OCLGRIND_LOG`` (Oclgrind then writes to
        stderr), no such file (Oclgrind could not open it), or a file shorter than ``since``
        (another Oclgrind context opened it since, truncating it). A check must not pass on
        reports it never read.
    """
    path, size = _oclgrind_log()
    if size is None or size < since:
        if not path:
            found = "OCLGRIND_LOG is not set, so Oclgrind wrote its reports to stderr"
        elif size is None:
            found = f"Oclgrind's log {path} does not exist (Oclgrind could not open it?)"
        else:
            found = (
                f"Oclgrind's log {path} holds {size} bytes, fewer than the {since} it held "
                "before the run: another Oclgrind context opened it since, truncating it"
            )
        raise PoclError(
            f"the Oclgrind reports of this run cannot be read: {found}. Expected a log of "
            "this process's own: start the process without OCLGRIND_LOG to get one "
            "(tvm_streamk.pocl.device), or name a file that no other process or context "
            "running Oclgrind at the same time writes."
        )
    with open(path, errors="replace") as f:
        f.seek(since)
        return f.read()

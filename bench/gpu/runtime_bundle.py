"""The runtime-only TVM of the GPU pack: the ``tvm`` and ``tvm_ffi`` packages without a compiler.

TVM 0.27's wheel is ``libtvm_compiler.so`` (259 MB) plus a runtime of about 5 MB;
``tvm/base.py`` loads the runtime alone when ``TVM_USE_RUNTIME_LIB=1`` (or when the compiler
library is missing), and ``import tvm`` then skips ``tvm.relax``. What such a process needs is
the Python packages and the runtime libraries; the compiler, the C++ headers and sources, the
bundled third-party headers and the compiler-only Python packages stay behind.

``tvm_ffi`` carries a CPython extension, so it must match the Python that runs the pack: the
bundle is taken from wheels for that Python (``pip download`` for the GPU machine's 3.12), or,
for the local Python, from the installed packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import tvm
import tvm_ffi

TVM_VERSION = "0.27.0.post1"
TVM_FFI_VERSION = "0.1.14.post1"
PLATFORM = "manylinux_2_28_x86_64"
PACKAGES = ("tvm", "tvm_ffi")
# Paths (package-relative, POSIX) left out of the bundle: the compiler and what only building
# or compiling C++ against TVM needs. ``tvm.relax`` and ``tvm.topi`` are not imported by a
# runtime-only ``import tvm``.
EXCLUDED = {
    "tvm": (
        "lib/libtvm_compiler.so",
        "3rdparty",
        "include",
        "src",
        "web",
        "cmake",
        "relax",
        "topi",
    ),
    "tvm_ffi": ("include", "src", "3rdparty", "cython", "stub", "cmake", "share", "CMakeLists.txt"),
}
# The CUDA runtime ``libtvm_runtime_cuda.so`` links against; found through its $ORIGIN runpath
# when the process has not loaded one already (PyTorch loads its own first).
CUDART = "libcudart.so.13"


class BundleError(RuntimeError):
    """The runtime bundle could not be assembled."""


def _excluded(package: str, relative: PurePosixPath) -> bool:
    if "__pycache__" in relative.parts:
        return True
    text = relative.as_posix()
    return any(text == skip or text.startswith(skip + "/") for skip in EXCLUDED[package])


def default_wheel_dir() -> Path:
    """Where downloaded wheels are kept between builds: a cache outside every pack (a wheel
    inside the pack's folder would travel with it: 99 MiB for the two)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "tvm-streamk" / "wheels"


def download_wheels(python: str, dest: Path) -> list[Path]:
    """The tvm and tvm-ffi wheels for CPython ``python`` ("3.12"), through pip's index."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--platform",
        PLATFORM,
        f"apache-tvm=={TVM_VERSION}",
        f"apache-tvm-ffi=={TVM_FFI_VERSION}",
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BundleError(f"pip download failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    return wheels_in(dest, python)


def wheels_in(folder: Path, python: str) -> list[Path]:
    tag = "cp" + python.replace(".", "")
    tvm_wheels = sorted(folder.glob(f"apache_tvm-{TVM_VERSION}-*.whl"))
    ffi_wheels = sorted(folder.glob(f"apache_tvm_ffi-{TVM_FFI_VERSION}-{tag}-*.whl"))
    if not tvm_wheels or not ffi_wheels:
        return []
    return [tvm_wheels[0], ffi_wheels[0]]


def _from_wheel(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            path = PurePosixPath(info.filename)
            package = path.parts[0]
            if package not in PACKAGES or info.is_dir():
                continue
            if _excluded(package, PurePosixPath(*path.parts[1:])):
                continue
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode)


def _from_installed(dest: Path) -> None:
    for module in (tvm, tvm_ffi):
        root = Path(module.__file__).parent
        package = root.name
        for path in root.rglob("*"):
            relative = PurePosixPath(path.relative_to(root).as_posix())
            if path.is_dir() or _excluded(package, relative):
                continue
            target = dest / package / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def _cudart() -> Path | None:
    lib = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    proc = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        name, _, rest = line.strip().partition(" => ")
        if name == CUDART and rest.startswith("/"):
            return Path(rest.split()[0])
    return None


def bundle(dest: Path, python: str = "3.12", wheel_dir: Path | None = None) -> dict:
    """Write the runtime-only ``tvm`` and ``tvm_ffi`` for ``python`` into ``dest``.

    ``python="local"`` copies the installed packages (this interpreter's ``tvm_ffi`` build);
    otherwise the wheels are taken from ``wheel_dir`` (default :func:`default_wheel_dir`) or
    downloaded into it; it must not lie inside the pack. Returns a record for the manifest.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if python == "local":
        _from_installed(dest)
        origin = f"installed packages of Python {sys.version_info.major}.{sys.version_info.minor}"
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
    else:
        wheel_dir = (wheel_dir or default_wheel_dir()).resolve()
        if wheel_dir.is_relative_to(dest.parent.resolve()):
            raise BundleError(
                f"the wheel folder {wheel_dir} is inside the pack {dest.parent}: its wheels "
                "would travel with it; pass --wheels outside the pack"
            )
        wheels = wheels_in(wheel_dir, python) or download_wheels(python, wheel_dir)
        for wheel in wheels:
            _from_wheel(wheel, dest)
        origin = ", ".join(w.name for w in wheels)
    cudart = _cudart()
    if cudart is not None:
        shutil.copy2(cudart, dest / "tvm" / "lib" / CUDART)
    if (dest / "tvm" / "lib" / "libtvm_compiler.so").exists():
        raise BundleError("libtvm_compiler.so made it into the runtime bundle")
    return {
        "python": python,
        "origin": origin,
        "tvm": TVM_VERSION,
        "tvm_ffi": TVM_FFI_VERSION,
        "cudart": str(cudart) if cudart else None,
        "bytes": sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()),
    }

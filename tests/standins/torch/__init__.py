"""A numpy-backed stand-in for the part of PyTorch the GPU pack's runner uses.

The rehearsal of the GPU pack (``bench/gpu/rehearsal.py``, ``tests/bench/test_gpu_rehearsal.py``)
runs ``run.py``'s whole non-dry path on this machine: tensors are numpy arrays on the CPU
(aligned to 64 bytes, as DLPack consumers such as TVM require), "CUDA" calls run at once,
events read the wall clock. Put this folder first on ``PYTHONPATH`` to use it; nothing else
imports it.
"""

from __future__ import annotations

import builtins
import math
import os
import time
import types

import numpy as np

__version__ = "0.0+numpy-standin"


class dtype:  # noqa: N801 - torch's name
    def __init__(self, name: str, np_dtype):
        self.name, self.np = name, np.dtype(np_dtype)

    def __repr__(self) -> str:
        return f"torch.{self.name}"


def _bfloat16():
    try:
        import ml_dtypes

        return ml_dtypes.bfloat16
    except ImportError:
        return np.float32


float16 = dtype("float16", np.float16)
float32 = dtype("float32", np.float32)
float64 = dtype("float64", np.float64)
bfloat16 = dtype("bfloat16", _bfloat16())
uint8 = dtype("uint8", np.uint8)
int8 = dtype("int8", np.int8)
int16 = dtype("int16", np.int16)
int32 = dtype("int32", np.int32)
int64 = dtype("int64", np.int64)
bool = dtype("bool", np.bool_)  # noqa: A001 - torch's name
# torch's aliases (tvm_ffi reads them when it imports).
half, float, double = float16, float32, float64  # noqa: A001
short, int, long = int16, int32, int64  # noqa: A001
_BY_NP = {
    d.np: d for d in (float16, float32, float64, bfloat16, uint8, int8, int16, int32, int64, bool)
}
_rng = np.random.default_rng(builtins.int.from_bytes(os.urandom(8), "little"))


def _aligned(shape, np_dtype) -> np.ndarray:
    np_dtype = np.dtype(np_dtype)
    count = math.prod(shape)
    raw = np.empty(count * np_dtype.itemsize + 64, np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + count * np_dtype.itemsize].view(np_dtype).reshape(shape)


def _wrap(array) -> Tensor:
    array = np.asarray(array)
    out = _aligned(array.shape, array.dtype)
    out[...] = array
    return Tensor(out)


def _np(value):
    return value.array if isinstance(value, Tensor) else value


class Tensor:
    def __init__(self, array: np.ndarray):
        self.array = array

    shape = property(lambda self: self.array.shape)
    dtype = property(lambda self: _BY_NP[self.array.dtype])
    device = property(lambda self: "cpu")

    def __dlpack__(self, *args, **kwargs):
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def uniform_(self, low: float, high: float) -> Tensor:
        self.array[...] = _rng.uniform(low, high, self.array.shape)
        return self

    def zero_(self) -> Tensor:
        self.array[...] = 0
        return self

    def to(self, target) -> Tensor:
        if isinstance(target, str):  # a device: every stand-in tensor lives on the host
            return _wrap(self.array.copy())
        return _wrap(self.array.astype(target.np))

    def clone(self) -> Tensor:
        return _wrap(self.array)

    def reshape(self, *shape) -> Tensor:
        return Tensor(self.array.reshape(*shape))

    def abs(self) -> Tensor:
        return Tensor(np.abs(self.array))

    def max(self) -> Tensor:
        return Tensor(np.asarray(self.array.max()))

    def mean(self) -> Tensor:
        return Tensor(np.asarray(self.array.mean()))

    def sum(self, dim=None) -> Tensor:
        return Tensor(np.asarray(self.array.sum(axis=dim)))

    def all(self) -> Tensor:
        return Tensor(np.asarray(self.array.all()))

    def __getitem__(self, key) -> Tensor:
        return Tensor(self.array[key])

    def __setitem__(self, key, value) -> None:
        self.array[key] = _np(value)

    def __matmul__(self, other) -> Tensor:
        return _wrap(self.array @ _np(other))

    def __mul__(self, other) -> Tensor:
        return Tensor(self.array * _np(other))

    def __sub__(self, other) -> Tensor:
        return Tensor(self.array - _np(other))

    def __truediv__(self, other) -> Tensor:
        return Tensor(self.array / _np(other))

    def __lt__(self, other) -> Tensor:
        return Tensor(self.array < _np(other))

    def __ne__(self, other) -> Tensor:  # noqa: D105 - elementwise, as torch's
        return Tensor(self.array != _np(other))

    __hash__ = object.__hash__

    def __float__(self) -> float:
        return builtins.float(self.array)

    def __int__(self) -> int:
        return builtins.int(self.array)

    def __bool__(self) -> bool:  # noqa: D105
        return self.array.__bool__()


def empty(shape, dtype=float32, device=None) -> Tensor:  # noqa: A002
    shape = (shape,) if isinstance(shape, builtins.int) else tuple(shape)
    return Tensor(_aligned(shape, dtype.np))


def zeros(shape, dtype=float32, device=None) -> Tensor:  # noqa: A002
    return empty(shape, dtype).zero_()


def full(shape, value, dtype=float32, device=None) -> Tensor:  # noqa: A002
    out = empty(shape, dtype)
    out.array[...] = value
    return out


def randint(low: int, high: int, shape, device=None) -> Tensor:
    return _wrap(_rng.integers(low, high, shape))


def rand(shape, device=None) -> Tensor:
    return _wrap(_rng.random(shape))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return a @ b


def isfinite(t: Tensor) -> Tensor:
    return Tensor(np.isfinite(t.array))


def equal(a: Tensor, b: Tensor) -> bool:
    return np.array_equal(a.array, b.array)


class _Event:
    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: _Event) -> float:
        return (end.at - self.at) * 1e3


class _Stream:
    device = "cpu"
    cuda_stream = 0


cuda = types.SimpleNamespace(
    is_available=lambda: True,
    synchronize=lambda: None,
    Event=_Event,
    current_stream=lambda: _Stream(),
    get_device_properties=lambda index: types.SimpleNamespace(
        name="numpy stand-in", multi_processor_count=os.cpu_count(), major=0, minor=0,
        total_memory=2**30,
    ),
)  # fmt: skip
version = types.SimpleNamespace(cuda="none (numpy stand-in)")
backends = types.SimpleNamespace(
    cuda=types.SimpleNamespace(matmul=types.SimpleNamespace()),
    cudnn=types.SimpleNamespace(),
)

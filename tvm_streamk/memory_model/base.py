"""The memory-model interface and its registry (:mod:`tvm_streamk.memory_model`)."""

from __future__ import annotations

from typing import ClassVar

import tvm
from tvm import tirx

from ..errors import StreamKError

COND_TARGET = "target"


class MemoryModel:
    """What one target kind's memory model gives a fix-up.

    Subclass, set ``kind``, implement the methods and decorate with :func:`register`. Every
    method builds TIR; none inspects a kernel.

    Attributes
    ----------
    kind : str
        The TVM target kind (``target.kind.name``) the model is for.
    orders_handoffs : bool
        Whether a value one block stores can be ordered before another block's read within one
        kernel (fences and atomics the workspace fix-up's protocol can be argued from).
    index_bits : int
        The widest integer the target's kernels have: closed forms needing more are refused.
    grid_z : bool
        Whether kernels may bind ``blockIdx.z``. Where they may not (TVM's WebGPU runtime
        reserves it for folding wide grids), aligned split-K, which gives the splits to
        ``blockIdx.z``, is lowered as the persistent walk of the same plan instead.
    device_sms : bool
        Whether the host can ask the device its multiprocessor count at run time
        (``num_sms="device"``; WebGPU reports none).
    cumulative_fences : bool
        Whether one thread's device-scope fence also orders the accesses the other threads of
        its block made before a block barrier (PTX's fences are cumulative). Then a block's
        leader alone fences around the hand-off; otherwise every thread fences its own.
    truncating_divisions : bool
        Whether closed forms divided by a grid read at run time should truncate rather than
        floor (both agree on the non-negative values they divide; :mod:`.opencl` says why).
    staged_partial_reads : bool
        Whether a merge holding a call reads the accumulator through a staged copy
        (:meth:`tvm_streamk.transform.fixup.Fixup.partial_merge`): where the compiler keeps a
        scalarised register array in memory (PoCL), the copy keeps the K loop vectorised;
        where it keeps it in registers anyway (nvcc), the copy only costs registers.
    """

    kind: ClassVar[str] = ""
    orders_handoffs: ClassVar[bool] = True
    index_bits: ClassVar[int] = 64
    grid_z: ClassVar[bool] = True
    device_sms: ClassVar[bool] = True
    cumulative_fences: ClassVar[bool] = False
    truncating_divisions: ClassVar[bool] = False
    staged_partial_reads: ClassVar[bool] = False

    def __init__(self, target: tvm.target.Target):
        self.target = target

    def fence(self) -> tirx.Stmt:
        """A device-scope fence of global memory, for the calling thread."""
        raise NotImplementedError

    def atomic_add_error(self, dtype: str) -> str | None:
        """Why the target has no atomic add for ``dtype``, or None when it has one."""
        raise NotImplementedError

    def atomic_add(self, dtype: str, address, value) -> tirx.Expr:
        """``*address += value`` atomically, returning the old value."""
        raise NotImplementedError

    def handed_off(self, load: tirx.BufferLoad, dtype: str) -> tirx.Expr:
        """``load`` of a value another block stored before its arrival, read after this
        block saw the arrival: where no stale cached copy can serve it."""
        raise NotImplementedError

    def partial_dtype(self, dtype: str) -> str:
        """The element type a ``dtype`` partial sum is stored as in the workspace."""
        return dtype

    def store_partial(self, value: tirx.Expr, dtype: str) -> tirx.Expr:
        """``value`` (of ``dtype``) as the workspace stores it."""
        return value

    def load_partial(
        self, load: tirx.BufferLoad, dtype: str, across_kernels: bool = False
    ) -> tirx.Expr:
        """A stored partial of ``dtype`` read back by the last arriver, or with
        ``across_kernels`` by a later kernel of the same stream, whose launch orders it: a
        plain read."""
        raise NotImplementedError

    def lanes_in_one_access(self, lanes: int, dtype: str) -> bool:
        """Whether ``lanes`` elements of ``dtype`` can be stored and read back as one access
        (then a thread's lanes of a partial tile stay together in its slot)."""
        return False

    def read_lanes(
        self, workspace: tirx.Buffer, slot, group, lanes: int, dtype: str, across_kernels=False
    ):
        """``(declarations, value)``: the ``group``-th run of ``lanes`` consecutive elements of
        the workspace slot ``slot``, stored by another block (``across_kernels``: by an
        earlier kernel), read as one access and returned as a ``dtype`` vector."""
        raise NotImplementedError


_MODELS: dict[str, type[MemoryModel]] = {}


def register(cls: type[MemoryModel]) -> type[MemoryModel]:
    """Class decorator adding a :class:`MemoryModel` subclass for its ``kind``."""
    if not cls.kind:
        raise ValueError(f"memory model {cls.__name__} must set kind")
    if cls.kind in _MODELS and _MODELS[cls.kind] is not cls:
        raise ValueError(f"a memory model for target kind {cls.kind!r} is already registered")
    _MODELS[cls.kind] = cls
    return cls


def kinds() -> tuple[str, ...]:
    """The target kinds with a memory model."""
    return tuple(_MODELS)


def for_target(target: tvm.target.Target) -> MemoryModel:
    """The memory model of ``target``'s kind.

    Raises
    ------
    StreamKError
        For a target kind without one (the fix-ups cannot be emitted for it).
    """
    cls = _MODELS.get(target.kind.name)
    if cls is None:
        raise StreamKError(
            COND_TARGET,
            f"target kind {target.kind.name!r}, which has no memory model for the fix-ups",
            f"Build for one of {list(kinds())}, or use policy='data_parallel'.",
        )
    return cls(target)

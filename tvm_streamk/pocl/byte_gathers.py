"""Vectors of 8-bit integers gathered from scattered addresses, in OpenCL C that compiles.

TVM's C code generator writes a vector load of ``int8``/``uint8`` lanes from anything but
consecutive addresses (dlight's ``gpu.Matmul`` reads its int8 shared-memory staging so, 18
elements apart) as CUDA keeps such vectors, four bytes packed in an ``int``:
``((0x000000ff << 0) & (A[i.s0] << 0)) | ((0x000000ff << 8) & (A[i.s1] << 8))``. OpenCL C has
real ``char2``: the ``convert_int2`` of that ``int`` is ambiguous and PoCL refuses the kernel,
and TVM writes the lanes' ``Shuffle`` as a C++ constructor (``char2(a, b)``), which OpenCL C
refuses too. So every int8 kernel dlight schedules stopped at PoCL's compiler, data-parallel
ones included (found by a model fuzz campaign drawing int8 dense layers).

Before code generation each such load becomes one scalar load per lane, joined by a helper that
writes the OpenCL vector literal (``(char2)(a, b)``). Consecutive lanes (``vload2``) are left to
TVM. CUDA is untouched: its packed form is CUDA's own convention.
"""

from __future__ import annotations

import tvm

from .._compat import BufferLoad, call_pure_extern, prim_dtype_of, structural_map

_PREFIX = "tvm_streamk_bytes_"
# OpenCL C's vector widths.
_LANES = (2, 3, 4, 8, 16)
_C_TYPES = {"int8": "char", "uint8": "uchar"}


def legalize_byte_gathers(device_funcs: dict) -> tuple[dict, str]:
    """Rewrite gathered 8-bit vector loads out of finalized device kernels.

    Returns
    -------
    (funcs, prelude)
        The kernels, rewritten where they gathered bytes, and the OpenCL C helpers to put before
        TVM's source ("" when no kernel gathered any).
    """
    used: set[tuple[str, int]] = set()

    def load(node):
        dtype = prim_dtype_of(node)
        if dtype is None:
            return node
        base, lanes = dtype.split("x")[0], tvm.DataType(dtype).lanes
        if base not in _C_TYPES or lanes not in _LANES or _consecutive(node.indices[-1]):
            return node
        scalars = [
            BufferLoad(node.source, [*node.indices[:-1], index])
            for index in _lane_indices(node.indices[-1], lanes)
        ]
        used.add((base, lanes))
        return call_pure_extern(dtype, f"{_PREFIX}{_C_TYPES[base]}{lanes}", *scalars)

    out = {
        name: func.with_body(structural_map(func.body, (tvm.ir.TensorLoad, load)))
        for name, func in device_funcs.items()
    }
    return out, _helpers(sorted(used))


def _consecutive(index) -> bool:
    if not isinstance(index, tvm.tirx.Ramp):
        return False
    return isinstance(index.stride, tvm.tirx.IntImm) and index.stride.value == 1


def _lane_indices(index, lanes: int) -> list:
    if isinstance(index, tvm.tirx.Ramp):
        return [index.base + index.stride * i for i in range(lanes)]
    if isinstance(index, tvm.tirx.Broadcast):
        return [index.value] * lanes
    return [tvm.tirx.Shuffle([index], [i]) for i in range(lanes)]


def _helpers(used: list[tuple[str, int]]) -> str:
    if not used:
        return ""
    lines = ["// gathered 8-bit vectors (tvm_streamk.pocl.byte_gathers)."]
    for base, lanes in used:
        ctype = _C_TYPES[base]
        params = ", ".join(f"{ctype} a{i}" for i in range(lanes))
        values = ", ".join(f"a{i}" for i in range(lanes))
        lines.append(
            f"static inline {ctype}{lanes} {_PREFIX}{ctype}{lanes}({params}) "
            f"{{ return ({ctype}{lanes})({values}); }}"
        )
    return "\n".join(lines) + "\n\n"

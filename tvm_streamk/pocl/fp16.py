"""float16 for OpenCL devices without ``cl_khr_fp16``, such as PoCL's CPU device.

TVM's OpenCL code uses ``half`` as an arithmetic type, which needs ``cl_khr_fp16``; PoCL's CPU
device does not offer it (the generated source stops at ``#error "Half precision floating point
not supported"``). Core OpenCL C can still *store* halves through ``vload_half``/``vstore_half``.

So, as TVM's own bfloat16 legalization does, the finalized device kernels are rewritten before
code generation: every float16 buffer holds ``ushort`` bit patterns, loads widen them to float32,
arithmetic runs in float32, and stores (and casts to float16) round to nearest even. Results are
those of float16 storage with float32 compute: identical to native float16 for copies and for
float16-in/float32-accumulate kernels, and at least as accurate elsewhere.
"""

from __future__ import annotations

import tvm

from .._compat import (
    BufferLoad,
    BufferStore,
    PointerType,
    PrimType,
    buffer_type_like,
    call_pure_extern,
    is_buffer_var,
    op_name,
    prim_dtype_of,
    structural_map,
    structural_walk,
)
from .errors import UnsupportedKernelError

_LANES = (1, 2, 4, 8, 16)
_PREFIX = "tvm_streamk_"


def _suffix(lanes: int) -> str:
    return "" if lanes == 1 else str(lanes)


# Scalar conversions by integer arithmetic on the bit patterns. Punning through a ``half*``
# (vload_half on a ushort's address) is undefined behaviour under strict aliasing, and PoCL's
# optimizer does drop such stores inside accumulation loops.
_SCALAR_HELPERS = """\
static inline float tvm_streamk_h2f(ushort h) {
  uint sign = (uint)(h & 0x8000u) << 16;
  uint exp = (h >> 10) & 0x1fu;
  uint mant = h & 0x3ffu;
  if (exp == 0x1fu) return as_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0u) return as_float(sign | as_uint((float)mant * 0x1p-24f));
  return as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}
static inline ushort tvm_streamk_f2h(float f) {
  uint x = as_uint(f);
  uint sign = (x >> 16) & 0x8000u;
  uint a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (ushort)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (ushort)(sign | 0x7c00u);
  if (a < 0x38800000u) return (ushort)(sign | (uint)rint(as_float(a) * 0x1p24f));
  uint r = a - 0x38000000u;
  uint h = r >> 13;
  uint rest = r & 0x1fffu;
  h += (rest > 0x1000u) | ((rest == 0x1000u) & (h & 1u));
  return (ushort)(sign | h);
}
"""


def _helpers() -> str:
    """OpenCL C converting between ``ushort`` bit patterns and float, for every vector width.

    Both directions round as IEEE 754 does (round to nearest even, overflow to infinity, NaN kept
    quiet), without ``cl_khr_fp16``.
    """
    lines = [
        "// float16 storage emulation (tvm_streamk.pocl.fp16): no cl_khr_fp16 needed.",
        _SCALAR_HELPERS,
    ]
    for lanes in _LANES[1:]:
        parts = [f".s{i:x}" for i in range(lanes)]
        widen = ", ".join(f"{_PREFIX}h2f(b{c})" for c in parts)
        narrow = ", ".join(f"{_PREFIX}f2h(f{c})" for c in parts)
        lines.append(
            f"static inline float{lanes} {_PREFIX}h2f{lanes}(ushort{lanes} b) "
            f"{{ return (float{lanes})({widen}); }}"
        )
        lines.append(
            f"static inline ushort{lanes} {_PREFIX}f2h{lanes}(float{lanes} f) "
            f"{{ return (ushort{lanes})({narrow}); }}"
        )
    return "\n".join(lines) + "\n\n"


def _is_fp16(dtype: str | None) -> bool:
    return dtype is not None and dtype.startswith("float16")


def _lanes(dtype: str) -> int:
    return tvm.DataType(dtype).lanes


def _with_base(dtype: str, base: str) -> str:
    lanes = _lanes(dtype)
    return base if lanes == 1 else f"{base}x{lanes}"


def legalize_fp16(device_funcs: dict) -> tuple[dict, str]:
    """Rewrite float16 out of finalized device kernels.

    Returns
    -------
    (funcs, prelude)
        The kernels, rewritten where they used float16, and the OpenCL C helpers to put before
        TVM's source ("" when nothing used float16).

    Raises
    ------
    UnsupportedKernelError
        For float16 uses the emulation does not cover (a pointer into a float16 buffer, float16
        atomics, vectors of widths other than 2, 4, 8, 16).
    """
    out, changed = {}, False
    for name, func in device_funcs.items():
        if _uses_fp16(func):
            func = _Legalizer(name).run(func)
            changed = True
        out[name] = func
    return out, (_helpers() if changed else "")


def _uses_fp16(node) -> bool:
    found = []

    def on_type(ty):
        if _is_fp16(str(ty.dtype)):
            found.append(ty)

    structural_walk(node, [(PrimType, on_type)])
    return bool(found)


class _Legalizer:
    """One kernel's rewrite; post-order callbacks see children already rewritten."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.vars: dict[int, tvm.ir.Var] = {}
        self.storage: set[int] = set()
        # The first uncovered use; raised after the map, since an exception raised inside an FFI
        # callback comes back as a plain RuntimeError.
        self.problem: str | None = None

    def run(self, func):
        p = tvm.ir.prim.expr
        arithmetic = (p.Add, p.Sub, p.Mul, p.Div, p.Mod, p.FloorDiv, p.FloorMod, p.Min, p.Max)
        # Nodes whose stored float16 type must be re-derived from their rewritten children.
        rebuilt = [
            (p.Select, lambda e: p.Select(e.condition, e.true_value, e.false_value)),
            (p.Broadcast, lambda e: p.Broadcast(e.value, e.lanes)),
            (p.Shuffle, lambda e: p.Shuffle(e.vectors, e.indices)),
            (p.Let, lambda e: p.Let(e.var, e.value, e.body)),
            (arithmetic, lambda e: type(e)(e.a, e.b)),
        ]
        callbacks = [
            (tvm.ir.Var, self._var),
            (tvm.tirx.FloatImm, self._float_imm),
            (tvm.ir.TensorLoad, self._load),
            (tvm.tirx.BufferStore, self._store),
            (p.Cast, self._cast),
            (tvm.ir.Call, self._call),
        ] + [(types, self._retyped(rebuild)) for types, rebuild in rebuilt]
        func = structural_map(func, [(types, self._guarded(fn)) for types, fn in callbacks])
        if self.problem is None and _uses_fp16(func.body):
            self.problem = "a float16 expression"
        if self.problem is not None:
            raise UnsupportedKernelError(
                self.problem + " (PoCL has no cl_khr_fp16; float16 is emulated)",
                self.kernel,
                "Keep float16 to buffer loads, stores, casts and arithmetic, or use float32.",
            )
        return func

    def _guarded(self, callback):
        """``callback`` that never raises: an exception crossing the FFI callback boundary can
        corrupt the heap, so it is recorded as the kernel's problem and the node kept."""

        def guarded(node):
            try:
                return callback(node)
            except Exception as err:  # noqa: BLE001 - anything TVM's constructors raise
                self._refuse(f"{type(node).__name__} `{node}` ({type(err).__name__}: {err})")
                return node

        return guarded

    def _refuse(self, construct: str) -> None:
        if self.problem is None:
            self.problem = construct

    # -- variables and buffers ----------------------------------------------------------------

    def _var(self, var):
        key = var.__chandle__()
        if key in self.vars:
            return self.vars[key]
        ty = var.ty
        new = None
        if is_buffer_var(var) and _is_fp16(str(ty.dtype.dtype)):
            # A vector-typed buffer (float16x2 elements) holds ushort2 bit patterns.
            new_ty = buffer_type_like(
                ty, element=PrimType(_with_base(str(ty.dtype.dtype), "uint16"))
            )
            new = tvm.ir.Var(var.name, new_ty)
            self.storage.add(new.__chandle__())
        elif isinstance(ty, PointerType) and isinstance(ty.element_type, PrimType):
            if _is_fp16(str(ty.element_type.dtype)):
                new = tvm.ir.Var(var.name, PointerType(PrimType("uint16"), ty.storage_scope))
        elif _is_fp16(prim_dtype_of(var)):
            new = tvm.ir.Var(var.name, _with_base(prim_dtype_of(var), "float32"))
        if new is None:
            return var
        self.vars[key] = new
        self.vars[new.__chandle__()] = new
        return new

    def _is_storage(self, buf) -> bool:
        return is_buffer_var(buf) and buf.__chandle__() in self.storage

    # -- expressions --------------------------------------------------------------------------

    def _widen(self, bits, lanes: int):
        if lanes not in _LANES:
            self._refuse(f"a float16 vector of {lanes} lanes")
            return bits
        return call_pure_extern(
            _with_base(f"float16x{lanes}" if lanes > 1 else "float16", "float32"),
            f"{_PREFIX}h2f{_suffix(lanes)}",
            bits,
        )

    def _narrow(self, value):
        lanes = _lanes(prim_dtype_of(value))
        if lanes not in _LANES:
            self._refuse(f"a float16 vector of {lanes} lanes")
            return value
        if isinstance(value, tvm.ir.Call) and self._is_widen(value):
            return value.args[1]
        return call_pure_extern(
            _with_base(prim_dtype_of(value), "uint16"), f"{_PREFIX}f2h{_suffix(lanes)}", value
        )

    @staticmethod
    def _is_widen(call) -> bool:
        return (
            op_name(call) == "tirx.call_pure_extern"
            and isinstance(call.args[0], tvm.ir.StringImm)
            and call.args[0].value.startswith(f"{_PREFIX}h2f")
        )

    def _float_imm(self, imm):
        if _is_fp16(prim_dtype_of(imm)):
            return tvm.tirx.FloatImm("float32", imm.value)
        return imm

    def _load(self, load):
        if not self._is_storage(load.source):
            return load
        bits = BufferLoad(load.source, list(load.indices))
        return self._widen(bits, _lanes(prim_dtype_of(bits)))

    def _store(self, store):
        if not self._is_storage(store.buffer):
            return store
        value = store.value
        if not prim_dtype_of(value).startswith("float32"):
            value = tvm.ir.prim.expr.Cast(_with_base(prim_dtype_of(value), "float32"), value)
        return BufferStore(store.buffer, self._narrow(value), list(store.indices))

    def _cast(self, cast):
        target = prim_dtype_of(cast)
        value = cast.value
        if not _is_fp16(target):
            if prim_dtype_of(value) == target:
                return value
            return tvm.ir.prim.expr.Cast(target, value)
        if isinstance(value, tvm.ir.Call) and self._is_widen(value):
            return value
        if not prim_dtype_of(value).startswith("float32"):
            value = tvm.ir.prim.expr.Cast(_with_base(target, "float32"), value)
        # A cast to float16 rounds: narrow to bits and widen back.
        return self._widen(self._narrow(value), _lanes(target))

    def _buffer_data(self, call):
        """``buffer.data`` of a rewritten buffer points to its ``ushort`` bit patterns."""
        ty = call.ty
        if not (isinstance(ty, PointerType) and _is_fp16(str(ty.element_type.dtype))):
            return call
        return _with_ret_ty(call, PointerType(PrimType("uint16"), ty.storage_scope))

    def _retyped(self, rebuild):
        def callback(e):
            return rebuild(e) if _is_fp16(prim_dtype_of(e)) else e

        return callback

    def _call(self, call):
        name = op_name(call)
        if name == "tirx.buffer_data":
            return self._buffer_data(call)
        if name in ("tirx.address_of", "tirx.tvm_access_ptr") and any(
            isinstance(a, tvm.ir.Call) and self._is_widen(a) for a in call.args
        ):
            self._refuse("a pointer into a float16 buffer")
            return call
        if not _is_fp16(prim_dtype_of(call)):
            return call
        if name in ("tirx.call_extern", "tirx.call_pure_extern"):
            extern = call.args[0].value
            if "atomic" in extern:
                self._refuse(f"the float16 atomic {extern}()")
                return call
        elif name != "prim.if_then_else":
            self._refuse(f"the float16 intrinsic {name}")
            return call
        return _with_ret_ty(call, _with_base(prim_dtype_of(call), "float32"))


def _with_ret_ty(call, ret_ty):
    """``call`` rebuilt with the return type ``ret_ty``, everything else kept."""
    return tvm.ir.Call(
        call.op, list(call.args), call.attrs, list(call.ty_args), call.span, ret_ty=ret_ty
    )

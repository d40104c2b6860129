"""What a kernel's output must satisfy: an exact pass, a float pass, and repeatability.

* **Exact.** Integer-valued inputs (entries in {-1, 0, 1}, A sparse enough that at most about
  ``EXACT_TERMS`` products of a row are nonzero) make every partial sum an integer of magnitude
  at most ~``EXACT_TERMS``, which fp16 (exact to 2048) and fp32 (to 2**24) represent exactly,
  in any order of summation. The output must then equal the float64 product bit for bit: a lost
  or doubled partial tile, at any shape and dtype, changes some element by a nonzero integer.
  The kernel is called ``calls`` times on these inputs and checked after each call, so a
  hand-off race that shows once in a few calls is caught too.
* **Float.** Uniform [-1, 1] inputs against a float64 product. fp32 accumulation:
  ``|C - ref| <= 1e-5 * max(1, sqrt(k / 16384)) * max|ref| + u * |ref|`` for every element,
  where ``u`` is the rounding of the output's dtype (0 for fp32, ``2**-11`` for fp16,
  ``2**-8`` for bf16). fp16 accumulation (dlight's
  WMMA schedule accumulates in half): every element finite and, in every ``BLOCK`` x ``BLOCK``
  block of C, ``rms(C - ref) <= 2**-10 * sqrt(k) * rms(ref)`` with ``rms(ref)`` over all of C.
  Rounding errors of a k-term half-precision sum grow about as ``2**-11 * k`` times the terms'
  spread, so the bound holds about fivefold; a lost or doubled partial tile puts an error of
  the order of the result into the blocks it covers. (Over the whole matrix, one such tile of
  2048**2 is diluted below the bound: hence blocks.)
* **Repeatable.** After the timed calls the output is checked again, and a deterministic
  kernel (every fix-up but ``atomic``) must give the same bits as its first call.

The functions take the tensor library as an argument (``torch`` on the GPU machine, a
numpy-backed stand-in in the rehearsal) and use only a small part of it.
"""

from __future__ import annotations

import math

FP32_TOL = 1e-5
FP32_TOL_K = 16384
FP16_RMS = 2.0**-10
BLOCK = 64
EXACT_TERMS = 1024
# Relative rounding of a stored output element (half a unit in the last place).
OUTPUT_ROUNDING = {"float32": 0.0, "float64": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def is_deterministic(entry: dict) -> bool:
    """Whether the kernel must give the same bits on every call (everything but atomics)."""
    return entry.get("fixup") != "atomic"


def float_inputs(torch, entry: dict, device: str):
    """Uniform [-1, 1] ``a``, ``b`` of the entry's shapes and dtypes, and their float64 product."""
    a = _empty(torch, entry["args"][0], device).uniform_(-1.0, 1.0)
    b = _empty(torch, entry["args"][1], device).uniform_(-1.0, 1.0)
    return a, b, a.to(torch.float64) @ b.to(torch.float64)


def exact_inputs(torch, entry: dict, device: str):
    """Integer-valued ``a``, ``b`` whose product every dtype and order of summation computes
    exactly (module docstring), and that product in float64."""
    k = entry["shape"]["k"]
    density = min(1.0, EXACT_TERMS / k)
    a_arg, b_arg = entry["args"][0], entry["args"][1]
    a = torch.randint(-1, 2, tuple(a_arg["shape"]), device=device).to(torch.float64)
    keep = (torch.rand(tuple(a_arg["shape"]), device=device) < density).to(torch.float64)
    a = (a * keep).to(_dtype(torch, a_arg["dtype"]))
    b = torch.randint(-1, 2, tuple(b_arg["shape"]), device=device).to(_dtype(torch, b_arg["dtype"]))
    return a, b, a.to(torch.float64) @ b.to(torch.float64)


def output(torch, entry: dict, device: str):
    """The output tensor, filled with NaN: an element no block writes shows up."""
    arg = entry["args"][entry["output_index"]]
    return torch.full(
        tuple(arg["shape"]), math.nan, dtype=_dtype(torch, arg["dtype"]), device=device
    )


def exact_check(torch, out, ref) -> dict:
    """Bitwise equality with the float64 product (``mismatches``: elements that differ)."""
    mismatches = int((out.to(torch.float64) != ref).sum())
    return {"exact": mismatches == 0, "mismatches": mismatches}


def float_check(torch, entry: dict, out, ref) -> dict:
    """The float pass of the module docstring, with the figures it compared."""
    k = entry["shape"]["k"]
    finite = bool(torch.isfinite(out).all())
    diff = out.to(torch.float64) - ref
    max_ref = float(ref.abs().max())
    rms_ref = math.sqrt(float((ref * ref).mean()))
    max_err = float(diff.abs().max()) if finite else math.inf
    result = {
        "finite": finite,
        "max_err_rel": max_err / max_ref if max_ref else max_err,
    }
    if entry.get("acc_dtype") == "float16":
        tol = FP16_RMS * math.sqrt(k)
        worst = _worst_block_rms(torch, diff) if finite else math.inf
        result.update(
            correct=finite and worst <= tol * rms_ref,
            worst_block_rms_rel=worst / rms_ref if rms_ref else worst,
            tolerance=tol,
            rule=f"per {BLOCK}x{BLOCK} block rms(C-ref) <= 2^-10*sqrt(k)*rms(ref)",
        )
    else:
        tol = FP32_TOL * max(1.0, math.sqrt(k / FP32_TOL_K))
        rounding = OUTPUT_ROUNDING[entry["dtypes"]["c"]]
        excess = float((diff.abs() - ref.abs() * rounding).max()) if finite else math.inf
        result.update(
            correct=finite and excess <= tol * max_ref,
            tolerance=tol,
            output_rounding=rounding,
            rule="|C-ref| <= 1e-5*max(1,sqrt(k/16384))*max|ref| + u_out*|ref|",
        )
    return result


def _worst_block_rms(torch, diff) -> float:
    """The largest root-mean-square of ``diff`` over its ``BLOCK`` x ``BLOCK`` blocks (edge
    blocks over their own elements)."""
    m, n = diff.shape
    rows, cols = -(-m // BLOCK), -(-n // BLOCK)
    padded = torch.zeros((rows * BLOCK, cols * BLOCK), dtype=torch.float64, device=diff.device)
    counts = torch.zeros((rows * BLOCK, cols * BLOCK), dtype=torch.float64, device=diff.device)
    padded[:m, :n] = diff * diff
    counts[:m, :n] = 1.0
    sums = padded.reshape(rows, BLOCK, cols, BLOCK).sum(dim=(1, 3))
    sizes = counts.reshape(rows, BLOCK, cols, BLOCK).sum(dim=(1, 3))
    return math.sqrt(float((sums / sizes).max()))


def _dtype(torch, name: str):
    return {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float64": torch.float64,
    }[name]


def _empty(torch, arg: dict, device: str):
    return torch.empty(tuple(arg["shape"]), dtype=_dtype(torch, arg["dtype"]), device=device)

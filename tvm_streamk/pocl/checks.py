"""Refusal of kernels that OpenCL on PoCL cannot run faithfully.

TVM's OpenCL code generator either rejects these constructs with an unhelpful message or, worse,
prints something that compiles and computes the wrong thing (``shared.dyn`` buffers become private
arrays). They are found by walking the IR, before anything is compiled or launched.
"""

from __future__ import annotations

import re

import tvm

from .._compat import PointerType, is_buffer_var, op_name, structural_walk
from ..analysis.ragged import RAGGED_SCOPE
from .errors import UnsupportedKernelError

_TENSOR_CORE_REMEDY = (
    "Run it on a CUDA GPU, or schedule without tensor cores (a SIMT schedule: for example dlight's "
    "Matmul rule on float32, or tvm_streamk.workloads.reference_schedule)."
)
_CUDA_REMEDY = (
    "Use the OpenCL spellings (T.call_extern(dtype, 'atomic_add', ptr, value) for atomics, "
    "'mem_fence' for fences, T.tvm_storage_sync('shared') for barriers), or run it on a CUDA GPU."
)

# Intrinsics for tensor cores and warp-level data movement: the op name minus its "tirx." prefix.
_TENSOR_CORE_OP = re.compile(r"(mma|ldmatrix|matrix_sync|fill_fragment|stmatrix)")
_CUDA_ONLY_OP = re.compile(r"^(ptx_|cuda\.|nvshmem|tvm_warp_|cp_async|async_)")
# CUDA device functions reached through call_extern: __shfl_sync, __threadfence, atomicAdd, ...
_CUDA_ONLY_EXTERN = re.compile(r"^(__|atomic[A-Z]|cuda|nv|wmma|mma|ptx)")
# The storage scopes OpenCL has address spaces for.
_OPENCL_SCOPES = ("", "global", "shared", "local")
_EXTERN_OPS = ("tirx.call_extern", "tirx.call_pure_extern", "tirx.call_llvm_intrin")
_FENCES = ("mem_fence", "read_mem_fence", "write_mem_fence", "barrier", "work_group_barrier")


def check_supported(node, kernel: str) -> None:
    """Raise :class:`UnsupportedKernelError` if ``node`` uses a construct OpenCL cannot run.

    When several are present the most fundamental is reported (tensor cores before CUDA-only
    functions before memory scopes), so the message points at what to change first.

    Parameters
    ----------
    node
        A PrimFunc (scheduled, or a finalized device kernel).
    kernel
        The name used in the message: the device kernel, or the PrimFunc before lowering.
    """
    # Found constructs are collected, not raised, inside the walk: an exception crossing the FFI
    # callback boundary comes back as a plain RuntimeError. Lower priorities are reported first.
    findings: list[tuple[int, str, str]] = []

    def on_call(call):
        name = op_name(call)
        short = name.removeprefix("tirx.")
        if _TENSOR_CORE_OP.search(short):
            findings.append((0, f"the tensor-core intrinsic {name}", _TENSOR_CORE_REMEDY))
        elif _CUDA_ONLY_OP.search(short):
            findings.append((2, f"the CUDA-only intrinsic {name}", _CUDA_REMEDY))
        elif name in _EXTERN_OPS and call.args and isinstance(call.args[0], tvm.ir.StringImm):
            extern = call.args[0].value
            if _CUDA_ONLY_EXTERN.search(extern):
                construct = f"the CUDA device function {extern}() (through {short})"
                findings.append((2, construct, _CUDA_REMEDY))
            elif extern in _FENCES and any(isinstance(a, tvm.ir.StringImm) for a in call.args[1:]):
                # TVM prints a StringImm as a C string literal: mem_fence("CLK_GLOBAL_MEM_FENCE")
                # compiles (with a warning) and passes a pointer as the flags.
                findings.append(
                    (
                        3,
                        f"{extern}() with a string argument",
                        "TVM prints it as a string literal, not the OpenCL flag; pass the flag's "
                        "value as an integer, T.uint32(2) for CLK_GLOBAL_MEM_FENCE and T.uint32(1) "
                        "for CLK_LOCAL_MEM_FENCE (the Khronos header values).",
                    )
                )
        elif name == "tirx.tvm_storage_sync" and call.args:
            scope = call.args[0].value
            if scope != "shared":
                findings.append(
                    (
                        3,
                        f"tvm_storage_sync({scope!r})",
                        "OpenCL has no grid-wide barrier and TVM prints nothing for this one; "
                        "split the work into separate kernels, or synchronise through atomics.",
                    )
                )

    def on_var(var):
        if is_buffer_var(var) or isinstance(var.ty, PointerType):
            finding = _scope_finding(var.name, str(var.ty.storage_scope))
            if finding is not None:
                findings.append(finding)

    structural_walk(node, [(tvm.ir.Call, on_call), (tvm.ir.Var, on_var)])
    if findings:
        # A stable sort keeps walk order within a priority.
        findings.sort(key=lambda f: f[0])
        _, construct, remedy = findings[0]
        others = list(dict.fromkeys(c for _, c, _ in findings if c != construct))
        if others:
            more = "; ..." if len(others) > 3 else ""
            remedy += f" (It also uses {'; '.join(others[:3])}{more}.)"
        raise UnsupportedKernelError(construct, kernel, remedy)


def _scope_finding(name: str, scope: str) -> tuple[int, str, str] | None:
    if scope in _OPENCL_SCOPES or scope == RAGGED_SCOPE:
        # A grouped GEMM's views: the tvm_streamk pipeline lowers them to global accesses.
        return None
    if scope.startswith(("wmma.", "m16n8k8.", "mma.")) or scope in ("warp", "local.fragment"):
        construct = f"the tensor-core / warp-fragment buffer {name!r} (scope {scope!r})"
        return 1, construct, _TENSOR_CORE_REMEDY
    if scope == "shared.dyn":
        return (
            3,
            f"the dynamic shared memory buffer {name!r} (scope 'shared.dyn')",
            "TVM's OpenCL codegen turns it into private memory; use static 'shared' buffers.",
        )
    return (
        3,
        f"the buffer {name!r} in storage scope {scope!r}",
        f"OpenCL address spaces cover only the scopes {list(_OPENCL_SCOPES[1:])}.",
    )

"""``StreamKMatmul``: dlight's matmul schedule, then Stream-K where the cost model says it pays.

The rule schedules a matmul-like function exactly as ``dlight.gpu.Matmul`` does (tensor-core or
SIMT), then records a Stream-K decision on its reduction with ``policy="heuristic"`` by default:
the cost model keeps the data-parallel kernel when the tiles fill whole waves and picks Stream-K,
a hybrid or split-K when they do not (tensor-core fragments take only aligned splits). Kernels
Stream-K cannot rewrite keep dlight's schedule unchanged. The rule keeps, per kernel, the plan
it recorded (``StreamKMatmul.decided``) or why it did not apply (``StreamKMatmul.skipped``),
keyed by :func:`kernel_key` (fused Relax functions have no symbol yet when dlight runs). The
``tvm_streamk`` TIR pipeline lowers the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from .._compat import Schedule, dlight, dlight_cuda_target, param_buffers
from ..analysis import first_site, refusals
from ..errors import StreamKError
from ..gpus import UnknownGPUError, num_sms_for_target
from ..schedule import stream_k


@dataclass(frozen=True)
class Config:
    """Knobs of :class:`StreamKMatmul`; ``num_sms=None`` reads the target's tag or arch."""

    num_sms: int | None = None
    blocks_per_sm: int | None = None
    policy: str = "heuristic"
    fixup: str = "auto"


class StreamKMatmul(dlight.gpu.Matmul):
    """dlight's ``gpu.Matmul`` followed by :func:`tvm_streamk.stream_k` on its reduction.

    Parameters
    ----------
    num_sms : int, optional
        SM count of the GPU; by default looked up from the target (a clear error when unknown).
    blocks_per_sm, policy, fixup
        As for :func:`tvm_streamk.stream_k` (by default the grid is sized for the built
        kernel's resident blocks per SM).

    Examples
    --------
    ::

        from tvm.s_tir import dlight as dl
        with tvm.target.Target("nvidia/nvidia-h100"):
            mod = dl.ApplyDefaultSchedule(StreamKMatmul(), dl.gpu.Fallback())(mod)
        lib = tvm.compile(mod, target="nvidia/nvidia-h100", tir_pipeline="tvm_streamk")
    """

    def __init__(self, num_sms=None, blocks_per_sm=None, policy="heuristic", fixup="auto"):
        super().__init__()
        self.config = Config(num_sms, blocks_per_sm, policy, fixup)
        self.skipped: dict[str, str] = {}
        self.decided: dict[str, object] = {}

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool):
        # sm_90a (the H100 tag) gets the tensor-core schedule sm_90 gets (_compat docstring).
        sch = super().apply(func, dlight_cuda_target(target), tunable)
        if not isinstance(sch, Schedule):
            return sch
        name = kernel_key(func, taken=self.skipped.keys() | self.decided.keys())
        block = _stream_k_block(sch)
        if block is None:
            self.skipped[name] = _why_no_site(sch)
            return sch
        try:
            num_sms = num_sms_for_target(self.config.num_sms, target)
        except UnknownGPUError as err:
            raise StreamKError(
                "num-sms", str(err), "Pass StreamKMatmul(num_sms=<the GPU's SM count>)."
            ) from None
        try:
            self.decided[name] = stream_k(
                sch,
                block,
                num_sms=num_sms,
                blocks_per_sm=self.config.blocks_per_sm,
                policy=self.config.policy,
                fixup=self.config.fixup,
                target=target,
            )
        except StreamKError as err:
            self.skipped[name] = str(err)
        return sch


def kernel_key(func: tirx.PrimFunc, taken=()) -> str:
    """A readable name for a kernel: its symbol when it has one, else its buffer shapes
    (``"kernel(4256x4096 float32, 4096x256 float32, 4256x256 float32)"``), made unique
    against ``taken`` with ``#2``, ``#3``, ..."""
    symbol = func.attrs.get("global_symbol", None) if func.attrs is not None else None
    if symbol:
        base = str(symbol)
    else:
        shapes = [
            "x".join(str(int(d)) if isinstance(d, tirx.IntImm) else str(d) for d in buf.shape)
            + f" {buf.dtype}"
            for buf in param_buffers(func)
            if hasattr(buf, "shape")
        ]
        base = f"kernel({', '.join(shapes)})"
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}#{n}"
    return key


def _why_no_site(sch: Schedule) -> str:
    """Why no block of dlight's schedule is a Stream-K site: the first reduction's refusal."""
    (func,) = [f for f in sch.mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    found = refusals(func)
    if not found:
        return "no reduction block in dlight's schedule"
    block, reason = next(iter(found.items()))
    more = f" (and {len(found) - 1} more reduction block(s))" if len(found) > 1 else ""
    return f"block {block!r}: {reason}{more}"


def _stream_k_block(sch: Schedule) -> str | None:
    """The block of the scheduled function that Stream-K accepts, by analysis not name."""
    (func,) = [f for f in sch.mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    site = first_site(func)
    return None if site is None else site.block.name_hint

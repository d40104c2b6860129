"""``StreamKMatmul``: dlight's matmul schedule, then Stream-K where the cost model says it pays.

The rule schedules a matmul-like function exactly as ``dlight.gpu.Matmul`` does (tensor-core or
SIMT), then records a Stream-K decision on its reduction with ``policy="heuristic"`` by default:
the cost model keeps the data-parallel kernel when the tiles fill whole waves and picks Stream-K,
a hybrid or split-K when they do not (tensor-core fragments take only aligned splits). Kernels
Stream-K cannot rewrite keep dlight's schedule unchanged; the reason is kept on the rule
(``StreamKMatmul.skipped``) for inspection. The ``tvm_streamk`` TIR pipeline lowers the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import tirx

from .._compat import Schedule, dlight, dlight_cuda_target
from ..analysis import first_site
from ..errors import StreamKError
from ..gpus import UnknownGPUError, num_sms_for_target
from ..schedule import stream_k


@dataclass(frozen=True)
class Config:
    """Knobs of :class:`StreamKMatmul`; ``num_sms=None`` reads the target's tag or arch."""

    num_sms: int | None = None
    blocks_per_sm: int = 1
    policy: str = "heuristic"
    fixup: str = "auto"


class StreamKMatmul(dlight.gpu.Matmul):
    """dlight's ``gpu.Matmul`` followed by :func:`tvm_streamk.stream_k` on its reduction.

    Parameters
    ----------
    num_sms : int, optional
        SM count of the GPU; by default looked up from the target (a clear error when unknown).
    blocks_per_sm, policy, fixup
        As for :func:`tvm_streamk.stream_k`.

    Examples
    --------
    ::

        from tvm.s_tir import dlight as dl
        with tvm.target.Target("nvidia/nvidia-h100"):
            mod = dl.ApplyDefaultSchedule(StreamKMatmul(), dl.gpu.Fallback())(mod)
        lib = tvm.compile(mod, target="nvidia/nvidia-h100", tir_pipeline="tvm_streamk")
    """

    def __init__(self, num_sms=None, blocks_per_sm=1, policy="heuristic", fixup="auto"):
        super().__init__()
        self.config = Config(num_sms, blocks_per_sm, policy, fixup)
        self.skipped: dict[str, str] = {}

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, tunable: bool):
        # sm_90a (the H100 tag) gets the tensor-core schedule sm_90 gets (_compat docstring).
        sch = super().apply(func, dlight_cuda_target(target), tunable)
        if not isinstance(sch, Schedule):
            return sch
        name = str(func.attrs.get("global_symbol", "")) if func.attrs is not None else ""
        block = _stream_k_block(sch)
        if block is None:
            self.skipped[name] = "no tiled reduction Stream-K can rewrite in dlight's schedule"
            return sch
        try:
            num_sms = num_sms_for_target(self.config.num_sms, target)
        except UnknownGPUError as err:
            raise StreamKError(
                "num-sms", str(err), "Pass StreamKMatmul(num_sms=<the GPU's SM count>)."
            ) from None
        try:
            stream_k(
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


def _stream_k_block(sch: Schedule) -> str | None:
    """The block of the scheduled function that Stream-K accepts, by analysis not name."""
    (func,) = [f for f in sch.mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    site = first_site(func)
    return None if site is None else site.block.name_hint

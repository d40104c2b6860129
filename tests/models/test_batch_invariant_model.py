"""Batch invariance in a model (issue 32): the linear layers of a Llama-style block, built with
``tvm.relax.frontend.nn`` with a symbolic sequence length, scheduled by the pipeline's rules
with ``batch_invariant=True``.

Each kernel the matmul rule decides runs on PoCL for one sequence alone (7 tokens) and batched
with others (the same 7 rows first, 129 and 1000 tokens in all), output poisoned: the shared
rows must have the same bits, and every run must match TVM's LLVM build of the same fused
function. The block: RMSNorm, the Q, K, V and output projections, a SwiGLU MLP and the
residuals (the attention core between the projections is TVM's reductions, out of scope).
"""

import numpy as np
import pytest
import tvm
from tvm import tirx
from tvm.relax.frontend import nn

import tvm_streamk
from tests.helpers import H100
from tests.kernels import LinearBlock
from tvm_streamk import pocl, workloads
from tvm_streamk._compat import dlight, param_buffers, structural_walk
from tvm_streamk.dlight import StreamKMatmul
from tvm_streamk.relax_pipeline import fusion_passes

# A whole model (docs/testing.md): slow.
pytestmark = [pytest.mark.usefixtures("opencl"), pytest.mark.slow]

HIDDEN, FFN = 64, 160
ALONE, BATCHED = 7, (129, 1000)


def _module(seq="seq") -> tvm.IRModule:
    mod, _ = LinearBlock(HIDDEN, FFN).export_tvm(
        spec={"forward": {"x": nn.spec.Tensor((seq, HIDDEN), "float32")}}
    )
    return mod


def _fused(seq="seq") -> dict[str, tirx.PrimFunc]:
    mod = _module(seq)
    with H100:
        fused = tvm.transform.Sequential(fusion_passes(H100))(mod)
    return {gv.name_hint: f for gv, f in fused.functions.items() if isinstance(f, tirx.PrimFunc)}


def _token_axes(func: tirx.PrimFunc) -> list[int | None]:
    """Per parameter, the axis whose extent is the symbolic sequence length (None: none)."""
    axes = []
    for buf in param_buffers(func):
        found = None
        for axis, extent in enumerate(buf.shape):
            names = []
            structural_walk(extent, (tirx.Var, lambda v, seen=names: seen.append(v.name)))
            if names:
                found = axis
        axes.append(found)
    return axes


def _rows(args, axes, tokens):
    """The arguments at ``tokens`` tokens: the leading rows of the largest call's, the output
    poisoned."""
    out = []
    for n, (arg, axis) in enumerate(zip(args, axes)):
        if axis is not None:
            arg = np.take(arg, np.arange(tokens), axis=axis)
        if n == len(args) - 1:
            arg = np.full_like(arg, np.nan)
        out.append(np.ascontiguousarray(arg))
    return out


def test_shared_rows_have_the_same_bits_alone_and_batched():
    decided = 0
    for name, func in _fused().items():
        rule = StreamKMatmul(num_sms=5, blocks_per_sm=1, batch_invariant=True)
        with H100:
            scheduled = dlight.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))
        if not rule.decided:
            continue
        (plan,) = rule.decided.values()
        assert plan.reason.count("batch-invariant"), plan.reason
        mod = tvm.IRModule({"main": scheduled["main"].with_attr("global_symbol", "main")})
        reference = tvm.compile(
            tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm"
        )
        axes = _token_axes(func)
        assert axes[-1] == 0, (name, axes)
        largest = workloads.random_args(func, np.random.default_rng(3), seq=max(BATCHED))
        shared = None
        for tokens in (ALONE, *BATCHED):
            args = _rows(largest, axes, tokens)
            out = pocl.run(mod, *args, pipeline="tvm_streamk")[-1]
            expected = [tvm.runtime.tensor(a) for a in args]
            reference["main"](*expected)
            assert workloads.relative_error(out, expected[-1].numpy()) <= 1e-5, (name, tokens)
            rows = np.ascontiguousarray(out[:ALONE]).view(np.uint8)
            if shared is None:
                shared = rows
            assert (rows == shared).all(), f"{name}: rows differ at {tokens} tokens"
        decided += 1
    # The projections and the MLP's three matmuls (fused with their epilogues).
    assert decided >= 4, decided


def _scheduled(func: tirx.PrimFunc):
    rule = StreamKMatmul(num_sms=5, blocks_per_sm=1, batch_invariant=True)
    with H100:
        scheduled = dlight.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))
    mod = tvm.IRModule({"main": scheduled["main"].with_attr("global_symbol", "main")})
    return mod, list(rule.decided.values())


def test_a_decode_step_gives_the_prefill_s_bits():
    """The decode function (one token, a static shape) against the prefill (symbolic): each
    matmul kernel of the decode step gives its row the bits the prefill kernel gives it among
    129 tokens; and the decode module compiles through ``relax_pipeline`` with every matmul
    decided."""
    decode, prefill = _fused(1), _fused()
    compared = 0
    for name, func in prefill.items():
        mod, plans = _scheduled(func)
        if not plans:
            continue
        decode_mod, decode_plans = _scheduled(decode[name])
        assert decode_plans, f"{name}: the one-token kernel was not decided"
        axes = _token_axes(func)
        largest = workloads.random_args(func, np.random.default_rng(4), seq=129)
        rows = []
        for kernel, tokens in ((decode_mod, 1), (mod, 129)):
            args = _rows(largest, axes, tokens)
            out = pocl.run(kernel, *args, pipeline="tvm_streamk")[-1]
            assert not np.isnan(out).any(), (name, tokens)
            rows.append(np.ascontiguousarray(out[:1]).view(np.uint8))
        assert (rows[0] == rows[1]).all(), f"{name}: the decode row differs from the prefill's"
        compared += 1
    # The seven matmul kernels: the projections and the MLP's three, fused as Relax fuses.
    assert compared == 7, compared
    pipeline = tvm_streamk.relax_pipeline(H100, batch_invariant=True)
    tvm.compile(_module(1), H100, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
    assert len(pipeline.rule.decided) == compared, pipeline.rule.decided

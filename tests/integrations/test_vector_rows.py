"""A vector times a matrix under batch invariance (issue 32): ``VectorRows`` gives it a row, so
one token without a batch axis gets the bits of its row in a batched prefill.

The module has the two functions a model of one weight has: ``decode`` multiplies one token
``x[K]`` (``nn.Linear`` on a vector: ``x @ W^T + b``) and ``prefill`` a symbolic number of
tokens ``x[n, K]``. Their fused kernels are scheduled as ``relax_pipeline(...,
batch_invariant=True)`` schedules them and run on PoCL (outputs poisoned), and the decode
output is compared bit for bit with row 0 of the prefill's.
"""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import relax as R

import tvm_streamk
from tests.helpers import H100
from tvm_streamk import pocl
from tvm_streamk._compat import dlight, structural_equal
from tvm_streamk.dlight import StreamKMatmul
from tvm_streamk.relax_pipeline import fusion_passes, schedule_rules
from tvm_streamk.vector_rows import VectorRows

K, N = 392, 40


# fmt: off
@tvm.script.ir_module
class OneWeight:
    @R.function
    def decode(x: R.Tensor((K,), "float32"), w: R.Tensor((N, K), "float32"),
               b: R.Tensor((N,), "float32")):
        with R.dataflow():
            y = R.add(R.matmul(x, R.permute_dims(w)), b)
            R.output(y)
        return y

    @R.function
    def prefill(x: R.Tensor(("n", K), "float32"), w: R.Tensor((N, K), "float32"),
                b: R.Tensor((N,), "float32")):
        with R.dataflow():
            y = R.add(R.matmul(x, R.permute_dims(w)), b)
            R.output(y)
        return y
# fmt: on


def _fused(batch_invariant: bool) -> tvm.IRModule:
    with H100:
        return tvm.transform.Sequential(fusion_passes(H100, batch_invariant))(OneWeight)


def _prim_funcs(mod) -> dict[str, tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}


def _called(mod, function: str) -> list[str]:
    """The PrimFuncs ``function`` calls, in order."""
    names = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            names.append(expr.args[0].name_hint)

    relax.analysis.post_order_visit(mod[function], visit)
    return names


def test_a_vector_matmul_gets_a_row_and_nothing_else_changes():
    mod = VectorRows(OneWeight)
    relax.analysis.well_formed(mod)
    ops = [
        b.value.op.name
        for block in mod["decode"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call)
    ]
    assert ops == [
        "relax.permute_dims",
        "relax.expand_dims",
        "relax.matmul",
        "relax.squeeze",
        "relax.add",
    ]
    # The batched function has rows already.
    assert structural_equal(mod["prefill"], OneWeight["prefill"])


def test_relax_pipeline_decides_the_vector_s_matmul():
    pipeline = tvm_streamk.relax_pipeline(H100, batch_invariant=True)
    tvm.compile(OneWeight, target=H100, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
    # The prefill's kernel of n rows and the one-row kernel the vector was given.
    assert sorted(pipeline.rule.decided) == [
        f"kernel(1x{K} float32, {K}x{N} float32, 1x{N} float32)",
        f"kernel(nx{K} float32, {K}x{N} float32, {N} float32, nx{N} float32)",
    ]
    assert not pipeline.rule.skipped


def _schedule(func, rule=None):
    rules = [rule] if rule is not None else [dlight.gpu.Fallback()]
    with H100:
        mod = dlight.ApplyDefaultSchedule(*rules)(tvm.IRModule({"main": func}))
    return tvm.IRModule({"main": mod["main"].with_attr("global_symbol", "main")})


@pytest.mark.usefixtures("opencl")
def test_one_token_gets_the_bits_of_its_row_in_the_prefill():
    rng = np.random.default_rng(32)
    x = rng.uniform(-1, 1, (129, K)).astype(np.float32)
    w = rng.uniform(-1, 1, (N, K)).astype(np.float32)
    b = rng.uniform(-1, 1, N).astype(np.float32)
    expected = x.astype(np.float64) @ w.T.astype(np.float64) + b

    # Without the mode the vector's kernel has no row for the matmul rule to take.
    plain = _prim_funcs(_fused(False))
    (vector,) = [n for n in _called(_fused(False), "decode") if "matmul" in n]
    rule = StreamKMatmul(num_sms=5, blocks_per_sm=1, batch_invariant=True)
    _schedule(plain[vector], rule)
    assert not rule.decided

    fused = _fused(True)
    funcs = _prim_funcs(fused)
    # Both functions transpose the weight first (a copy; a model's constant weight is folded).
    assert _called(fused, "prefill")[0] == _called(fused, "decode")[0] == "transpose"
    wt = np.ascontiguousarray(w.T)
    (prefill,) = [n for n in _called(fused, "prefill") if "matmul" in n]
    rule = StreamKMatmul(num_sms=5, blocks_per_sm=1, batch_invariant=True)
    out = pocl.run(
        _schedule(funcs[prefill], rule),
        x,
        wt,
        b,
        np.full((129, N), np.nan, np.float32),
        pipeline="tvm_streamk",
    )[-1]
    assert np.abs(out - expected).max() < 1e-4
    (plan,) = rule.decided.values()
    assert "batch-invariant" in plan.reason, plan.reason

    # decode: expand_dims, the one-row matmul (decided like the prefill's), squeeze + add.
    value = x[0].copy()
    shapes = {"expand_dims": (1, K), "matmul": (1, N), "fused_squeeze_add": (N,)}
    assert _called(fused, "decode")[1:] == list(shapes)
    for name, shape in shapes.items():
        func = funcs[name]
        poisoned = np.full(shape, np.nan, np.float32)
        if "matmul" in name:
            rule = StreamKMatmul(num_sms=3, blocks_per_sm=1, batch_invariant=True)
            kernel = _schedule(func, rule)
            assert rule.decided, name
            args = [value, wt, poisoned]
        else:
            kernel = _schedule(func)
            args = [value, b, poisoned] if "add" in name else [value, poisoned]
        value = pocl.run(kernel, *args, pipeline="tvm_streamk")[-1]
    assert value.shape == (N,)
    assert np.abs(value - expected[0]).max() < 1e-4
    assert (value.view(np.uint32) == out[0].view(np.uint32)).all()

    # The test that the comparison can fail: without the pass the pipeline's rules schedule
    # the vector's kernel in an order of their own (10 of the 40 outputs had the row's bits).
    with H100:
        scheduled = dlight.ApplyDefaultSchedule(*schedule_rules(rule))(
            tvm.IRModule({"main": plain[vector]})
        )
    kernel = tvm.IRModule({"main": scheduled["main"].with_attr("global_symbol", "main")})
    poisoned = np.full((N,), np.nan, np.float32)
    alone = pocl.run(kernel, x[0].copy(), wt, poisoned, pipeline="tvm_streamk")[-1] + b
    assert np.abs(alone - expected[0]).max() < 1e-4
    assert (alone.view(np.uint32) != out[0].view(np.uint32)).any()

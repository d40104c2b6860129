"""Run-time rows (issue 32, item 2): under ``batch_invariant=True`` every static M of one weight
runs the kernel of a run-time M, so a decode step at one token and a prefill of any length give
a row the same bits.

The generalised function of a static M is the one a symbolic sequence length exports
(structurally equal); the rules then schedule and decide every M alike. On PoCL, with outputs
poisoned: a fused matmul + SiLU x multiply at one token, at 7 tokens and the symbolic build at
129 tokens give row 0 the same bits. Without the mode dlight's matmul rule declines one token
(the row would be a GEMV rule's, reduced in its own order). And a tensor-core (fp16) kernel is
one aligned split-K, one block per chunk, at every M: static ones of 1 to 128 rows and a run-time
one schedule to the same function, which builds within the data-parallel kernel's budget.
"""

import numpy as np
import pytest
import tvm
from tvm import te, tirx
from tvm.relax.frontend import nn

from tests.helpers import EXTRA_REGISTERS, H100
from tests.kernels import FRAGMENT_TARGETS, LinearBlock
from tvm_streamk import pocl, ptxas, workloads
from tvm_streamk._compat import dlight, structural_equal
from tvm_streamk.dlight import StreamKMatmul
from tvm_streamk.relax_pipeline import fusion_passes
from tvm_streamk.transform.run_time_rows import run_time_rows

HIDDEN, FFN = 64, 160


def _fused(seq) -> dict[str, tirx.PrimFunc]:
    """The fused functions of the Llama-style block's linear layers at ``seq`` tokens."""
    mod, _ = LinearBlock(HIDDEN, FFN).export_tvm(
        spec={"forward": {"x": nn.spec.Tensor((seq, HIDDEN), "float32")}}
    )
    with H100:
        fused = tvm.transform.Sequential(fusion_passes(H100))(mod)
    return {gv.name_hint: f for gv, f in fused.functions.items() if isinstance(f, tirx.PrimFunc)}


def _same(a, b) -> bool:
    return structural_equal(a, b, map_free_vars=True)


def test_a_static_m_becomes_the_symbolic_sequence_length_s_function():
    symbolic = _fused("seq")
    matmuls = [name for name in symbolic if "matmul" in name]
    assert len(matmuls) >= 6, list(symbolic)
    for seq in (1, 7, 129):
        static = _fused(seq)
        for name in matmuls:
            general = run_time_rows(static[name])
            assert general is not None, (seq, name)
            assert _same(general, symbolic[name]), (seq, name)
            # Already run-time: nothing to do.
            assert run_time_rows(symbolic[name]) is None
        assert run_time_rows(static["rms_norm"]) is None


def _te_func(*tensors) -> tirx.PrimFunc:
    return te.create_prim_func(list(tensors))


def test_rows_reached_through_an_expression_stay_static():
    a = te.placeholder((8, 32), name="A")
    b = te.placeholder((32, 16), name="B")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((8, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    # Row i's output adds row (i + 1) % 8's product: the rows are not one axis throughout.
    d = te.compute((8, 16), lambda i, j: c[i, j] + c[(i + 1) % 8, j], name="D")
    assert run_time_rows(_te_func(a, b, d)) is None
    assert run_time_rows(_te_func(a, b, c)) is not None


def test_a_vector_times_a_matrix_has_no_rows():
    x = te.placeholder((32,), name="x")
    w = te.placeholder((32, 16), name="W")
    k = te.reduce_axis((0, 32), name="k")
    y = te.compute((16,), lambda j: te.sum(x[k] * w[k, j], axis=k), name="y")
    assert run_time_rows(_te_func(x, w, y)) is None


def _scheduled(func, batch_invariant=True, target=H100):
    rule = StreamKMatmul(num_sms=5, blocks_per_sm=1, batch_invariant=batch_invariant)
    with target:
        mod = dlight.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))
    return mod["main"].with_attr("global_symbol", "main"), rule


@pytest.mark.usefixtures("opencl")
def test_one_token_and_a_prefill_give_a_row_the_same_bits():
    name = "fused_matmul1_silu_multiply1"
    symbolic = _fused("seq")[name]
    one = _fused(1)[name]
    without, rule = _scheduled(one, batch_invariant=False)
    assert not rule.decided, "dlight's matmul rule took one token without the mode"
    largest = workloads.random_args(symbolic, np.random.default_rng(5), seq=129)
    reference = tvm.compile(
        tvm.IRModule({"main": symbolic.with_attr("global_symbol", "main")}), target="llvm"
    )
    rows = []
    for func, tokens in ((one, 1), (_fused(7)[name], 7), (symbolic, 129)):
        kernel, rule = _scheduled(func)
        (plan,) = rule.decided.values()
        assert "batch-invariant" in plan.reason and "run time" in plan.reason, plan.reason
        args = [np.ascontiguousarray(a[:tokens]) if a.shape[0] == 129 else a for a in largest]
        args[-1] = np.full_like(args[-1], np.nan)
        out = pocl.run(tvm.IRModule({"main": kernel}), *args, pipeline="tvm_streamk")[-1]
        expected = [tvm.runtime.tensor(a) for a in args]
        reference["main"](*expected)
        assert workloads.relative_error(out, expected[-1].numpy()) <= 1e-5, tokens
        rows.append(out[0].view(np.uint32))
    assert all((r == rows[0]).all() for r in rows[1:])


@pytest.mark.ptxas
@pytest.mark.parametrize("arch", sorted(FRAGMENT_TARGETS))
def test_tensor_core_kernels_of_every_m_are_one_aligned_split(arch):
    target, sms = FRAGMENT_TARGETS[arch]
    scheduled = []
    for m in (1, 16, 65, 128, tirx.Var("m", "int64")):
        mod = workloads.relax_matmul(m, 256, 1024, "float16")
        rule = StreamKMatmul(num_sms=sms, batch_invariant=True)
        with target:
            mod = dlight.ApplyDefaultSchedule(rule, dlight.gpu.Fallback())(mod)
        (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
        (plan,) = rule.decided.values()
        assert plan.label == "split_k(S=4)", (m, plan)
        scheduled.append(func)
    assert all(_same(f, scheduled[-1]) for f in scheduled[:-1])
    if not ptxas.available():
        pytest.skip("nvcc is not on PATH: the build's resources are not checked")

    def resources(func):
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        source = tvm.compile(mod, target=target, tir_pipeline="tvm_streamk").mod
        source = source.imports[0].inspect_source()
        assert "wmma::mma_sync" in source
        return max(ptxas.resources(source, arch).values(), key=lambda k: k.registers)

    with target:
        base_mod = workloads.relax_matmul(tirx.Var("m", "int64"), 256, 1024, "float16")
        base_mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul())(base_mod)
    (base,) = [f for f in base_mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    split, whole = resources(scheduled[-1]), resources(base)
    assert split.spills == 0 and split.stack == 0, split
    assert split.registers <= whole.registers + EXTRA_REGISTERS, (split, whole)

"""Whatever the Relax pipeline's rules decide builds and runs, on drawn small models.

test_knob_fuzz.py and test_workload_fuzz.py give ``stream_k`` schedules the project or dlight
wrote. Here the knobs reach the kernels as a model's do: a drawn Relax function (a dense layer
of a static or run-time token count, its weight as written or transposed; a batched matmul; a
1-D or 2-D convolution; fp32, fp16 or bf16 operands summed in fp32 or int8 summed in int32; a
bias, ReLU, GELU and an fp16 cast drawn as its epilogue) goes through the
pipeline's fusion passes and its dlight rules (``relax_pipeline.schedule_rules``) with drawn
knobs. A knob combination the rules refuse (with the reason) is allowed, and so is a kernel
they skip (``rule.skipped`` says why). Every kernel they decide must run on PoCL with its
output poisoned (NaN, or -12345 for integers) first and match TVM's LLVM build of the same
fused function, and a plain product float64 numpy too; where nvcc is installed the whole model
must build with ``relax_pipeline`` for sm_80, every kernel read by ptxas. The default suite
draws a few cases; ``TVM_STREAMK_FUZZ_EXAMPLES`` and ``TVM_STREAMK_FUZZ_SEED`` make a campaign
(docs/testing.md).
"""

from collections import Counter

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax

from tests.fuzz import drawn, fewer_conflicts, knobs
from tests.helpers import A100, FP32_TOL, cuda_modules
from tvm_streamk import pocl, ptxas, workloads
from tvm_streamk._compat import dlight, param_buffers
from tvm_streamk.dlight import StreamKMatmul
from tvm_streamk.errors import StreamKError
from tvm_streamk.relax_pipeline import fusion_passes, relax_pipeline, schedule_rules
from tvm_streamk.transform.lower_stream_k import annotated_blocks

pytestmark = pytest.mark.usefixtures("default_opencl")

DEFAULT_EXAMPLES = 8
# An fp16 output rounds each element once.
FP16_TOL = 2.0**-10 + FP32_TOL
# Token counts a run-time M is run at.
TOKENS = (1, 37, 130)


# -- models -------------------------------------------------------------------------------------


@st.composite
def epilogues(draw) -> list[str]:
    ops = [op for op in ("bias", "relu", "gelu") if draw(st.integers(0, 2)) == 0]
    return ops + (["cast"] if draw(st.integers(0, 3)) == 0 else [])


def extents(most: int):
    """Mostly a GEMM's extents; a few of the small ones dlight gives its other rules (no site
    for a one-wide K or N: a model's kernel the rules leave alone, which must still build)."""
    return st.one_of(st.integers(16, most), st.integers(16, most), st.integers(1, 15))


@st.composite
def models(draw) -> tuple[str, tvm.IRModule]:
    kind = draw(st.sampled_from(["dense", "dense", "batched", "conv1d", "conv2d"]))
    epilogue = draw(epilogues())
    # fp16 and bf16 operands summed in fp32, as a mixed-precision model's (tensor cores where
    # dlight gives them: built, not run); int8 summed in int32, as a quantized one's.
    dtype = draw(st.sampled_from(["float32", "float32", "float16", "bfloat16", "int8"]))
    accumulate = "int32" if dtype == "int8" else "float32"
    if dtype == "int8":
        epilogue = [op for op in epilogue if op != "gelu"]  # an integer has no GELU
    bb = relax.BlockBuilder()
    if kind in ("dense", "batched"):
        m = draw(extents(160))
        if kind == "dense" and draw(st.integers(0, 3)) == 0:
            m = tvm.tirx.Var("m", "int64")
        k, n = draw(extents(200)), draw(extents(160))
        lead = (draw(st.integers(1, 3)),) if kind == "batched" else ()
        transposed = draw(st.booleans())
        x = relax.Var("x", relax.TensorType((*lead, m, k), dtype))
        w_shape = (*lead, n, k) if transposed else (*lead, k, n)
        w = relax.Var("w", relax.TensorType(w_shape, dtype))
        channels, params = n, [x, w]
        label = f"{kind} {'x'.join(map(str, (*lead, m, k, n)))} {dtype} "
        label += "NT" if transposed else "NN"
    else:
        dim = 1 if kind == "conv1d" else 2
        c, o = draw(st.integers(2, 12)), draw(st.integers(1, 12))
        window = draw(st.integers(1, 3))
        spatial = tuple(draw(st.integers(window, 14)) for _ in range(dim))
        batch = draw(st.integers(1, 2))
        last = draw(st.booleans())  # channels last: NWC / NHWC data, WIO / HWIO weight
        data = (batch, *spatial, c) if last else (batch, c, *spatial)
        weight = (*(window,) * dim, c, o) if last else (o, c, *(window,) * dim)
        layouts = ("NWC", "WIO") if dim == 1 else ("NHWC", "HWIO")
        if not last:
            layouts = ("NCW", "OIW") if dim == 1 else ("NCHW", "OIHW")
        x = relax.Var("x", relax.TensorType(data, dtype))
        w = relax.Var("w", relax.TensorType(weight, dtype))
        stride, padding = draw(st.integers(1, 2)), draw(st.integers(0, 1))
        channels, params = o, [x, w]
        label = f"{kind} {layouts[0]} data {data} weight {weight} {dtype} s{stride} p{padding}"
    bias = relax.Var("bias", relax.TensorType((channels,), accumulate))
    if "bias" in epilogue:
        params.append(bias)
    with bb.function("main", params):
        with bb.dataflow():
            if kind in ("dense", "batched"):
                weight = w
                if transposed:
                    axes = [*range(len(lead)), len(lead) + 1, len(lead)]
                    weight = bb.emit(relax.op.permute_dims(w, axes))
                h = bb.emit(relax.op.matmul(x, weight, out_dtype=accumulate))
                shaped_bias = bias
            else:
                conv = relax.op.nn.conv1d if dim == 1 else relax.op.nn.conv2d
                h = bb.emit(
                    conv(
                        x,
                        w,
                        stride,
                        padding,
                        data_layout=layouts[0],
                        kernel_layout=layouts[1],
                        out_dtype=accumulate,
                    )
                )
                ones = (1,) * dim
                bias_shape = (1, *ones, channels) if last else (1, channels, *ones)
                shaped_bias = relax.op.reshape(bias, bias_shape)
            for op in epilogue:
                if op == "bias":
                    h = bb.emit(relax.op.add(h, shaped_bias))
                elif op == "relu":
                    h = bb.emit(relax.op.nn.relu(h))
                elif op == "gelu":
                    h = bb.emit(relax.op.nn.gelu(h))
                else:
                    h = bb.emit(relax.op.astype(h, "float16"))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return f"{label} {'+'.join(epilogue) or 'no epilogue'}", bb.get()


@st.composite
def rule_knobs(draw) -> dict:
    """test_knob_fuzz.py's knobs that the pipeline's rules take (``relax_pipeline``'s
    keywords), with test_workload_fuzz.py's fewer conflicts: a few SMs, so that small kernels
    split, and no run-time grid (a rule's SM count is a number or the target's)."""
    out = fewer_conflicts(draw, draw(knobs()))
    del out["deterministic"], out["group"]
    if out["num_sms"] == "device":
        out["num_sms"] = draw(st.integers(1, 7))
    return out


# -- the fuzz -------------------------------------------------------------------------------------


def _run_time_sizes(func: tvm.tirx.PrimFunc) -> list[dict]:
    names = {str(e) for b in param_buffers(func) for e in b.shape if isinstance(e, tvm.tirx.Var)}
    return [dict.fromkeys(names, t) for t in TOKENS] if names else [{}]


def _check_kernel(label, name, fused, scheduled) -> None:
    main = tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")})
    reference = tvm.compile(
        tvm.IRModule({"main": fused.with_attr("global_symbol", "main")}), target="llvm"
    )
    kernel = pocl.compile(main, pipeline="tvm_streamk")
    for n, sizes in enumerate(_run_time_sizes(fused)):
        args = workloads.random_args(fused, np.random.default_rng(n), **sizes)
        integer = np.issubdtype(args[-1].dtype, np.integer)
        assert (args[-1] == -12345).all() if integer else np.isnan(args[-1]).all()
        out = kernel.run(*args)[-1]
        expected = [tvm.runtime.tensor(a) for a in args]
        reference["main"](*expected)
        ref = expected[-1].numpy().astype(np.float64)
        a, b = (np.asarray(x, np.float64) for x in args[:2])
        plain = len(args) == 3 and not name.startswith("fused")
        if plain and a.ndim == b.ndim == 2 and a.shape[-1] == b.shape[0]:
            # A plain product (nothing fused into it): float64 numpy too.
            assert workloads.relative_error(ref, a @ b) <= FP32_TOL, (label, name)
            ref = a @ b
        tol = FP16_TOL if out.dtype == np.float16 else FP32_TOL
        if integer:
            tol = 0.0  # int8 products summed in int32: exact
        error = workloads.relative_error(out, ref)
        assert error <= tol, (label, name, sizes, error)


def test_every_kernel_the_rules_decide_builds_and_runs():
    outcomes = Counter()

    @drawn(DEFAULT_EXAMPLES)
    @given(models(), rule_knobs())
    def fuzz(model, knobs):
        label, mod = model
        try:
            rule = StreamKMatmul(**knobs)
        except (StreamKError, ValueError):
            outcomes["knobs refused"] += 1  # with the reason: allowed
            return
        with A100:
            fused = tvm.transform.Sequential(fusion_passes(A100, knobs["batch_invariant"]))(mod)
            # dlight's pass writes the scheduled functions into the module it is given.
            unscheduled = dict(fused.functions.items())
            scheduled = dlight.ApplyDefaultSchedule(*schedule_rules(rule))(fused)
        ran = 0
        for gv, kernel in scheduled.functions.items():
            if not isinstance(kernel, tvm.tirx.PrimFunc) or not annotated_blocks(kernel):
                continue
            if "wmma." in kernel.script():
                outcomes["tensor-core kernels (built, not run)"] += 1  # PoCL has no WMMA
            else:
                _check_kernel(f"{label} {knobs}", gv.name_hint, unscheduled[gv], kernel)
            ran += 1
        outcomes["decided" if ran else "skipped"] += 1
        if ptxas.available():
            # The whole model, as a user compiles it: ptxas reads every kernel.
            pipeline = relax_pipeline(A100, **knobs)
            lib = tvm.compile(mod, A100, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
            source = "\n".join(m.inspect_source() for m in cuda_modules(lib))
            assert ptxas.resources(source, "sm_80"), label
        for why in rule.skipped.values():
            outcomes["skip: " + why[:90]] += 1
        outcomes["kernels"] += ran

    fuzz()
    print(dict(outcomes))  # shown with -s: what a campaign decided and why rules skipped
    # A fuzz whose every model is skipped proves nothing. Small extents (a third of them) and
    # knobs a kernel cannot take (each with its reason) leave a model without a decision.
    assert outcomes["decided"] >= 0.4 * (outcomes["decided"] + outcomes["skipped"]), outcomes

"""Whatever ``stream_k`` accepts builds and runs, on the workloads beyond a plain fp32 GEMM.

test_knob_fuzz.py draws the knobs on plain fp32 GEMMs. Here the same knobs meet the other
workloads the project schedules: GEMMs of every layout, input and output dtype, a fused
bias + ReLU epilogue and a batch axis; grouped GEMMs and the ragged-K weight gradient of a
run-time token count, each built once and run at drawn routings (empty groups included);
convolutions of one and two spatial axes through ``implicit_gemm_schedule``. A refusal (with
its reason) is allowed; an accepted decision must build, match float64 numpy with the output
poisoned (NaN) first, and build for sm_80 where nvcc is installed. The default suite draws a
few cases per test; ``TVM_STREAMK_FUZZ_EXAMPLES`` and ``TVM_STREAMK_FUZZ_SEED`` make a
campaign (docs/testing.md).
"""

import functools
from collections import Counter

import numpy as np
import tvm
from hypothesis import given
from hypothesis import strategies as st

import tvm_streamk
from tests.fuzz import MIN_DECIDED_SHARE, drawn, fewer_conflicts, knobs, run_time_knobs
from tests.helpers import A100, FP32_TOL, conv_reference_for
from tvm_streamk import pocl, ptxas, workloads
from tvm_streamk.analysis import first_site
from tvm_streamk.errors import StreamKError

# The default suite's cases per test (a campaign sets TVM_STREAMK_FUZZ_EXAMPLES).
DEFAULT_EXAMPLES = 6
# A float16 or bfloat16 output rounds each element once (bfloat16: 8 bits of mantissa).
ROUNDED_OUTPUT_TOL = {"float16": 2.0**-10, "bfloat16": 2.0**-7}


@st.composite
def tiles(draw) -> dict:
    tm, tn = draw(st.sampled_from([2, 4])), draw(st.sampled_from([2, 4]))
    return {
        "bm": tm * draw(st.sampled_from([4, 8])),
        "bn": tn * draw(st.sampled_from([4, 8])),
        "bk": draw(st.sampled_from([4, 8, 16])),
        "tm": tm,
        "tn": tn,
    }


@st.composite
def workload_knobs(draw) -> dict:
    """test_knob_fuzz.py's knobs, with :func:`fewer_conflicts`."""
    return fewer_conflicts(draw, draw(knobs()))


def _decide(sch, decision, outcomes) -> bool:
    """Apply ``decision`` to the schedule's GEMM site; False (counted) where it is refused or
    there is none."""
    site = first_site(sch.mod["main"])
    if site is None:
        outcomes["no site"] += 1
        return False
    block = site.block.name_hint
    try:
        tvm_streamk.stream_k(sch, block, target=A100, **decision)
    except StreamKError:
        outcomes["refused"] += 1  # with its reason: allowed
        return False
    return True


def _builds_for_cuda(sch) -> None:
    """Where nvcc is installed, the kernel builds for sm_80 too (ptxas reads it)."""
    if ptxas.available():
        lib = tvm.compile(sch.mod, target=A100, tir_pipeline="tvm_streamk")
        assert ptxas.resources(lib.mod.imports[0].inspect_source(), "sm_80")


def _enough_decided(outcomes: Counter) -> None:
    # A fuzz whose every case is refused proves nothing.
    assert outcomes["decided"] >= MIN_DECIDED_SHARE * sum(outcomes.values()), outcomes


# -- GEMMs of every layout, dtype, epilogue and batch -----------------------------------------


@st.composite
def gemm_cases(draw) -> dict:
    in_dtype = draw(st.sampled_from(workloads.IN_DTYPES))
    out_dtype = None
    if in_dtype != "int8":
        out_dtype = draw(st.sampled_from([None, None, "float16", "bfloat16"]))
    return {
        "M": draw(st.integers(1, 96)),
        "N": draw(st.integers(1, 96)),
        "K": draw(st.integers(1, 160)),
        "layout": draw(st.sampled_from(workloads.LAYOUTS)),
        "in_dtype": in_dtype,
        "out_dtype": out_dtype,
        "epilogue": draw(st.sampled_from(workloads.EPILOGUES)),
        "batch": draw(st.sampled_from([None, None, 1, 3])),
    }


def test_gemms_of_every_layout_dtype_epilogue_and_batch():
    outcomes = Counter()

    @drawn(DEFAULT_EXAMPLES)
    @given(gemm_cases(), tiles(), workload_knobs())
    def fuzz(build, tile, decision):
        func = workloads.gemm(**build)
        sch = workloads.reference_schedule(func, **tile)
        if not _decide(sch, decision, outcomes):
            return
        args = workloads.random_args(func)
        assert np.isnan(args[-1]).all() or build["in_dtype"] == "int8"
        out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
        reference = functools.partial(workloads.reference, func, layout=build["layout"])
        tol = ROUNDED_OUTPUT_TOL.get(build["out_dtype"], FP32_TOL)
        if build["in_dtype"] == "int8":
            tol = 0.0  # int8 products summed in int32: exact
        # Fresh inputs: relative to the products' magnitude, not to a sum that may cancel.
        scale = workloads.magnitude(reference, args)
        error = workloads.relative_error(out, reference(args), scale)
        assert error <= tol, (build, tile, decision, error)
        _builds_for_cuda(sch)
        outcomes["decided"] += 1

    fuzz()
    _enough_decided(outcomes)


# -- grouped GEMM and the ragged-K weight gradient, one build per drawn case -------------------


@st.composite
def routings(draw, groups: int) -> list[list[int]]:
    """Two routings of tokens to ``groups`` experts: empty groups, one group holding most."""
    count = st.one_of(st.just(0), st.integers(1, 9), st.integers(10, 90))
    return draw(st.lists(st.lists(count, min_size=groups, max_size=groups), min_size=2, max_size=2))


@st.composite
def grouped_knobs(draw, ragged: bool = False) -> dict:
    """The run-time knobs, of the policies a device-known tile count takes (split-K is
    refused there, with its reason: test_grouped.py), with :func:`fewer_conflicts`; no batch
    invariance for a ragged K (refused, with its reason: test_ragged_k.py)."""
    out = draw(run_time_knobs())
    out["policy"] = draw(st.sampled_from(["data_parallel", "stream_k", "stream_k", "heuristic"]))
    out.pop("splits", None)
    if ragged:
        out["batch_invariant"] = False
    return fewer_conflicts(draw, out)


@st.composite
def grouped_cases(draw) -> tuple:
    groups = draw(st.integers(1, 5))
    shape = {"N": draw(st.integers(1, 48)), "K": draw(st.integers(1, 64))}
    return groups, shape, draw(routings(groups))


def test_grouped_gemms_of_a_run_time_token_count():
    outcomes = Counter()

    @drawn(DEFAULT_EXAMPLES)
    @given(grouped_cases(), st.sampled_from(["NN", "NT"]), tiles(), grouped_knobs())
    def fuzz(case, layout, tile, decision):
        groups, shape, counts_list = case
        func = workloads.grouped_gemm(groups, **shape, layout=layout)
        sch = workloads.reference_schedule(func, **tile)
        if not _decide(sch, decision, outcomes):
            return
        kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
        for n, counts in enumerate(counts_list):
            args = workloads.grouped_args(
                counts, **shape, layout=layout, rng=np.random.default_rng(n)
            )
            out = kernel.run(*args)[-1]
            ref = workloads.grouped_reference(*args[:3], layout=layout)
            if ref.size:
                error = workloads.relative_error(out, ref)
                assert error <= FP32_TOL, (groups, shape, counts, layout, tile, decision, error)
        _builds_for_cuda(sch)
        outcomes["decided"] += 1

    fuzz()
    _enough_decided(outcomes)


def test_ragged_k_weight_gradients_of_a_run_time_token_count():
    outcomes = Counter()

    @drawn(DEFAULT_EXAMPLES)
    @given(grouped_cases(), tiles(), grouped_knobs(ragged=True))
    def fuzz(case, tile, decision):
        groups, shape, counts_list = case
        func = workloads.grouped_weight_grad(groups, shape["N"], shape["K"])
        sch = workloads.reference_schedule(func, **tile)
        if not _decide(sch, decision, outcomes):
            return
        kernel = pocl.compile(sch.mod, pipeline="tvm_streamk")
        for n, counts in enumerate(counts_list):
            args = workloads.grouped_weight_grad_args(
                counts, shape["N"], shape["K"], rng=np.random.default_rng(n)
            )
            out = kernel.run(*args)[-1]
            ref = workloads.grouped_weight_grad_reference(*args[:3])
            if not np.abs(ref).max():  # no token: every gradient exactly zero
                assert np.array_equal(out, np.zeros_like(out)), (counts, tile, decision)
                continue
            error = workloads.relative_error(out, ref)
            assert error <= FP32_TOL, (groups, shape, counts, tile, decision, error)
        _builds_for_cuda(sch)
        outcomes["decided"] += 1

    fuzz()
    _enough_decided(outcomes)


# -- convolutions as implicit GEMMs -------------------------------------------------------------


@st.composite
def conv_cases(draw) -> dict:
    layout = draw(st.sampled_from(["NWC", "NCW", "NHWC", "NCHW"]))
    dim = len(layout) - 2
    channels_last = layout.endswith("C")
    # Two input channels at least: of one, a one-wide window leaves no reduction (K = 1 is
    # folded away, and there is no site).
    batch, c, o = draw(st.integers(1, 2)), draw(st.integers(2, 16)), draw(st.integers(1, 12))
    window = tuple(draw(st.integers(1, 3)) for _ in range(dim))
    dilation = draw(st.integers(1, 2))
    # Each spatial extent at least the dilated window, so every output extent is at least 1.
    spatial = tuple(draw(st.integers((w - 1) * dilation + 1, 14)) for w in window)
    data = (batch, *spatial, c) if channels_last else (batch, c, *spatial)
    weight = (*window, c, o) if channels_last else (o, c, *window)
    return {
        "data_shape": data,
        "weight_shape": weight,
        "layout": layout,
        "stride": draw(st.integers(1, 2)),
        "padding": draw(st.integers(0, 1)),
        "dilation": dilation,
        "epilogue": draw(st.sampled_from([None, None, "bias", "bias_relu"])),
    }


def test_convolutions_as_implicit_gemms():
    outcomes = Counter()

    @drawn(DEFAULT_EXAMPLES)
    @given(conv_cases(), tiles(), workload_knobs())
    def fuzz(build, tile, decision):
        func = workloads.conv(**build)
        sch = workloads.implicit_gemm_schedule(func, **tile)
        if not _decide(sch, decision, outcomes):
            return
        args = workloads.random_args(func)
        assert np.isnan(args[-1]).all()
        out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
        reference = conv_reference_for(build)
        error = workloads.relative_error(out, reference(args), workloads.magnitude(reference, args))
        assert error <= FP32_TOL, (build, tile, decision, error)
        _builds_for_cuda(sch)
        outcomes["decided"] += 1

    fuzz()
    _enough_decided(outcomes)

"""The project's implicit-GEMM schedule of convolutions, and Stream-K on it (issue 14, item 1).

:func:`tvm_streamk.workloads.implicit_gemm_schedule` normalises a convolution to
``C[S, I, J] += A[S, I, K] * B[S, J, K]`` (I = N*P*Q, J = output channels, K = C*R*S as one
fused reduction), tiles it as the reference GEMM schedule does, gathers each K-panel of the
input (padding included) straight into shared memory, and fuses epilogues into the write-back.
The families are test_conv's (1-D, 2-D and 3-D; NHWC and NCHW; stride, padding, dilation; and
grouped, as the batched GEMM over the groups), uneven against the 32 x 16 x 8 tiles used here.
Every run is on PoCL against the float64 numpy reference of
:func:`~tvm_streamk.workloads.conv_reference`, the output poisoned with NaN first (fp32
accumulation of at most 108 products of values in [-1, 1]: within 1e-5 of the largest output).
The default suite runs every family with ``stream_k`` and both fix-ups, and the whole policy x
fix-up matrix on one family; ``-m slow`` runs the matrix everywhere.
"""

import numpy as np
import pytest
import tvm
from tvm import te, topi

import tvm_streamk
from tests.conv_cases import (
    CONV_CASES,
    CONV_EPILOGUE_CASES,
    CONV_MATRIX_FAMILY,
    GROUPED_CONV_CASES,
)
from tests.dlight_sites import DECISIONS, FIXUPS, check_numeric
from tests.helpers import conv_reference_for
from tvm_streamk import pocl, workloads
from tvm_streamk._compat import loaded_buffer, param_buffers
from tvm_streamk.analysis import blocks_under, first_site
from tvm_streamk.errors import StreamKError
from tvm_streamk.workloads import WorkloadError

on_every_pocl = pytest.mark.usefixtures("opencl")

TILES = {"bm": 32, "bn": 16, "bk": 8, "tm": 2, "tn": 2}
GROUPED_TILES = {**TILES, "bn": 32}


def _site(func, **tiles):
    sch = workloads.implicit_gemm_schedule(func, **(tiles or TILES))
    site = first_site(sch.mod["main"])
    assert site is not None, "no Stream-K site in the implicit-GEMM schedule"
    return sch, site


def _check_numeric(kwargs: dict, policy: str, fixup: str, **tiles) -> None:
    def scheduled(func):
        sch, site = _site(func, **tiles)
        return sch, site.block.name_hint

    func = workloads.conv(**kwargs)
    check_numeric(func, conv_reference_for(kwargs), policy, fixup, schedule=scheduled)


def _matrix():
    for family in CONV_CASES:
        for policy in DECISIONS:
            for fixup in FIXUPS:
                fast = family == CONV_MATRIX_FAMILY or policy == "stream_k"
                yield pytest.param(
                    family,
                    policy,
                    fixup,
                    marks=() if fast else (pytest.mark.slow,),
                    id=f"{family}-{policy}-{fixup}",
                )


@on_every_pocl
@pytest.mark.parametrize("family,policy,fixup", list(_matrix()))
def test_conv_matches_float64(family, policy, fixup):
    _check_numeric(CONV_CASES[family], policy, fixup)


@on_every_pocl
@pytest.mark.parametrize(
    "family,policy",
    [
        pytest.param(f, p, id=f"{f}-{p}", marks=() if p == "stream_k" else pytest.mark.slow)
        for f in CONV_EPILOGUE_CASES
        for p in DECISIONS
    ],
)
def test_fused_epilogue_with_workspace_fixup(family, policy):
    _check_numeric(CONV_EPILOGUE_CASES[family], policy, "workspace")


def test_fused_epilogue_with_atomic_fixup_is_refused():
    sch, site = _site(workloads.conv(**CONV_EPILOGUE_CASES["conv2d-nhwc-bias-relu-residual"]))
    with pytest.raises(StreamKError, match=r"\[no-epilogue\]"):
        tvm_streamk.stream_k(sch, site.block.name_hint, num_sms=3, fixup="atomic")


@pytest.mark.parametrize("family", list(CONV_CASES))
def test_one_gemm_over_the_fused_reduction(family):
    """I = N*P*Q and J = O in tiles of the schedule, K = C*R*S in panels: the reduction axes
    are one K-panel loop, never split over the outermost window axis alone."""
    kwargs = CONV_CASES[family]
    _, site = _site(workloads.conv(**kwargs))
    out_shape = workloads.conv_output_shape(**kwargs)
    channel = kwargs["layout"].index("C")
    rows = int(np.prod(out_shape)) // out_shape[channel]
    reduction = int(np.prod(kwargs["weight_shape"])) // out_shape[channel]
    assert site.tiles == -(-rows // TILES["bm"]) * -(-out_shape[channel] // TILES["bn"])
    assert site.panels == -(-reduction // TILES["bk"])
    assert len(site.panel_chain) == 1


def test_the_input_is_gathered_into_shared_memory():
    """Implicit im2col: the shared copy of each A panel reads the input itself (the padding
    computed in the copy); no im2col matrix, padded input or output staging buffer remains."""
    func = workloads.conv(**CONV_EPILOGUE_CASES["conv2d-nhwc-bias-relu-residual"])
    sch, _ = _site(func)
    params = {b.name for b in param_buffers(func)}
    allocated, copies = [], {}
    for block in blocks_under(sch.mod["main"].body):
        allocated.extend(block.alloc_buffers)
        for write in map(loaded_buffer, block.writes):
            if write.scope() == "shared":
                copies[write.name] = {loaded_buffer(r).name for r in block.reads}
    assert sorted(b.scope() for b in allocated) == ["local", "shared", "shared"], allocated
    assert sorted(copies.values(), key=sorted) == [{"w"}, {"x"}], copies
    assert params >= {"x", "w", "bias", "residual"}


def test_trace_round_trip():
    sch, site = _site(workloads.conv(**CONV_CASES[CONV_MATRIX_FAMILY]))
    tvm_streamk.stream_k(sch, site.block.name_hint, num_sms=3, fixup="workspace")
    replayed = tvm.s_tir.Schedule(workloads.conv(**CONV_CASES[CONV_MATRIX_FAMILY]))
    sch.trace.apply_to_schedule(replayed, remove_postproc=False)
    tvm.ir.assert_structural_equal(replayed.mod, sch.mod)


@on_every_pocl
@pytest.mark.parametrize("family", list(GROUPED_CONV_CASES))
@pytest.mark.parametrize("fixup", FIXUPS)
def test_grouped_conv_is_a_batched_implicit_gemm(family, fixup):
    """The group split makes the groups the batch of the GEMM, on ``blockIdx.z``; Stream-K
    walks the (group, tile, panel) space (28 to 100 tiles with 32-wide J tiles, none a
    multiple of the 3 blocks)."""
    _, site = _site(workloads.conv(**GROUPED_CONV_CASES[family]), **GROUPED_TILES)
    groups = GROUPED_CONV_CASES[family]["groups"]
    assert site.band_extents[0] == groups and len(site.band_extents) == 3
    _check_numeric(GROUPED_CONV_CASES[family], "stream_k", fixup, **GROUPED_TILES)


@on_every_pocl
def test_grouped_conv_with_a_fused_bias():
    kwargs = {**GROUPED_CONV_CASES["grouped-nhwc-groups2"], "epilogue": "bias_relu"}
    _check_numeric(kwargs, "hybrid", "workspace", **GROUPED_TILES)


# Convolutions whose GEMM has an axis one wide, or few channels per group: dlight's index maps
# want I, J and K all wider than one and its group split 16 channels per group, and the schedule
# once refused these, saying that a depthwise convolution has no J axis (none of them is one).
DEGENERATE = {
    # I = N*P*Q = 1: one output position (J = 24 in 2 tiles, K = 72 in 9 panels).
    "one-output-position": dict(data_shape=(1, 3, 3, 8), weight_shape=(3, 3, 8, 24)),
    # 4 groups of 8 output channels over 2 input channels: J = 8, K = 18.
    "grouped-8-per-group": dict(
        data_shape=(2, 9, 9, 8), weight_shape=(3, 3, 2, 32), groups=4, padding=1
    ),
    # Depthwise: the batched GEMM over the 8 channels, J = 1 (correct, mostly padding).
    "depthwise": dict(data_shape=(2, 9, 9, 8), weight_shape=(3, 3, 1, 8), groups=8, padding=1),
}


@on_every_pocl
@pytest.mark.parametrize("family", list(DEGENERATE))
def test_convolutions_with_a_one_wide_axis_are_gemms_too(family):
    kwargs = {**DEGENERATE[family], "layout": "NHWC"}
    _check_numeric(kwargs, "stream_k", "workspace", bm=16, bn=16, bk=8, tm=2, tn=2)


@on_every_pocl
def test_a_one_element_reduction_is_scheduled_without_a_split():
    # K = C*R*S = 1 (a 1x1 kernel over one input channel): a GEMM with nothing to split, so the
    # kernel stays data-parallel and Stream-K finds no reduction to take.
    kwargs = dict(data_shape=(2, 5, 5, 1), weight_shape=(1, 1, 1, 20), layout="NHWC")
    func = workloads.conv(**kwargs)
    sch = workloads.implicit_gemm_schedule(func, bm=16, bn=16, bk=8, tm=2, tn=2)
    args = workloads.random_args(func)
    out = pocl.run(sch.mod, *args)[-1]
    assert workloads.relative_error(out, conv_reference_for(kwargs)(args)) <= 1e-5
    assert first_site(sch.mod["main"]) is None


def test_a_kernel_that_is_not_gemm_like_names_the_form_it_lacks():
    # A reduction over an axis of the output (a row sum): no form C[S, I, J] += A * B.
    x = te.placeholder((16, 32), name="x")
    k = te.reduce_axis((0, 32), name="k")
    y = te.compute((16,), lambda i: te.sum(x[i, k] * x[i, k], axis=k), name="y")
    func = te.create_prim_func([x, y])
    with pytest.raises(WorkloadError, match=r"not of the form C\[S, I, J\]") as info:
        workloads.implicit_gemm_schedule(func)
    assert "depthwise" not in str(info.value)


def test_a_consumer_that_is_not_elementwise_is_refused():
    x = te.placeholder((1, 8, 8, 4), name="x")
    w = te.placeholder((3, 3, 4, 6), name="w")
    out = topi.nn.conv(x, w, [1, 1], [1, 1, 1, 1], [1, 1], 1, "NHWC", "HWIO", out_dtype="float32")
    # Each output reads two channels of the convolution: not a write-back of its own tile.
    mixed = te.compute(out.shape, lambda n, h, v, c: out[n, h, v, c] + out[n, h, v, (c + 1) % 6])
    func = te.create_prim_func([x, w, mixed]).with_attr("global_symbol", "main")
    with pytest.raises(WorkloadError, match=r"cannot be fused into its write-back"):
        workloads.implicit_gemm_schedule(func)


def test_a_kernel_with_two_reductions_is_refused():
    a = te.placeholder((8, 8), name="a")
    k = te.reduce_axis((0, 8), name="k")
    first = te.compute((8, 8), lambda i, j: te.sum(a[i, k] * a[k, j], axis=k), name="first")
    k2 = te.reduce_axis((0, 8), name="k2")
    second = te.compute((8,), lambda i: te.sum(first[i, k2], axis=k2), name="second")
    func = te.create_prim_func([a, second]).with_attr("global_symbol", "main")
    with pytest.raises(WorkloadError, match=r"exactly one reduction block; found \['first', "):
        workloads.implicit_gemm_schedule(func)

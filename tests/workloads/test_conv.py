"""Stream-K on convolutions as dlight's GPU ``Matmul`` rule schedules them (issue 14, items 1, 5).

The rule reindexes the convolution to a GEMM (implicit im2col: I = batch x output positions,
J = output channels, K = input channels x kernel window) and inlines the padding into the
shared-memory load. Every case is uneven in I, J and K against dlight's 32 x 64 x 16 tiles.
Each run is checked on PoCL against the float64 numpy reference of :func:`conv_reference`.
The default suite runs every family with the ``stream_k`` policy (both fix-ups; one for the second
1-D and 3-D layouts) and the whole policy x fix-up matrix on one 2-D family; ``-m slow`` runs the
matrix on every family and epilogue.
"""

import re

import numpy as np
import pytest
import tvm
from tvm.s_tir import dlight as dl

import tvm_streamk
from tests.conv_cases import (
    CONV_CASES,
    CONV_EPILOGUE_CASES,
    CONV_MATRIX_FAMILY,
    GROUPED_CONV_CASES,
)
from tests.dlight_sites import (
    A100,
    DECISIONS,
    DEFAULT_RULES,
    FIXUPS,
    check_numeric,
    check_persistent,
    decision_matrix,
    matmul_site,
    schedule_with,
)
from tests.helpers import block_idx_extents, conv_reference_for
from tvm_streamk import workloads
from tvm_streamk.analysis import first_site
from tvm_streamk.dlight import StreamKMatmul
from tvm_streamk.errors import StreamKError
from tvm_streamk.transform.group_axis import GroupAxisRefused, split_group_axis

# Only the tests that run kernels take every PoCL in turn.
on_every_pocl = pytest.mark.usefixtures("opencl")


_reference = conv_reference_for


# The second layout of 1-D and 3-D runs one fix-up by default, to keep the suite near a minute.
ONE_FIXUP = {"conv1d-ncw-dilated": "workspace", "conv3d-ncdhw-strided": "atomic"}


def _fast(family, policy, fixup) -> bool:
    one_fixup = ONE_FIXUP.get(family, fixup) == fixup
    return family == CONV_MATRIX_FAMILY or (policy == "stream_k" and one_fixup)


@on_every_pocl
@pytest.mark.parametrize("family,policy,fixup", list(decision_matrix(CONV_CASES, _fast)))
def test_conv_matches_float64(family, policy, fixup):
    kwargs = CONV_CASES[family]
    check_numeric(workloads.conv(**kwargs), _reference(kwargs), policy, fixup)


@pytest.mark.parametrize("family", list(CONV_CASES))
def test_conv_kernel_is_persistent(family):
    check_persistent(workloads.conv(**CONV_CASES[family]))


def _epilogue_matrix():
    for family in CONV_EPILOGUE_CASES:
        for policy in DECISIONS:
            fast = policy == "stream_k" and family == "conv2d-nhwc-bias-relu-residual"
            marks = () if fast else (pytest.mark.slow,)
            yield pytest.param(family, policy, marks=marks, id=f"{family}-{policy}")


@on_every_pocl
@pytest.mark.parametrize("family,policy", list(_epilogue_matrix()))
def test_fused_epilogue_with_workspace_fixup(family, policy):
    # dlight inlines the bias, ReLU and residual add into the write-back; the last block to
    # arrive at a split tile runs that write-back once on the summed partials.
    kwargs = CONV_EPILOGUE_CASES[family]
    check_numeric(workloads.conv(**kwargs), _reference(kwargs), policy, "workspace")


@pytest.mark.parametrize("family", list(CONV_EPILOGUE_CASES))
def test_fused_epilogue_with_atomic_fixup_is_refused(family):
    # Atomic adds merge raw partial sums: an epilogue dlight fused into the write-back (bias,
    # ReLU, residual) would be applied to each partial. The workspace fix-up takes it (above).
    sch, block = matmul_site(workloads.conv(**CONV_EPILOGUE_CASES[family]))
    with pytest.raises(StreamKError, match=r"\[no-epilogue\].*fixup='workspace'"):
        tvm_streamk.stream_k(
            sch, block, target=A100, blocks_per_sm=1, fixup="atomic", policy="stream_k", num_sms=3
        )


DEPTHWISE = {
    "data_shape": (2, 8, 21, 19),
    "weight_shape": (8, 1, 3, 3),
    "layout": "NCHW",
    "groups": 8,
    "padding": 1,
}


def _grouped_matrix():
    for family in GROUPED_CONV_CASES:
        for policy in DECISIONS:
            for fixup in FIXUPS:
                fast = policy == "stream_k" or family == "grouped-nhwc-groups2"
                marks = () if fast else (pytest.mark.slow,)
                yield pytest.param(
                    family, policy, fixup, marks=marks, id=f"{family}-{policy}-{fixup}"
                )


@on_every_pocl
@pytest.mark.parametrize("family,policy,fixup", list(_grouped_matrix()))
def test_grouped_conv_matches_float64(family, policy, fixup):
    kwargs = GROUPED_CONV_CASES[family]
    grouped = split_group_axis(workloads.conv(**kwargs))
    assert grouped is not None
    check_numeric(grouped, _reference(kwargs), policy, fixup)


@pytest.mark.parametrize("family", list(GROUPED_CONV_CASES))
def test_grouped_conv_is_a_batched_gemm_over_groups(family):
    kwargs = GROUPED_CONV_CASES[family]
    grouped = split_group_axis(workloads.conv(**kwargs))
    sch, block = matmul_site(grouped)
    site = first_site(sch.mod["main"])
    # The group axis is the batch: one blockIdx loop of the tile band spans the groups.
    extents = dict(block_idx_extents(sch.mod))
    assert kwargs["groups"] in extents.values(), extents
    plan = tvm_streamk.stream_k(sch, block, target=A100, blocks_per_sm=1, **DECISIONS["stream_k"])
    assert plan.tiles % kwargs["groups"] == 0 and site is not None


def test_split_group_axis_rewrites_only_the_channel_axis():
    func = workloads.conv(**GROUPED_CONV_CASES["grouped-nchw-1x1-groups4"])
    text = split_group_axis(func).script()
    # The input channel of group g is g * (C/G) + rc; the weight row g * (O/G) + j.
    assert "pad_temp[v_nn, v_ff_g * 34 + v_rc, v_yy + v_ry, v_xx + v_rx]" in text
    assert "w[v_ff_g * 34 + v_ff_j, v_rc, v_ry, v_rx]" in text
    assert "//" not in text.split('T.sblock("group_conv2d_nchw")')[1]


@pytest.mark.parametrize(
    "func",
    [
        pytest.param(workloads.conv(**DEPTHWISE), id="depthwise"),
        pytest.param(workloads.conv(**CONV_CASES["conv2d-nhwc-stride2-pad1"]), id="ungrouped"),
        pytest.param(workloads.gemm(64, 64, 64), id="gemm"),
    ],
)
def test_split_group_axis_leaves_other_reductions_alone(func):
    # Depthwise: one output channel per group leaves no J axis to split off.
    assert split_group_axis(func) is None


def test_stream_k_matmul_rule_takes_grouped_conv():
    func = workloads.conv(**GROUPED_CONV_CASES["grouped-nhwc-groups2"])
    rule = StreamKMatmul(num_sms=3, blocks_per_sm=1, policy="stream_k")
    with A100:
        scheduled = dl.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))["main"]
    assert first_site(scheduled) is not None
    assert not rule.skipped and len(rule.decided) == 1


def _grouped_epilogue_matrix():
    for epilogue in ("bias", "bias_relu_residual"):
        for policy in DECISIONS:
            fast = policy == "data_parallel" or (policy, epilogue) == ("stream_k", "bias")
            marks = () if fast else (pytest.mark.slow,)
            yield pytest.param(epilogue, policy, marks=marks, id=f"{epilogue}-{policy}")


@on_every_pocl
@pytest.mark.parametrize("epilogue,policy", list(_grouped_epilogue_matrix()))
def test_grouped_conv_with_fused_epilogue(epilogue, policy):
    # dlight inlines the epilogue into its padded write-back and guards it by the epilogue's
    # own domain. Split there too (and in the buffers between), the guard bounds the channel in
    # its group; over the flat channel axis it would bound g * (O/G) + j by O only, and group
    # g's padded columns would overwrite group g + 1's channels (seen: relative error 0.8).
    kwargs = {**GROUPED_CONV_CASES["grouped-nchw-stride2"], "epilogue": epilogue}
    grouped = split_group_axis(workloads.conv(**kwargs))
    check_numeric(grouped, _reference(kwargs), policy, "workspace")


def test_grouped_conv_write_back_guards_the_channel_in_its_group():
    kwargs = {**GROUPED_CONV_CASES["grouped-nchw-stride2"], "epilogue": "bias"}
    sch, _ = matmul_site(split_group_axis(workloads.conv(**kwargs)))
    text = sch.mod["main"].script()
    # The J extent of a group is 20 of dlight's 64-wide tile: the padded columns are masked.
    guards = re.findall(r"T\.where\((.*)\)", text)
    assert any(re.search(r"< 220 and [^<]* < 20$", g) for g in guards), guards


def test_grouped_conv_with_a_layout_changing_consumer_is_refused():
    from tvm import te, topi

    x = te.placeholder((1, 8, 6, 6), name="x")
    w = te.placeholder((32, 4, 3, 3), name="w")
    conv = topi.nn.group_conv2d_nchw(x, w, 1, 1, 1, 2)
    nhwc = te.compute((1, 6, 6, 32), lambda n, h, v, c: conv[n, c, h, v], name="to_nhwc")
    func = te.create_prim_func([x, w, nhwc])
    with pytest.raises(GroupAxisRefused, match="'to_nhwc' .* does not write one buffer shaped"):
        split_group_axis(func)
    rule = StreamKMatmul(num_sms=3, blocks_per_sm=1)
    with A100:
        dl.ApplyDefaultSchedule(rule, dl.gpu.Fallback())(tvm.IRModule({"main": func}))
    ((_, why),) = rule.skipped.items()
    assert why.startswith("[grouped-conv]") and "to_nhwc" in why and not rule.decided


@pytest.mark.parametrize("kwargs", [GROUPED_CONV_CASES["grouped-nhwc-groups2"], DEPTHWISE])
def test_plain_dlight_falls_back_on_grouped_conv(kwargs):
    # Records where dlight's own rules put a grouped conv, so a change in dlight shows.
    scheduled, taken = schedule_with(workloads.conv(**kwargs), *DEFAULT_RULES)
    assert taken == "Fallback"
    assert first_site(scheduled) is None


def test_conv_reference_matches_a_direct_loop():
    # The reference's strided-view formulation against the definition, element by element.
    kwargs = {"stride": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2), "groups": 2}
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (2, 4, 7, 6))
    w = rng.uniform(-1, 1, (6, 2, 3, 2))
    out = workloads.conv_reference([x, w], layout="NCHW", **kwargs)
    padded = np.pad(x, [(0, 0), (0, 0), (1, 2), (0, 1)])
    expected = np.zeros(out.shape)
    for n, o, y, xx in np.ndindex(*out.shape):
        g = o // 3
        for c, ky, kx in np.ndindex(2, 3, 2):
            tap = padded[n, g * 2 + c, y * 2 + ky, xx + kx * 2]
            expected[n, o, y, xx] += tap * w[o, c, ky, kx]
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)
    assert out.shape == workloads.conv_output_shape(x.shape, w.shape, layout="NCHW", **kwargs)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"layout": "NHCW"}, "layout must be one of"),
        ({"data_shape": (2, 21, 19)}, "data_shape must have 4 extents"),
        ({"weight_shape": (3, 3, 5, 7)}, "I axis (HWIO layout) must hold channels / groups"),
        ({"stride": (1, 2, 1)}, "stride must be an int >= 1 or 2 of them"),
        ({"padding": -1}, "padding must be an int >= 0"),
        ({"groups": 3}, "groups=3 must divide the input channels (8)"),
        ({"data_shape": (2, 2, 2, 8), "padding": 0}, "dilated window 3 is wider"),
        ({"epilogue": "relu"}, "epilogue must be one of"),
    ],
)
def test_conv_rejects_invalid_arguments(kwargs, message):
    with pytest.raises(workloads.WorkloadError, match=re.escape(message)):
        workloads.conv(**{**CONV_CASES["conv2d-nhwc-stride2-pad1"], **kwargs})


def test_conv2d_refuses_a_1d_layout():
    with pytest.raises(workloads.WorkloadError, match="layout of a 2-D convolution"):
        workloads.conv2d((1, 9, 3), (3, 3, 4), layout="NWC")

"""A reduction's axes as a GEMM's, and the depthwise criterion (issue 31, item 7).

Each fixture is a 1-D convolution ``out[n, p, co]`` over a window ``rl`` (and channels ``rc``)
written the way its family writes it; :func:`gemm_axes` names each axis's role in
``C[S, I, J] += A[S, I, K] * B[S, J, K]`` and :func:`is_depthwise` says whether each output
reads one input channel.
"""

import pytest
from tvm.script import tirx as T

from tvm_streamk.analysis import blocks_under, gemm_axes, is_depthwise, is_reduction


# fmt: off
@T.prim_func(s_tir=True)
def te_style_conv(x: T.Buffer((2, 10, 4), "float32"), w: T.Buffer((3, 4, 8), "float32"),
                  out: T.Buffer((2, 8, 8), "float32")):
    # TVM's te_workload reads input channel co // CO * CI + rc even ungrouped: rc, as co < 8.
    for n, p, co, rl, rc in T.grid(2, 8, 8, 3, 4):
        with T.sblock("conv"):
            vn, vp, vco, vrl, vrc = T.axis.remap("SSSRR", [n, p, co, rl, rc])
            with T.init():
                out[vn, vp, vco] = T.float32(0)
            out[vn, vp, vco] = (out[vn, vp, vco]
                                + x[vn, vp + vrl, vco // 8 * 4 + vrc] * w[vrl, vrc, vco])


@T.prim_func(s_tir=True)
def grouped_conv(x: T.Buffer((2, 10, 8), "float32"), w: T.Buffer((3, 2, 8), "float32"),
                 out: T.Buffer((2, 8, 8), "float32")):
    # 4 groups of 2 input and 2 output channels: each output sums over 2 input channels.
    for n, p, co, rl, rc in T.grid(2, 8, 8, 3, 2):
        with T.sblock("conv"):
            vn, vp, vco, vrl, vrc = T.axis.remap("SSSRR", [n, p, co, rl, rc])
            with T.init():
                out[vn, vp, vco] = T.float32(0)
            out[vn, vp, vco] = (out[vn, vp, vco]
                                + x[vn, vp + vrl, vco // 2 * 2 + vrc] * w[vrl, vrc, vco])


@T.prim_func(s_tir=True)
def depthwise_conv(x: T.Buffer((2, 10, 4), "float32"), w: T.Buffer((3, 8), "float32"),
                   out: T.Buffer((2, 8, 8), "float32")):
    # Channel multiplier 2: output channel co reads input channel co // 2 alone.
    for n, p, co, rl in T.grid(2, 8, 8, 3):
        with T.sblock("conv"):
            vn, vp, vco, vrl = T.axis.remap("SSSR", [n, p, co, rl])
            with T.init():
                out[vn, vp, vco] = T.float32(0)
            out[vn, vp, vco] = out[vn, vp, vco] + x[vn, vp + vrl, vco // 2] * w[vrl, vco]


@T.prim_func(s_tir=True)
def batched_matmul(a: T.Buffer((4, 8, 16), "float32"), b: T.Buffer((4, 16, 8), "float32"),
                   c: T.Buffer((4, 8, 8), "float32")):
    for s, i, j, k in T.grid(4, 8, 8, 16):
        with T.sblock("bmm"):
            vs, vi, vj, vk = T.axis.remap("SSSR", [s, i, j, k])
            with T.init():
                c[vs, vi, vj] = T.float32(0)
            c[vs, vi, vj] = c[vs, vi, vj] + a[vs, vi, vk] * b[vs, vk, vj]


@T.prim_func(s_tir=True)
def window_max(x: T.Buffer((2, 10, 4), "float32"), out: T.Buffer((2, 8, 4), "float32")):
    for n, p, c, rl in T.grid(2, 8, 4, 3):
        with T.sblock("pool"):
            vn, vp, vc, vrl = T.axis.remap("SSSR", [n, p, c, rl])
            with T.init():
                out[vn, vp, vc] = T.float32(-3.4e38)
            out[vn, vp, vc] = T.max(out[vn, vp, vc], x[vn, vp + vrl, vc])
# fmt: on


def _reduction(func):
    (block,) = [b for b in blocks_under(func.body) if is_reduction(b)]
    return block


def _roles(func) -> dict:
    axes = gemm_axes(_reduction(func))
    roles = ("batch", "i", "j", "k", "unit")
    return {role: [v.name for v in getattr(axes, role)] for role in roles}


@pytest.mark.parametrize(
    "func,roles,depthwise",
    [
        pytest.param(
            te_style_conv,
            {"batch": [], "i": ["vn", "vp"], "j": ["vco"], "k": ["vrl", "vrc"], "unit": []},
            False,
            id="te-style-conv",
        ),
        pytest.param(
            grouped_conv,
            {"batch": ["vco"], "i": ["vn", "vp"], "j": [], "k": ["vrl", "vrc"], "unit": []},
            False,
            id="grouped-conv",
        ),
        pytest.param(
            depthwise_conv,
            {"batch": ["vco"], "i": ["vn", "vp"], "j": [], "k": ["vrl"], "unit": []},
            True,
            id="depthwise-conv",
        ),
        pytest.param(
            batched_matmul,
            {"batch": ["vs"], "i": ["vi"], "j": ["vj"], "k": ["vk"], "unit": []},
            False,
            id="batched-matmul",
        ),
    ],
)
def test_roles_and_depthwise(func, roles, depthwise):
    assert _roles(func) == roles
    assert is_depthwise(_reduction(func)) is depthwise


def test_a_max_is_no_gemm():
    assert gemm_axes(_reduction(window_max)) is None
    assert not is_depthwise(_reduction(window_max))

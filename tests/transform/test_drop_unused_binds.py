"""``DropUnusedBinds``: the bindings of a persistent kernel that nothing reads leave its code
(issue 31, item 8). With one whole tile per block the persistent kernel's OpenCL was the
data-parallel kernel's plus nine dead scalars, and pip's PoCL ran it 30% slower
(``tests/transform/test_hot_loop.py::test_time_on_pip_pocl``, marked slow). A kernel the
project does not rewrite keeps TVM's code, dead bindings and all
(``tests/transform/test_runtime_tiles.py::test_data_parallel_leaves_the_kernel_as_written``)."""

import re

import tvm
from tvm.script import tirx as T

import tvm_streamk
from tests.helpers import A100
from tests.kernels import dlight_gemm
from tvm_streamk.transform.drop_unused_binds import drop_unused_binds

OPENCL = tvm.target.Target("opencl")


def _source(mod, pipeline: str) -> str:
    lib = tvm.compile(mod, target=OPENCL, tir_pipeline=pipeline)
    return lib.mod.imports[0].inspect_source()


def _normalised(source: str) -> str:
    return re.sub(r"cse_v\d+", "CSE", source).replace("ax3_0_sk", "ax3_0")


def test_nothing_split_builds_the_data_parallel_kernel_line_for_line():
    dp, _ = dlight_gemm(96, 64, 1024, A100)
    sk, block = dlight_gemm(96, 64, 1024, A100)
    plan = tvm_streamk.stream_k(
        sk, block, policy="stream_k", num_sms=3, target=A100, blocks_per_sm=1
    )
    assert not plan.split_tiles, plan
    found = _source(sk.mod, "tvm_streamk")
    assert "sk_lo" not in found and "sk_full" not in found
    assert _normalised(found) == _normalised(_source(dp.mod, "default"))


def test_a_split_keeps_the_bindings_it_reads():
    sk, block = dlight_gemm(96, 64, 1024, A100)
    plan = tvm_streamk.stream_k(
        sk, block, policy="stream_k", num_sms=2, target=A100, blocks_per_sm=1
    )
    assert plan.split_tiles, plan
    # The middle tile is walked by two blocks: each reads its segment loop's variable.
    assert "int sk_segment = " in _source(sk.mod, "tvm_streamk")


def test_only_unread_pure_bindings_go():
    # TVMScript bindings, unread by design.
    @T.prim_func
    def func(a: T.handle):
        A = T.match_buffer(a, (4,), "int32")
        unused: T.let[T.int32] = A[0] * 2  # noqa: F841
        chained: T.let[T.int32] = A[1] + 1
        unread: T.let[T.int32] = chained * 3  # noqa: F841
        kept: T.let[T.int32] = A[2] + 5
        selected: T.let[T.int32] = T.if_then_else(A[1] > 0, A[1], 0)  # noqa: F841
        called: T.let[T.int32] = T.call_extern("int32", "side_effect", A[3])  # noqa: F841
        A[0] = kept

    script = drop_unused_binds(func).script()
    for name in ("unused", "chained", "unread", "selected"):
        assert f"{name}: T.let" not in script, script
    for name in ("kept", "called"):
        assert f"{name}: T.let" in script, script

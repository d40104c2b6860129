"""Structural test: the lowered IR of one small GEMM equals the committed expected TVMScript.

The expected function was printed by the installed TVM from ``tvm_streamk.lower`` and reviewed:
64x48x24 GEMM, 32x16 tiles of 8-wide K panels (2x3 tiles, 3 panels), 4 blocks. The 18 iterations
split 4/5/4/5: blocks start at iterations 0, 4, 9, 13, so tiles 1 and 4 are split and zeroed.
"""

import tvm
from tvm.script import tirx as T

import tvm_streamk
from tests.helpers import OPENCL
from tvm_streamk import workloads


# fmt: off
@T.prim_func(s_tir=True)
def expected_stream_k(A: T.Buffer((64, 24), "float32"), B: T.Buffer((24, 48), "float32"), C: T.Buffer((64, 48), "float32")):
    T.func_attr({"tirx.noalias": True, "tvm_streamk.persistent": True})
    # with T.sblock("root"):
    C_local = T.sblock_alloc_buffer((64, 48), scope="local")
    A_shared = T.sblock_alloc_buffer((64, 24), scope="shared")
    B_shared = T.sblock_alloc_buffer((24, 48), scope="shared")
    for sk_zero_block in T.thread_binding(4, thread="blockIdx.x"):
        sk_lo: T.let[T.int32] = sk_zero_block * 18 // 4
        sk_hi: T.let[T.int32] = (sk_zero_block * 18 + 18) // 4
        if sk_lo < sk_hi and sk_lo % 3 != 0:
            sk_zero_tile: T.let[T.int32] = sk_lo // 3
            i_0: T.let[T.int32] = sk_zero_tile // 3
            j_0: T.let[T.int32] = sk_zero_tile % 3
            for i_1 in T.thread_binding(8, thread="threadIdx.y"):
                for j_1 in T.thread_binding(4, thread="threadIdx.x"):
                    for ax0, ax1 in T.grid(4, 4):
                        with T.sblock("C_local_sk_zero"):
                            v0 = T.axis.spatial(64, i_0 * 32 + i_1 * 4 + ax0)
                            v1 = T.axis.spatial(48, j_0 * 16 + j_1 * 4 + ax1)
                            T.reads()
                            T.writes(C[v0, v1])
                            C[v0, v1] = T.float32(0.0)
    for sk_block in T.thread_binding(4, thread="blockIdx.x"):
        sk_lo: T.let[T.int32] = sk_block * 18 // 4
        sk_hi: T.let[T.int32] = (sk_block * 18 + 18) // 4
        for sk_segment in range((sk_hi + 2) // 3 - sk_lo // 3):
            sk_tile: T.let[T.int32] = sk_lo // 3 + sk_segment
            sk_k_begin: T.let[T.int32] = T.max(sk_lo - sk_tile * 3, 0)
            sk_k_end: T.let[T.int32] = T.min(sk_hi - sk_tile * 3, 3)
            i_0: T.let[T.int32] = sk_tile // 3
            j_0: T.let[T.int32] = sk_tile % 3
            sk_full: T.let[T.bool] = sk_k_begin == 0 and sk_k_end == 3
            for i_1 in T.thread_binding(8, thread="threadIdx.y"):
                for j_1 in T.thread_binding(4, thread="threadIdx.x"):
                    for i_2_init, j_2_init in T.grid(4, 4):
                        with T.sblock("C_init"):
                            vi = T.axis.spatial(64, i_0 * 32 + i_1 * 4 + i_2_init)
                            vj = T.axis.spatial(48, j_0 * 16 + j_1 * 4 + j_2_init)
                            T.reads()
                            T.writes(C_local[vi - i_0 * 32, vj - j_0 * 16])
                            C_local[vi - i_0 * 32, vj - j_0 * 16] = T.float32(0.0)
                    for k_0_sk in T.serial(sk_k_end - sk_k_begin, unroll=False):
                        for ax0_ax1_fused_0 in range(8):
                            for ax0_ax1_fused_1 in T.thread_binding(8, thread="threadIdx.y"):
                                for ax0_ax1_fused_2 in T.thread_binding(4, thread="threadIdx.x"):
                                    with T.sblock("A_shared"):
                                        v0 = T.axis.spatial(64, i_0 * 32 + (ax0_ax1_fused_0 * 32 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) // 8)
                                        v1 = T.axis.spatial(24, (k_0_sk + sk_k_begin) * 8 + (ax0_ax1_fused_0 * 32 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) % 8)
                                        T.reads(A[v0, v1])
                                        T.writes(A_shared[v0, v1])
                                        A_shared[v0, v1] = A[v0, v1]
                        for ax0_ax1_fused_0 in range(4):
                            for ax0_ax1_fused_1 in T.thread_binding(8, thread="threadIdx.y"):
                                for ax0_ax1_fused_2 in T.thread_binding(4, thread="threadIdx.x"):
                                    with T.sblock("B_shared"):
                                        v0 = T.axis.spatial(24, (k_0_sk + sk_k_begin) * 8 + (ax0_ax1_fused_0 * 32 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) // 16)
                                        v1 = T.axis.spatial(48, j_0 * 16 + (ax0_ax1_fused_0 * 32 + ax0_ax1_fused_1 * 4 + ax0_ax1_fused_2) % 16)
                                        T.reads(B[v0, v1])
                                        T.writes(B_shared[v0, v1])
                                        B_shared[v0, v1] = B[v0, v1]
                        for k_1, i_2, j_2 in T.grid(8, 4, 4):
                            with T.sblock("C_update"):
                                vi = T.axis.spatial(64, i_0 * 32 + i_1 * 4 + i_2)
                                vj = T.axis.spatial(48, j_0 * 16 + j_1 * 4 + j_2)
                                vk = T.axis.reduce(24, (k_0_sk + sk_k_begin) * 8 + k_1)
                                T.reads(C_local[vi - i_0 * 32, vj - j_0 * 16], A_shared[vi, vk], B_shared[vk, vj])
                                T.writes(C_local[vi - i_0 * 32, vj - j_0 * 16])
                                C_local[vi - i_0 * 32, vj - j_0 * 16] = C_local[vi - i_0 * 32, vj - j_0 * 16] + T.Cast("float32", A_shared[vi, vk]) * T.Cast("float32", B_shared[vk, vj])
                    for ax0, ax1 in T.grid(4, 4):
                        with T.sblock("C_local"):
                            v0 = T.axis.spatial(64, i_0 * 32 + i_1 * 4 + ax0)
                            v1 = T.axis.spatial(48, j_0 * 16 + j_1 * 4 + ax1)
                            T.reads(C_local[v0 - i_0 * 32, v1 - j_0 * 16])
                            T.writes(C[v0, v1])
                            if sk_full:
                                C[v0, v1] = C_local[v0 - i_0 * 32, v1 - j_0 * 16]
                            else:
                                T.call_extern("float32", "atomic_add", T.address_of(C[v0, v1]), C_local[v0 - i_0 * 32, v1 - j_0 * 16])# fmt: on


def _lowered():
    sch = workloads.reference_schedule(workloads.gemm(64, 48, 24), bm=32, bn=16, bk=8, tm=4, tn=4)
    tvm_streamk.stream_k(sch, "C_update", num_sms=4, target=OPENCL)
    return tvm_streamk.lower(sch, OPENCL)["main"].without_attr("target")


def test_lowered_ir_matches_expected():
    expected = expected_stream_k.without_attr("global_symbol")
    tvm.ir.assert_structural_equal(_lowered().without_attr("global_symbol"), expected)


def test_expected_split_tiles_agree_with_the_plan():
    plan = tvm_streamk.plan(6, 3, 4, policy="stream_k")
    assert plan.split_tiles == (1, 4)

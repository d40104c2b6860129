"""Stream-K on einsum-style contractions as dlight's GPU rules schedule them (issue 14, items 3, 5).

dlight's ``gpu.Matmul`` fuses each index class of a two-operand contraction into one GEMM axis
(S: in both operands and the output, I: A and the output, J: B and the output, K: summed), so a
multi-index contraction such as ``abcd,cdef->abef`` is one GEMM of fused extents. Every case is
uneven against dlight's 32 x 64 x 16 tiles and checked on PoCL against ``np.einsum`` in float64.
The default suite runs every contraction with the ``stream_k`` policy and both fix-ups, and the
whole policy x fix-up matrix on the attention-score contraction; ``-m slow`` runs the matrix on
every contraction.
"""

import re

import pytest
import tvm

import tvm_streamk
from tests.contraction_cases import CONTRACTION_CASES
from tests.dlight_sites import (
    A100,
    DEFAULT_RULES,
    check_numeric,
    check_persistent,
    decision_matrix,
    schedule_with,
)
from tvm_streamk import workloads
from tvm_streamk.analysis import first_site
from tvm_streamk.errors import StreamKError

on_every_pocl = pytest.mark.usefixtures("opencl")

CASES = CONTRACTION_CASES
MATRIX_FAMILY = "attention-scores"


def _case(family):
    spec, sizes = CASES[family]
    return workloads.contraction(spec, **sizes), lambda args: workloads.contraction_reference(
        spec, args
    )


def _fast(family, policy, fixup) -> bool:
    return policy == "stream_k" or family == MATRIX_FAMILY


@on_every_pocl
@pytest.mark.parametrize("family,policy,fixup", list(decision_matrix(CASES, _fast)))
def test_contraction_matches_float64(family, policy, fixup):
    check_numeric(*_case(family), policy, fixup)


@pytest.mark.parametrize("family", list(CASES))
def test_contraction_kernel_is_persistent(family):
    check_persistent(_case(family)[0])


# Contractions that are not a GEMM to dlight's Matmul: no J axis (matrix-vector) or neither I
# nor J (a batched dot product). dlight's default rule list hands them to other rules.
NOT_GEMM = {
    "matrix-vector": ("mk,k->m", {"m": 50, "k": 700}, "GEMV"),
    "batched-dot": ("bk,bk->b", {"b": 50, "k": 700}, "Reduction"),
}


@pytest.mark.parametrize("family", list(NOT_GEMM))
def test_non_gemm_contraction_goes_to_its_rule(family):
    spec, sizes, rule = NOT_GEMM[family]
    _, taken = schedule_with(workloads.contraction(spec, **sizes), *DEFAULT_RULES)
    assert taken == rule


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="matrix-vector has no J axis: dlight's gpu.Matmul declines, gpu.GEMV schedules it "
    "(a cross-thread reduction of K) and first_site finds no Stream-K site there",
)
def test_matrix_vector_gets_a_stream_k_site():
    spec, sizes, _ = NOT_GEMM["matrix-vector"]
    scheduled, _ = schedule_with(workloads.contraction(spec, **sizes), *DEFAULT_RULES)
    assert first_site(scheduled) is not None, "no Stream-K site in dlight's GEMV schedule"


def test_batched_dot_cross_thread_write_back_is_refused():
    # dlight's gpu.Reduction reduces per-thread rfactor partials across threadIdx.x after the
    # panel loop. Stream-K accepted it once, and its rewritten write-back lost the allreduce:
    # every thread added into out[b] unsynchronised (wrong split tiles on PoCL 3.1, a race on a
    # GPU). The analysis now refuses such a write-back.
    spec, sizes, _ = NOT_GEMM["batched-dot"]
    scheduled, _ = schedule_with(workloads.contraction(spec, **sizes), *DEFAULT_RULES)
    assert first_site(scheduled) is None
    sch = tvm.s_tir.Schedule(scheduled)
    with pytest.raises(StreamKError, match=r"\[global-writeback\].*'out' is itself a reduction"):
        tvm_streamk.stream_k(
            sch, "out_rf_update", target=A100, blocks_per_sm=1, fixup="workspace", num_sms=3
        )


def test_contraction_reference_is_einsum_in_float64():
    func = workloads.contraction("abcd,cdef->abef", a=2, b=3, c=4, d=5, e=3, f=2)
    args = workloads.random_args(func)
    ref = workloads.contraction_reference("abcd,cdef->abef", args)
    a, b = (x.astype("float64") for x in args[:2])
    expected = a.reshape(6, 20) @ b.reshape(20, 6)
    assert ref.dtype == "float64" and ref.shape == (2, 3, 3, 2)
    assert abs(ref.reshape(6, 6) - expected).max() < 1e-12


@pytest.mark.parametrize(
    "spec,sizes,message",
    [
        ("bmk,bkn", {"b": 1, "m": 1, "k": 1, "n": 1}, "spec must read 'A,B->OUT'"),
        ("ab,bc,cd->ad", {"a": 1, "b": 1, "c": 1, "d": 1}, "spec must read 'A,B->OUT'"),
        ("mm,mn->mn", {"m": 2, "n": 2}, "repeats an index (mm)"),
        ("mk,kn->mz", {"m": 2, "n": 2, "k": 2}, "output indices ['z']"),
        ("mk,kn->mn", {"m": 2, "k": 2}, "found none for ['n']"),
        ("mk,kn->mn", {"m": 2, "k": 2, "n": 2, "q": 3}, "sizes ['q'] name no index"),
        ("mk,kn->mn", {"m": 2, "k": 0, "n": 2}, "k must be a positive int"),
    ],
)
def test_contraction_rejects_invalid_specs(spec, sizes, message):
    with pytest.raises(workloads.WorkloadError, match=re.escape(message)):
        workloads.contraction(spec, **sizes)

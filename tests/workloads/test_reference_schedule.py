"""The reference schedule at degenerate shapes: what the knob fuzz draws, every shape schedules.

An A or B panel of a single element (M or N of 1, with K of 1) has no loop below the panel
loop once its copy is computed there; ``sch.fuse`` of no loops stopped the schedule with TVM's
"'fuse' requires at least 1 loop(s)". The copy now gets a unit loop to split over the threads.
"""

import numpy as np
import pytest

import tvm_streamk
from tests.helpers import FP32_TOL, OPENCL
from tvm_streamk import pocl, workloads

pytestmark = pytest.mark.usefixtures("opencl")


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 1, 1), (1, 7, 1)])
@pytest.mark.parametrize("policy", ["data_parallel", "stream_k"])
def test_a_one_element_panel_is_staged(m, n, k, policy):
    func = workloads.gemm(m, n, k)
    sch = workloads.reference_schedule(func, bm=8, bn=8, bk=4, tm=2, tn=2)
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=OPENCL, policy=policy)
    args = workloads.random_args(func)
    assert np.isnan(args[-1]).all()
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    assert workloads.relative_error(out, workloads.reference(func, args)) <= FP32_TOL


def test_the_error_of_a_sum_that_cancels_is_relative_to_its_terms():
    # One output of 1 - 1 + 0.001: a rounding-sized difference (1e-7) is 1e-4 of the value
    # and 5e-8 of the terms; a lost term (the 0.001) is 1.0 of the value and 5e-4 of the
    # terms. The fuzz tests' fresh inputs draw such outputs (M = N = 1).
    func = workloads.gemm(1, 1, 3)
    args = [np.array([[1.0, -1.0, 0.001]]), np.ones((3, 1)), np.full((1, 1), np.nan)]
    ref = workloads.reference(func, args)
    scale = workloads.magnitude(lambda a: workloads.reference(func, a), args)
    assert scale == pytest.approx(2.001)
    assert workloads.relative_error(ref + 1e-7, ref) > 1e-5
    assert workloads.relative_error(ref + 1e-7, ref, scale) < 1e-7
    assert workloads.relative_error(ref - 0.001, ref, scale) > 1e-4
    assert workloads.relative_error(np.full_like(ref, np.nan), ref, scale) == float("inf")

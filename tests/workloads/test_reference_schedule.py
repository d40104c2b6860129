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

"""The persistent kernel keeps the data-parallel kernel's register tile and shared panels.

TVM sizes a thread's accumulator and a block's shared-memory panels from the index regions it
can bound. Stream-K indices are functions of a tile index computed at run time; if the rewrite
left them in a form TVM bounds by the whole matrix, the kernel would still compute the right
numbers on a small case but would need megabytes of shared memory and spill its accumulator on a
real GPU. This checks the sizes in the generated CUDA for a large, quantisation-bound GEMM.
"""

import re

import pytest
import tvm

import tvm_streamk
from tests.helpers import H100
from tvm_streamk import workloads

BM = BN = 32
BK = 8
TM = TN = 4


def _array_sizes(source: str, name: str) -> list[int]:
    return [int(n) for n in re.findall(rf"\b{name}\w*_ptr\[(\d+)\];", source)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"policy": "stream_k", "fixup": "atomic"},
        {"policy": "stream_k", "fixup": "workspace"},
        {"policy": "hybrid", "variant": "one_tile", "fixup": "atomic"},
        {"policy": "hybrid", "variant": "two_tile", "fixup": "workspace"},
        {"policy": "split_k", "splits": 3, "fixup": "atomic"},
        {"policy": "split_k", "splits": 4, "fixup": "workspace"},
        # The grouped tile order divides by the last group's height (a min): its coordinates
        # are read back bounded, or the buffers come out the size of the matrix.
        {"policy": "stream_k", "fixup": "workspace", "group": 4},
        {"policy": "hybrid", "variant": "two_tile", "fixup": "atomic", "group": 3},
        {"policy": "split_k", "splits": 3, "fixup": "atomic", "group": 2},
    ],
    ids=lambda k: "-".join(map(str, k.values())),
)
def test_register_tile_and_shared_panels_keep_their_size(kwargs):
    # 133 x 8 tiles of 32 x 32 on 132 SMs: one tile more than eight full waves.
    sch = workloads.reference_schedule(
        workloads.gemm(133 * BM, 8 * BN, 64 * BK), bm=BM, bn=BN, bk=BK, tm=TM, tn=TN
    )
    tvm_streamk.stream_k(sch, "C_update", num_sms=132, target=H100, **kwargs)
    source = tvm.compile(sch.mod, target=H100, tir_pipeline="tvm_streamk").mod.imports[0]
    source = source.inspect_source()
    accumulators = _array_sizes(source, "C_local")
    assert accumulators and all(n == TM * TN for n in accumulators), accumulators
    shared = _array_sizes(source, "A_shared") + _array_sizes(source, "B_shared")
    assert shared and all(n == BM * BK for n in shared), shared
    # The accumulator is indexed by compile-time constants after unrolling: no run-time offset.
    for line in source.splitlines():
        if "C_local" in line and "blockIdx" in line:
            index = line.split("C_local")[1].split("]")[0]
            assert "blockIdx" not in index, line.strip()[:200]

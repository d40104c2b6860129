"""``CancelStagingOffsets``: the staging buffers' indices of a run-time walk lose the tile
offset that buffer compaction wrote through the range's register copy.

Structural, without nvcc: the K loop's SASS is held against data-parallel's by the ptxas suite
(``tests/transform/test_hot_loop.py``), and that the pass leaves a hybrid's unit ranges alone
by its register checks (``tests/transform/test_rule_resources.py``: taking them spilled 16-36
bytes in four static hybrids); here the lowered IR shows what the pass changes.
"""

import tvm
from tvm import tirx

import tvm_streamk
from tests.helpers import SM_TARGETS
from tests.kernels import dynamic_m_matmul
from tvm_streamk import pipeline
from tvm_streamk._compat import BufferLoadNode, get_tir_pipeline, loaded_buffer, structural_walk
from tvm_streamk.transform.cancel_staging_offsets import cancel_offsets

TARGET = tvm.target.Target(SM_TARGETS["sm_90"])


def _lowered(sch, monkeypatch=None) -> tvm.IRModule:
    if monkeypatch is not None:
        monkeypatch.setattr(pipeline, "CancelStagingOffsets", lambda mod: mod)
    func = sch.mod["main"].with_attr("global_symbol", "main")
    mod = tvm.IRModule({tvm.ir.GlobalVar("main"): func})
    lower, _, _ = get_tir_pipeline(pipeline.NAME)
    return lower(tvm.tirx.transform.BindTarget(TARGET)(mod))


def _staging_indices_reading_copies(func) -> int:
    """Shared-memory accesses whose index loads a register copy (``*_local[0]``)."""
    found = []

    def uses_copy(index) -> bool:
        hit = []
        structural_walk(
            index,
            [(BufferLoadNode, lambda ld: hit.append(str(loaded_buffer(ld).name)))],
        )
        return any(name.startswith("sk_") and name.endswith("_local") for name in hit)

    def on_load(load) -> None:
        if str(loaded_buffer(load).scope()) == "shared" and any(uses_copy(i) for i in load.indices):
            found.append(load)

    structural_walk(func.body, [(BufferLoadNode, on_load)])
    return len(found)


def _functions(mod):
    return [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]


def test_a_run_time_walk_s_staging_indices_lose_the_tile_offset(monkeypatch):
    sch, block = dynamic_m_matmul(TARGET, 1024)
    tvm_streamk.stream_k(sch, block, target=TARGET, policy="stream_k", fixup="workspace")
    with monkeypatch.context() as patch:
        before = _lowered(sch, patch)
    counts = [_staging_indices_reading_copies(f) for f in _functions(before)]
    assert sum(counts) > 0, counts
    after = [cancel_offsets(f) for f in _functions(before)]
    assert [_staging_indices_reading_copies(f) for f in after] == [0] * len(after)
    # The pipeline runs the pass.
    assert sum(_staging_indices_reading_copies(f) for f in _functions(_lowered(sch))) == 0

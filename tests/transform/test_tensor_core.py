"""Tensor-core fragment accumulators: the aligned-split decomposition with the workspace fix-up.

These kernels cannot run on PoCL (no tensor cores); they are checked structurally, compiled with
nvcc to cubin, and run numerically only where a CUDA GPU is usable (marked ``gpu``).
"""

import shutil
import subprocess

import numpy as np
import pytest
import tvm

import tvm_streamk
from tests.kernels import FRAGMENT_TARGETS, dlight_fp16_matmul, fragment_update_block
from tvm_streamk import ptxas
from tvm_streamk.analysis import analyze, blocks_under, first_site
from tvm_streamk.decision import record as ann
from tvm_streamk.errors import StreamKError


@pytest.fixture(params=sorted(FRAGMENT_TARGETS))
def wmma(request):
    target, sms = FRAGMENT_TARGETS[request.param]
    sch = dlight_fp16_matmul(512, 384, 1024, target)
    return request.param, target, sms, sch, fragment_update_block(sch)


def test_fragment_accumulator_is_found_with_its_staging_buffer(wmma):
    _, _, _, sch, block = wmma
    site = analyze(next(iter(sch.mod.functions.values())), block)
    assert site.fragment_accumulator
    assert site.stage is not None and site.stage.scope().startswith("shared")
    assert [wb.output.name for wb in site.writebacks] == ["matmul"]


def test_aligned_split_structure(wmma):
    _, target, sms, sch, block = wmma
    plan = tvm_streamk.stream_k(sch, block, num_sms=sms, policy="split_k", splits=4, target=target)
    assert (plan.policy, plan.splits, plan.grid) == ("split_k", 4, plan.tiles * 4)
    assert str(sch.get(sch.get_sblock(block)).annotations[ann.KEY_FIXUP]) == "workspace"
    lowered = tvm_streamk.lower(sch, target)
    func = next(iter(lowered.functions.values()))
    text = func.script()
    site = analyze(next(iter(sch.mod.functions.values())), block)
    # Every K-panel loop keeps the constant trip count P / S (software pipelining still applies).
    panel = f'T.serial(T.int64({site.panels // 4}), annotations={{"software_pipeline_order"'
    assert panel in text
    # The split lives in blockIdx.z; no persistent worker loop.
    assert 'T.thread_binding(T.int64(4), thread="blockIdx.z")' in text
    assert "sk_segment" not in text
    # The staging tile goes through the workspace and the tile's arrival counter.
    assert "sk_workspace" in text and "sk_arrivals" in text and "atomicAdd" in text


def test_stream_k_policy_picks_an_aligned_split(wmma):
    _, target, sms, sch, block = wmma
    plan = tvm_streamk.stream_k(sch, block, num_sms=sms, target=target)
    assert plan.policy in ("split_k", "data_parallel")
    if plan.policy == "split_k":
        assert plan.panels % plan.splits == 0


def test_split_not_dividing_the_panels_is_refused(wmma):
    _, target, sms, sch, block = wmma
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(sch, block, num_sms=sms, policy="split_k", splits=3, target=target)
    assert info.value.condition == "fragment-aligned-split"
    assert "divides the panel count" in str(info.value)


def test_atomic_fixup_is_refused_for_fragments(wmma):
    _, target, sms, sch, block = wmma
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(sch, block, num_sms=sms, fixup="atomic", target=target)
    assert "workspace" in str(info.value)


def test_the_inner_tensorized_block_points_to_its_blockized_parent(wmma):
    _, target, sms, sch, block = wmma
    inner = [
        b.name_hint
        for b in blocks_under(sch.get(sch.get_sblock(block)).body)
        if b.name_hint != block
    ]
    assert inner, f"{block!r} holds no inner block"
    with pytest.raises(StreamKError) as info:
        tvm_streamk.stream_k(sch, inner[0], num_sms=sms, policy="split_k", splits=4, target=target)
    assert info.value.condition == "reduction-block"
    assert f"Pass its blockized parent {block!r}" in str(info.value)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_compiles_to_cubin(wmma, tmp_path):
    arch, target, sms, sch, block = wmma
    tvm_streamk.stream_k(sch, block, num_sms=sms, policy="split_k", splits=4, target=target)
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    source = lib.mod.imports[0].inspect_source()
    assert "wmma::mma_sync" in source and "__ldcg" in source and "__threadfence" in source
    cu = tmp_path / "kernel.cu"
    cu.write_text(source)
    result = subprocess.run(
        ["nvcc", "-cubin", f"-arch={arch}", str(cu), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "kernel.cubin").stat().st_size > 0


def _cuda_usable() -> bool:
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - any failure means no usable GPU
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_usable(), reason="no usable CUDA GPU")
def test_wmma_stream_k_numerics_on_gpu():
    target, sms = FRAGMENT_TARGETS["sm_80"]
    sch = dlight_fp16_matmul(512, 384, 1024, target)
    block = fragment_update_block(sch)
    tvm_streamk.stream_k(sch, block, num_sms=sms, policy="split_k", splits=4, target=target)
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    dev = tvm.cuda(0)
    rng = np.random.default_rng()
    a = rng.uniform(-1, 1, (512, 1024)).astype("float16")
    b = rng.uniform(-1, 1, (1024, 384)).astype("float16")
    c = np.full((512, 384), np.nan, dtype="float16")
    args = [tvm.runtime.tensor(x, dev) for x in (a, b, c)]
    lib[next(iter(sch.mod.functions.keys())).name_hint](*args)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    out = args[2].numpy().astype(np.float64)
    assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) < 2e-2  # fp16 accumulation


def _metaschedule_tensorcore_sample(seed: int):
    """A MetaSchedule ``cuda-tensorcore`` design-space sample with a fragment accumulator."""
    import tvm.s_tir.tensor_intrin  # noqa: F401 - registers the WMMA intrinsics
    from tvm.s_tir import meta_schedule as ms

    from tvm_streamk import workloads

    target = tvm.target.Target("nvidia/nvidia-a100")
    func = workloads.gemm(512, 384, 1024, in_dtype="float16", out_dtype="float32")
    ctx = ms.TuneContext(
        mod=tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
        target=target,
        space_generator=ms.space_generator.PostOrderApply(
            sch_rules="cuda-tensorcore",
            postprocs="cuda-tensorcore",
            mutator_probs="cuda-tensorcore",
        ),
        task_name="gemm",
        rand_state=seed,
    )
    for space in ctx.generate_design_space():
        sch = space.copy()
        if not all(post.apply(sch) for post in ctx.space_generator.postprocs):
            continue
        site = first_site(sch.mod["main"])
        if site is not None and site.fragment_accumulator:
            return target, sch, site
    return None


def test_metaschedule_tensorcore_sample_takes_the_aligned_split():
    found = _metaschedule_tensorcore_sample(seed=3)
    assert found is not None, "the cuda-tensorcore design space must hold a WMMA candidate"
    target, sch, site = found
    splits = next(s for s in (4, 2) if site.panels % s == 0)
    baseline = sch.copy()
    plan = tvm_streamk.stream_k(
        sch, site.block.name_hint, num_sms=108, policy="split_k", splits=splits, target=target
    )
    assert plan.grid == site.tiles * splits
    text = next(iter(tvm_streamk.lower(sch, target).functions.values())).script()
    assert 'thread="blockIdx.z"' in text and "sk_workspace" in text and "sk_segment" not in text
    # TVM 0.27's StorageRewrite breaks this build (tvm_streamk.pipeline.needs_safe_reuse); the
    # project's pipelines, and TVM's default once tvm_streamk is imported, work around it.
    assert tvm_streamk.pipeline.needs_safe_reuse(baseline.mod)
    baseline_lib = tvm.compile(baseline.mod, target=target)
    lib = tvm.compile(sch.mod, target=target, tir_pipeline="tvm_streamk")
    if ptxas.available():
        for built in (baseline_lib, lib):
            report = ptxas.resources(built.mod.imports[0].inspect_source(), "sm_80")
            assert report and all(k.spills == 0 for k in report.values()), report

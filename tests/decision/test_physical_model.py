"""The model in microseconds (``cost_model.physical``, ``gpu_specs``, ``traits``): its floor, its
margin, what it reads from kernels, and where its predictions reach users."""

import json
import math

import pytest

import tvm_streamk
from tests.helpers import H100, OPENCL
from tvm_streamk import cli, cost_model, decomposition, ptxas, run_time_choice, workloads
from tvm_streamk.analysis import analyze
from tvm_streamk.cost_model import GPU_SPECS, KernelTraits, predicted_time, price, priced
from tvm_streamk.decision import record
from tvm_streamk.explain import explain

H200 = "nvidia/nvidia-h200"
SHAPES = [
    (m, n, k) for m in (128, 512, 3000, 8192) for n in (128, 1000, 4096) for k in (64, 1024, 16384)
]


def _cost(m, n, k, gpu, dtype="float16", instruction="mma", fixup="workspace", tile=(128, 128, 32)):
    traits = KernelTraits(*tile, dtype, "float32", dtype, instruction, m, n, k)
    return priced(price(traits, GPU_SPECS[gpu], fixup))


def _tiles(m, n, k, tile=(128, 128, 32)):
    return math.ceil(m / tile[0]) * math.ceil(n / tile[1]), math.ceil(k / tile[2])


def test_every_gpu_figure_names_its_source():
    assert {"nvidia/nvidia-a100", "nvidia/nvidia-h100", H200, "nvidia/nvidia-b200"} <= set(
        GPU_SPECS
    )
    for name in ("nvidia/nvidia-h100-pcie", "nvidia/nvidia-l4", "nvidia/nvidia-l40s"):
        assert name in GPU_SPECS
    for spec in GPU_SPECS.values():
        # B200's L2 is not published; the model then assumes no L2 reuse across the GEMM.
        assert spec.sms > 0 and spec.hbm_gbps > 0 and (spec.l2_mb is None or spec.l2_mb > 0)
        assert spec.source.startswith("NVIDIA "), spec.name
        assert spec.peak_tflops("mma", "float16") > spec.peak_tflops("ffma", "float32")


@pytest.mark.parametrize("gpu", ["nvidia/nvidia-a100", "nvidia/nvidia-h100", H200])
@pytest.mark.parametrize("fixup", ["workspace", "atomic"])
def test_no_prediction_below_the_roofline(gpu, fixup):
    spec = GPU_SPECS[gpu]
    for m, n, k in SHAPES:
        cost = _cost(m, n, k, gpu, fixup=fixup)
        tiles, panels = _tiles(m, n, k)
        floor = cost.price.floor_us(tiles)
        for cand in cost_model.candidates(tiles, panels, spec.sms):
            assert predicted_time(cand, cost=cost, fixup=fixup) >= floor * (1 - 1e-9), (
                m,
                n,
                k,
                cand.label,
            )


def test_the_roofline_is_the_larger_of_math_and_bytes():
    spec = GPU_SPECS[H200]
    traits = KernelTraits(128, 128, 32, "float16", "float32", "float16", "mma", 4096, 4096, 4096)
    flops_us = 2 * 4096**3 / (spec.peak_tflops("mma", "float16") * 1e6)
    assert cost_model.roofline_us(traits, spec) == pytest.approx(flops_us)
    # A GEMV reads its weight once: bound by bytes, not FLOPs.
    gemv = KernelTraits(1, 128, 32, "float16", "float32", "float16", "mma", 1, 50176, 1000)
    bytes_us = (50176 * 1000 + 1000 + 50176) * 2 / (spec.hbm_gbps * 1e3)
    assert cost_model.roofline_us(gemv, spec) == pytest.approx(bytes_us)


def test_a_one_row_gemm_of_many_peers_per_tile_takes_stream_k():
    # Measured on the H200 (bench/gpu/results/2026-12-04-h200): dlight's fp32 tile (32 x 64,
    # 16-deep panels) of a 1 x 768 x 3072 GEMM, 12 tiles on 924 blocks (77 per tile), ran in
    # 19.6 us with atomics and 31.5 us with the workspace fix-up, against 187 us data-parallel.
    # The owner reads 76 partials back to back at their bytes, not 76 hand-offs. The model
    # predicts 189 us data-parallel, 26 us (workspace) and 24 us (atomic).
    for fixup in ("workspace", "atomic"):
        cost = _cost(1, 768, 3072, H200, "float32", "ffma", fixup, tile=(32, 64, 16))
        chosen = decomposition.plan(12, 192, 132, 7, cost=cost, fixup=fixup, saturation=4)
        dp = decomposition.plan(12, 192, 132, 7, policy="data_parallel")
        t_dp = predicted_time(dp, cost=cost, fixup=fixup, saturation=4)
        t = predicted_time(chosen, cost=cost, fixup=fixup, saturation=4)
        assert chosen.policy == "stream_k", chosen.reason
        assert 3.0 < t_dp / t < 12.0, (fixup, t_dp, t)


@pytest.mark.parametrize("fixup", ["workspace", "atomic"])
@pytest.mark.parametrize(("n", "k"), [(768, 3072), (3072, 768), (4096, 4096), (4096, 11008)])
def test_run_time_buckets_keep_stream_k_for_few_rows(n, k, fixup):
    # Measured on the H200: one dynamic-M build of dlight's fp32 tile (32 x 64, 16-deep panels,
    # 7 blocks per SM, saturation 4) ran 1.2 to 9.4x faster than data-parallel at 1 to 128
    # rows for these layers (docs/benchmarks.md). The buckets must keep Stream-K there.
    cost = _cost(0, n, k, H200, "float32", "ffma", fixup, tile=(32, 64, 16))
    buckets = run_time_choice.stream_k_buckets(k // 16, 132, 7, fixup, cost, 4)
    for rows in (1, 16, 100, 128):
        tiles = math.ceil(rows / 32) * math.ceil(n / 64)
        assert any(lo <= tiles <= hi for lo, hi in buckets), (rows, tiles, buckets)


def test_a_bandwidth_bound_gemv_gains_little_from_splitting():
    # docs/models.md used to predict 184x for this layer, counting iterations: its weight
    # has to come from memory whatever the split.
    cost = _cost(1, 50176, 1000, H200, "float32", "ffma", tile=(1, 128, 32))
    chosen = decomposition.plan(392, 32, 132, cost=cost)
    dp = decomposition.plan(392, 32, 132, policy="data_parallel")
    gain = predicted_time(dp, cost=cost) / predicted_time(chosen, cost=cost)
    assert gain < 2.0


@pytest.mark.parametrize("cost", [None, "priced"], ids=["units", "microseconds"])
def test_no_gain_without_split_work(cost):
    # TVM's depthwise DEP workload: 3136 tiles of one panel each on 132 SMs. A persistent
    # grid walks the same whole tiles in the same rounds: nothing to gain but launch constants.
    params = _cost(3136 * 32, 32, 32, "nvidia/nvidia-h100", "float32", "ffma", tile=(32, 32, 32))
    chosen = decomposition.plan(3136, 1, 132, cost=None if cost is None else params)
    assert chosen.policy == "data_parallel"
    assert "no decomposition splits a tile" in chosen.reason


def test_the_margin_keeps_data_parallel_for_small_gains():
    # Among the shapes, a non-data-parallel winner is at least MIN_GAIN faster than
    # data-parallel by the model's own prediction.
    gpu = "nvidia/nvidia-h100"
    chosen_any = False
    for m, n, k in SHAPES:
        cost = _cost(m, n, k, gpu)
        tiles, panels = _tiles(m, n, k)
        p = decomposition.plan(tiles, panels, 132, cost=cost)
        if p.policy == "data_parallel":
            continue
        chosen_any = True
        dp = decomposition.plan(tiles, panels, 132, policy="data_parallel")
        gain = predicted_time(dp, cost=cost) / predicted_time(p, cost=cost)
        assert gain >= 1 + cost_model.physical.MIN_GAIN - 1e-9, (m, n, k, p.label)
    assert chosen_any


def test_traits_of_the_reference_schedule():
    sch = workloads.reference_schedule(workloads.gemm(200, 96, 256), bm=32, bn=32, bk=16)
    func = next(iter(sch.mod.functions.values()))
    site = analyze(func, "C_update")
    t = cost_model.traits_of(site)
    assert (t.tile_m, t.tile_n, t.panel_k) == (32, 32, 16)
    assert (t.m, t.n, t.k, t.batch) == (200, 96, 256, 1)
    assert (t.in_dtype, t.acc_dtype, t.instruction) == ("float32", "float32", "ffma")
    assert cost_model.cost_for(site, H100, "workspace").unit == "us"
    assert cost_model.cost_for(site, OPENCL, "workspace").unit == "units"
    assert cost_model.why_unpriced(site, OPENCL, "workspace").endswith("GPU_SPECS")
    assert cost_model.why_unpriced(site, H100, "workspace") is None


def test_dynamic_m_traits_take_the_rows_at_run_time():
    sch = workloads.reference_schedule(workloads.gemm("m", 64, 128), bm=32, bn=32, bk=16)
    site = analyze(next(iter(sch.mod.functions.values())), "C_update")
    t = cost_model.traits_of(site)
    assert t.m == 0
    assert t.at_tiles(10).m == 5 * 32  # 10 tiles over 2 tile columns


def test_a_decision_on_a_gpu_records_its_buckets_and_reads_them_back():
    sch = workloads.reference_schedule(workloads.gemm("m", 64, 4096), bm=32, bn=32, bk=16)
    plan = tvm_streamk.stream_k(sch, "C_update", target=H100)
    block = sch.get(sch.get_sblock("C_update"))
    decision = record.decode(block.annotations, "C_update")
    assert decision.buckets == plan.buckets
    if plan.buckets:
        text = str(block.annotations[record.KEY_BUCKETS])
        assert text == ",".join(f"{lo}-{hi}" for lo, hi in plan.buckets)


def test_explain_says_predicted_and_gives_microseconds(capsys):
    status = cli.main(
        [
            "explain",
            "--m",
            "896",
            "--n",
            "2432",
            "--k",
            "4096",
            "--bm",
            "128",
            "--bn",
            "128",
            "--bk",
            "32",
            "--dtype",
            "float16",
            "--target",
            H200,
            "--json",
        ]
    )
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    us = report["predicted_us"]
    assert report["gpu"] == GPU_SPECS[H200].name
    assert us["roofline"] > 0
    assert us["plan"] >= us["roofline"] and us["data_parallel"] >= us["roofline"]
    assert report["predicted_speedup"] == pytest.approx(us["data_parallel"] / us["plan"])
    cli.main(["explain", "--m", "896", "--n", "2432", "--k", "4096", "--target", H200])
    text = capsys.readouterr().out
    assert "predicted time (us)" in text and "(predicted" in text


def test_explain_of_a_kernel_names_why_it_is_not_priced():
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64), bm=32, bn=32, bk=16)
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=OPENCL)
    e = explain(sch, gpu=H200, print_=False)
    assert e.gpu == GPU_SPECS[H200].name and e.unpriced is None
    assert e.stats.predicted_us >= e.roofline_us
    plain = explain(sch, print_=False)
    assert plain.gpu is None and plain.stats.predicted_us is None and plain.unpriced is None


@pytest.mark.skipif(not ptxas.available(), reason="nvcc is not on PATH (explain counts occupancy)")
def test_explain_for_a_target_the_table_does_not_hold_says_so():
    # Before, only a gpu= named said why; a target= gave null microseconds and no reason.
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64), bm=32, bn=32, bk=16)
    tvm_streamk.stream_k(sch, "C_update", num_sms=3, target=OPENCL)
    e = explain(sch, target="nvidia/nvidia-a30", print_=False)
    assert e.stats.predicted_us is None
    assert e.unpriced == "nvidia/nvidia-a30 is not a GPU of tvm_streamk.cost_model.GPU_SPECS"

"""Kernels and schedules more than one test module builds: one home, imported by name.

Targets and tolerances are in :mod:`tests.helpers`; the dlight and convolution cases the
workload tests share are in :mod:`tests.dlight_sites` and :mod:`tests.conv_cases`.
"""

import functools

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend import nn
from tvm.s_tir import Schedule
from tvm.s_tir import dlight as dl
from tvm.s_tir import meta_schedule as ms

from tvm_streamk import workloads
from tvm_streamk._compat import dlight, dlight_cuda_target
from tvm_streamk.analysis import first_site

from .helpers import H100, SM_TARGETS

# The ptxas budget tests' GEMM (the README's shape): 67 x 4 tiles of 64 x 64 (a partial last
# row) over 256 K-panels of 16.
BUDGET_MNK = (4256, 256, 4096)


def dlight_matmul(M, K, N, rule, target, dtype="float32"):
    """dlight's schedule (``rule``, then its fallback) of ``matmul(a[M, K], b[K, N])`` as a
    Relax model gets it, under ``target``."""
    mod = workloads.relax_matmul(M, N, K, dtype)
    with target:
        mod = dlight.ApplyDefaultSchedule(rule, dlight.gpu.Fallback())(mod)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def int8_dense(m: int = 128, k: int = 256, n: int = 192) -> tvm.IRModule:
    """``matmul(x[m, k], w[k, n])`` of int8 operands summed in int32, as an unlegalized Relax
    model (``tvm.compile`` and ``relax_pipeline`` take it)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "int8"))
    w = relax.Var("w", relax.TensorType((k, n), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, w, out_dtype="int32")))
        bb.emit_func_output(out)
    return bb.get()


def dlight_gemm(m, n, k, target) -> tuple[Schedule, str]:
    """dlight's ``gpu.Matmul`` schedule for ``target`` of ``workloads.gemm(m, n, k)``, and its
    reduction block."""
    with target:
        mod = dlight.ApplyDefaultSchedule(dlight.gpu.Matmul())(
            tvm.IRModule({"main": workloads.gemm(m, n, k)})
        )
    return Schedule(mod), first_site(mod["main"]).block.name_hint


def dynamic_m_matmul(target, k: int = 256, n: int = 192) -> tuple[Schedule, str]:
    """dlight's schedule for ``target`` of the fp32 ``a[m, k] @ b[k, n]`` with a run-time int64
    ``m`` (as a Relax model of a symbolic sequence length gets it), and its reduction block."""
    func = dlight_matmul(
        tvm.tirx.Var("m", "int64"), k, n, dlight.gpu.Matmul(), dlight_cuda_target(target)
    )
    sch = Schedule(func.with_attr("global_symbol", "main"))
    return sch, first_site(sch.mod["main"]).block.name_hint


def matmul_reference(args):
    """The float64 product of a kernel's first two arguments."""
    return args[0].astype(np.float64) @ args[1].astype(np.float64)


def update_block(sch: Schedule):
    """The reduction's update block: it has a reduce axis and no ``T.init`` (already decomposed)."""
    found = []

    def on_block(block):
        reduces = any(iv.iter_type == tvm.tirx.IterVar.CommReduce for iv in block.iter_vars)
        if reduces and block.init is None:
            found.append(block.name_hint)

    tvm_ffi.structural_walk(sch.mod["main"].body, (tvm.s_tir.SBlock, on_block))
    assert len(found) == 1, f"expected one decomposed reduction block, found {found}"
    return sch.get_sblock(found[0])


# SMs of the MetaSchedule samples' plans: 6 tiles, one past a wave.
MS_SMS = 4


def pipeline_depth(sch: Schedule) -> int:
    """Largest software-pipeline stage annotated on any loop (0 when none is pipelined)."""
    depth = [0]

    def on_for(loop):
        stages = loop.annotations.get("software_pipeline_stage")
        if stages is not None:
            depth[0] = max(depth[0], *(int(s) for s in stages))

    tvm_ffi.structural_walk(sch.mod["main"].body, (tvm.tirx.For, on_for))
    return depth[0]


def meta_schedule_samples(func, decisions) -> dict[int, Schedule]:
    """MultiLevelTiling's design spaces of ``func`` for the H100 tag at the point ``decisions``
    (one per SamplePerfectTile), stock postprocs applied, keyed by software-pipeline depth (the
    sm_90 space has 0-, 2- and 3-stage variants)."""
    rules = [
        rule
        for rule in ms.ScheduleRule.create("cuda")
        if isinstance(rule, ms.schedule_rule.MultiLevelTiling)
    ]
    context = ms.TuneContext(
        mod=tvm.IRModule({"main": func}),
        target=H100,
        space_generator=ms.space_generator.PostOrderApply(
            sch_rules=rules, postprocs="cuda", mutator_probs={}
        ),
        task_name="gemm",
        rand_state=1,
    )
    samples = {}
    for space in context.generate_design_space():
        trace = space.trace
        tiles = [inst for inst in trace.insts if inst.kind.name == "SamplePerfectTile"]
        assert len(tiles) == len(decisions)
        for inst, decision in zip(tiles, decisions):
            trace = trace.with_decision(inst, decision, remove_postproc=True)
        sch = Schedule(func)
        trace.apply_to_schedule(sch, remove_postproc=True)
        # RewriteReductionBlock decomposes the reduction, RewriteCooperativeFetch binds the
        # shared-memory copies to threads, VerifyGPUCode checks the H100 tag's limits.
        if all(postproc.apply(sch) for postproc in context.space_generator.postprocs):
            samples.setdefault(pipeline_depth(sch), sch)
    return samples


# (M, N, K, num_sms, what the case exercises); tiles are 32x32, panels 8 deep.
GEMM_CASES = [
    (64, 64, 64, 8, "tiles < grid: every tile shared by two blocks"),
    (64, 64, 64, 4, "tiles == grid: no split tile"),
    (160, 32, 64, 4, "tiles == grid + 1"),
    (96, 96, 40, 4, "tiles not divisible by grid"),
    (64, 64, 8, 3, "one panel per tile"),
    (128, 128, 16, 3, "one block spans five tiles"),
    (32, 32, 256, 7, "seven blocks share one tile"),
    (70, 50, 29, 4, "uneven shapes, predicated edges in M, N and K"),
]


def gemv_schedule(N: int, K: int):
    """A GEMV kernel: 32 output rows per block, one per thread, x staged per K panel of 64."""
    func = workloads.gemv(N, K)
    sch = tvm.s_tir.Schedule(func)
    blk = sch.get_sblock("C")
    i, k = sch.get_loops(blk)
    bi, ti = sch.split(i, [None, 32])
    ko, ki = sch.split(k, [None, 64])
    sch.reorder(bi, ti, ko, ki)
    sch.bind(bi, "blockIdx.x")
    sch.bind(ti, "threadIdx.x")
    sch.reverse_compute_at(sch.cache_write(blk, 0, "local"), ti)
    x_shared = sch.cache_read(blk, 1, "shared")
    sch.compute_at(x_shared, ko)
    _, tx = sch.split(sch.get_loops(x_shared)[-1], [None, 32])
    sch.bind(tx, "threadIdx.x")
    sch.decompose_reduction(blk, ko)
    return func, sch


def cuda_target(tag: str, arch: str) -> tvm.target.Target:
    # dlight tensorizes only for a plain numeric arch ("sm_90", not the H100 tag's "sm_90a").
    config = dict(tvm.target.Target(tag).export())
    config.pop("tag", None)
    config.pop("host", None)
    config["arch"] = arch
    return tvm.target.Target(config)


FRAGMENT_TARGETS = {
    "sm_80": (cuda_target("nvidia/nvidia-a100", "sm_80"), 108),
    "sm_90": (cuda_target("nvidia/nvidia-h100", "sm_90"), 132),
}


def dlight_fp16_matmul(M, N, K, target):
    """dlight's WMMA tensor-core schedule of an fp16 matmul (fp16 accumulation) for ``target``."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((M, K), "float16"))
    b = relax.Var("b", relax.TensorType((K, N), "float16"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            c = bb.emit(relax.op.matmul(a, b, out_dtype="float16"))
            out = bb.emit_output(c)
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul())(mod)
    (gv,) = [gv for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    func = mod[gv].with_attr("global_symbol", gv.name_hint)
    assert "tvm_mma_sync" in func.script(), "dlight must have chosen its WMMA schedule"
    return tvm.s_tir.Schedule(func)


def fragment_update_block(sch) -> str:
    """The tensorized reduction block, found by what it computes rather than by its name."""
    site = first_site(next(iter(sch.mod.functions.values())))
    assert site is not None, "no Stream-K-able block in the dlight schedule"
    return site.block.name_hint


# A MultiLevelTiling point at 2048^3: 32 x 32 tiles of 64 x 64, 128 threads, 128 K-panels.
BUDGET_MS_FUNC = workloads.gemm(2048, 2048, 2048)
BUDGET_MS_DECISIONS = ([32, 1, 8, 4, 2], [32, 1, 16, 2, 2], [128, 4, 4])


# A ResNet-50 3x3 convolution (56x56x64 -> 64, batch 8) as the project's implicit GEMM: 392
# tiles of 64 x 64 (I = 25088, J = 64) over 36 K-panels of 16 (K = 576).
BUDGET_CONV = {
    "data_shape": (8, 56, 56, 64),
    "weight_shape": (3, 3, 64, 64),
    "layout": "NHWC",
    "padding": 1,
}


@functools.cache
def budget_ms_schedule() -> Schedule:
    samples = meta_schedule_samples(BUDGET_MS_FUNC, BUDGET_MS_DECISIONS)
    assert 0 in samples, f"no unpipelined sample at {BUDGET_MS_DECISIONS}: {list(samples)}"
    return samples[0]


def budget_schedule(source: str, arch: str) -> tuple[Schedule, str]:
    """A fresh data-parallel schedule of ``source`` and the name of its reduction block."""
    target = tvm.target.Target(SM_TARGETS[arch])
    if source == "reference":
        sch = workloads.reference_schedule(workloads.gemm(*BUDGET_MNK), bm=64, bn=64, bk=16)
        return sch, "C_update"
    if source == "meta_schedule":
        sch = budget_ms_schedule().copy()
    elif source == "implicit_gemm":
        sch = workloads.implicit_gemm_schedule(workloads.conv(**BUDGET_CONV))
    else:
        dtype = "float16" if source == "dlight_wmma" else "float32"
        # As the project's dlight rule sees it: sm_90a gets the tensor-core schedule of sm_90.
        m, n, k = BUDGET_MNK
        func = dlight_matmul(m, k, n, dlight.gpu.Matmul(), dlight_cuda_target(target), dtype)
        sch = Schedule(func.with_attr("global_symbol", "main"))
    site = first_site(sch.mod["main"])
    assert site is not None, f"no block of the {source} schedule is accepted"
    assert site.fragment_accumulator == (source == "dlight_wmma"), source
    return sch, site.block.name_hint


def te_conv(case: tuple):
    """TVM's TE convolution of a ``tests.conv_cases.TE_CONV_CASES`` entry, and its float64
    reference as a function of the kernel's arguments."""
    from tvm import te
    from tvm.s_tir.meta_schedule.testing import te_workload

    name, kwargs, layout = case
    func = te.create_prim_func(getattr(te_workload, name)(**kwargs))
    geometry = {k: kwargs.get(k, default) for k, default in (("stride", 1), ("dilation", 1))}
    padding = kwargs.get("padding", 0)
    return func, lambda args: workloads.conv_reference(
        args, layout=layout, padding=padding, **geometry
    )


class LinearBlock(nn.Module):
    """The linear layers of a Llama decoder block (``tvm.relax.frontend.nn``), attention core
    left out: RMSNorm, the Q, K, V and output projections, a SwiGLU MLP and the residuals."""

    def __init__(self, hidden: int, ffn: int):
        self.norm = nn.RMSNorm(hidden, axes=-1, bias=False)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: nn.Tensor):
        h = self.norm(x)
        mixed = self.o(self.q(h) + self.k(h) * self.v(h))
        x = x + mixed
        h = self.norm(x)
        return x + self.down(nn.silu(self.gate(h)) * self.up(h))


# The project's other dlight rules at model sizes: AlexNet's first fully connected layer at
# batch 1 (32 column tiles of 128, 144 K-panels), a 5x5 depthwise convolution (2 K-panels) and
# ShuffleNet's grouped 1x1 convolution (4 groups): ``{name: (rule class, function)}``.
def rule_funcs() -> dict:
    from tvm_streamk.dlight import StreamKDepthwise, StreamKGEMV, StreamKMatmul

    gemv = workloads.gemm(1, 4096, 9216)
    depthwise = workloads.conv(
        data_shape=(1, 136, 28, 28),
        weight_shape=(136, 1, 5, 5),
        layout="NCHW",
        groups=136,
        padding=2,
    )
    grouped = workloads.conv(
        data_shape=(1, 272, 14, 14), weight_shape=(272, 68, 1, 1), layout="NCHW", groups=4
    )
    return {
        "gemv": (StreamKGEMV, gemv),
        "depthwise": (StreamKDepthwise, depthwise),
        "grouped_conv": (StreamKMatmul, grouped),
    }

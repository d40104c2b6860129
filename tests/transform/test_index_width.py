"""The closed forms never wrap: the emitted index arithmetic, evaluated as the GPU would.

GEMMs whose ``grid x tiles x panels`` passes 2^31 are too slow to run here, so the CUDA kernel is
built (``tvm_streamk`` pipeline, host/device split) and the ``Bind`` expressions of its
persistent kernel are evaluated for every block with the wrap-around of their own integer
types, then compared with the Python plan. The same evaluation at a small shape checks that
int32 stays where it cannot wrap. A plan past 2^31 small enough to run also runs on PoCL.
"""

import pytest
import tvm
import tvm_ffi

import tvm_streamk
from tests.helpers import H100
from tvm_streamk import pocl, workloads
from tvm_streamk._compat import (
    BufferLoadNode,
    get_tir_pipeline,
    loaded_buffer,
    split_host_device_mods,
)

_BINARY = {
    tvm.tirx.Add: lambda a, b: a + b,
    tvm.tirx.Sub: lambda a, b: a - b,
    tvm.tirx.Mul: lambda a, b: a * b,
    tvm.tirx.FloorDiv: lambda a, b: a // b,
    tvm.tirx.FloorMod: lambda a, b: a % b,
    # C's truncating division, which FloorDiv becomes where TVM proves operands non-negative.
    tvm.tirx.Div: lambda a, b: abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1),
    tvm.tirx.Min: min,
    tvm.tirx.Max: max,
    tvm.tirx.LT: lambda a, b: a < b,
    tvm.tirx.LE: lambda a, b: a <= b,
    tvm.tirx.GT: lambda a, b: a > b,
    tvm.tirx.GE: lambda a, b: a >= b,
    tvm.tirx.EQ: lambda a, b: a == b,
    tvm.tirx.NE: lambda a, b: a != b,
    tvm.tirx.And: lambda a, b: a and b,
    tvm.tirx.Or: lambda a, b: a or b,
}


def _wrap(value, dtype: str):
    """``value`` as an integer of ``dtype`` holds it: two's-complement wrap-around."""
    if isinstance(value, bool) or not dtype.startswith(("int", "uint")):
        return value
    bits = tvm.DataType(dtype).bits
    value %= 1 << bits
    return value - (1 << bits) if dtype.startswith("int") and value >= 1 << (bits - 1) else value


class _Evaluator:
    def __init__(self, func):
        self.binds = {}

        def on_bind(bind) -> None:
            self.binds.setdefault(bind.var, bind.value)

        # Values read back through a register (opaque_bind): the store into the storage the
        # loaded view shares.
        self.stored = {}

        def on_store(store) -> None:
            self.stored.setdefault(str(store.buffer.data), store.value)

        tvm_ffi.structural_walk(
            func.body, [(tvm.tirx.Bind, on_bind), (tvm.tirx.BufferStore, on_store)]
        )
        # The first definition of a name: unit 0's walk (a hybrid repeats it for later units).
        self.by_name = {}
        for v in self.binds:
            self.by_name.setdefault(v.name, v)

    def __call__(self, name: str, env: dict):
        return self.eval(self.binds[self.by_name[name]], env, {})

    def eval(self, e, env, memo):
        if isinstance(e, tvm.tirx.IntImm):
            return int(e.value)
        if isinstance(e, tvm.tirx.Var):
            name = e.name.replace(".", "_")  # the thread tag's variable is named blockIdx.x
            if name in env:
                return _wrap(env[name], str(e.ty.dtype))
            if e not in memo:
                memo[e] = self.eval(self.binds[e], env, memo)
            return memo[e]
        if isinstance(e, BufferLoadNode):
            return self.eval(self.stored[str(loaded_buffer(e).data)], env, memo)
        dtype = str(e.ty.dtype)
        if isinstance(e, tvm.tirx.Cast):
            return _wrap(self.eval(e.value, env, memo), dtype)
        if isinstance(e, tvm.tirx.Not):
            return not self.eval(e.a, env, memo)
        if isinstance(e, tvm.tirx.Select):
            cond = self.eval(e.condition, env, memo)
            return self.eval(e.true_value if cond else e.false_value, env, memo)
        op = _BINARY[type(e)]
        return _wrap(op(self.eval(e.a, env, memo), self.eval(e.b, env, memo)), dtype)


def _persistent_kernel(sch):
    mod = tvm.tirx.transform.BindTarget(H100.with_host("llvm"))(sch.mod)
    pipeline, _, _ = get_tir_pipeline("tvm_streamk")
    _, device_mods = split_host_device_mods(pipeline(mod))
    kernels = [f for dm in device_mods.values() for f in dm.functions.values()]
    (kernel,) = [k for k in kernels if "sk_segment" in k.script()]
    return kernel


def _check_every_block(M, N, K, policy, segments_per_block=3):
    sch = workloads.reference_schedule(workloads.gemm(M, N, K))
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=132, policy=policy, target=H100)
    evaluate = _Evaluator(_persistent_kernel(sch))
    P = plan.panels
    for b, work in enumerate(plan.work):
        env = {"blockIdx_x": b, "sk_unit": 0}
        lo, hi = plan.block_range(b, 0)
        assert (evaluate("sk_lo", env), evaluate("sk_hi", env)) == (lo, hi)
        unit0 = [seg for seg in work if lo <= seg[0] * P + seg[1] < hi]
        chosen = unit0[:segments_per_block] + unit0[-segments_per_block:]
        for s, (tile, k0, k1) in enumerate(unit0):
            if (tile, k0, k1) not in chosen:
                continue
            env = {"blockIdx_x": b, "sk_unit": 0, "sk_segment": s}
            found = tuple(evaluate(n, env) for n in ("sk_tile", "sk_k_begin", "sk_k_end"))
            assert found == (tile, k0, k1), f"block {b} segment {s}"
    return plan, evaluate


@pytest.mark.parametrize(
    "M,N,K", [(8192, 8192, 8192), (16384, 16384, 16384)], ids=["8192^3", "16384^3"]
)
@pytest.mark.parametrize("policy", ["stream_k", "hybrid"])
def test_huge_shapes_do_not_wrap(M, N, K, policy):
    plan, evaluate = _check_every_block(M, N, K, policy)
    assert plan.largest_intermediate() > 2**31, "the case must need more than int32"
    if policy == "stream_k":
        # b * TOTAL passes 2^31. (A hybrid's Stream-K region is a few waves of tiles: TVM may
        # narrow its unit-0 range back to int32, which the evaluation above shows is exact.)
        assert str(evaluate.by_name["sk_lo"].ty.dtype) == "int64"
    # The segment values (tile, first and last panel) stay int32 below the tile count; the
    # evaluation above checked them with int32 wrap-around.
    for name in ("sk_tile", "sk_k_begin", "sk_k_end"):
        assert str(evaluate.by_name[name].ty.dtype) == "int32", name


def test_int32_stays_where_it_cannot_wrap():
    plan, evaluate = _check_every_block(1024, 1024, 1024, "stream_k")
    assert plan.largest_intermediate() < 2**31
    assert str(evaluate.by_name["sk_lo"].ty.dtype) == "int32"


def test_int32_wraps_in_the_evaluator():
    # The evaluator itself must see a wrap, or the tests above could not fail.
    assert _wrap(33 * 67108864, "int32") < 0 and _wrap(33 * 67108864, "int64") > 0


@pytest.mark.usefixtures("opencl")
def test_a_small_tile_plan_past_int32_runs_correctly():
    # 176 x 176 tiles of 4 x 4 with 704 one-deep panels on 132 blocks: b * TOTAL reaches 2.9e9,
    # which returned NaN tiles while the closed forms were int32.
    func = workloads.gemm(704, 704, 704)
    sch = workloads.reference_schedule(func, bm=4, bn=4, tm=1, tn=1, bk=1)
    plan = tvm_streamk.stream_k(sch, "C_update", num_sms=132, target=tvm.target.Target("opencl"))
    assert plan.largest_intermediate() > 2**31
    args = workloads.random_args(func)
    out = pocl.run(sch.mod, *args, pipeline="tvm_streamk")[-1]
    # fp32 accumulation of 704 products of values in [-1, 1]: within 1e-5 of float64.
    assert workloads.relative_error(out, workloads.reference(func, args)) <= 1e-5


def test_batch_invariant_chunk_slots_do_not_wrap():
    """A batch-invariant kernel's workspace holds a slot per chunk of every tile: 32768^2
    outputs in 32 x 32 tiles of 4 chunks are 2^32 partial elements, so the slot index and the
    workspace's addressing are 64-bit, and the walk's tile and chunk evaluate to the plan's."""
    sch = workloads.reference_schedule(workloads.gemm(32768, 32768, 4096))
    plan = tvm_streamk.stream_k(
        sch, "C_update", num_sms=132, policy="stream_k", target=H100, batch_invariant=True
    )
    assert plan.panels == 4 and plan.tiles * plan.panels * 32 * 32 > 2**31
    kernel = _persistent_kernel(sch)
    stores = []
    tvm_ffi.structural_walk(
        kernel.body,
        (
            tvm.tirx.BufferStore,
            lambda s: stores.append(s) if s.buffer.name == "sk_workspace" else None,
        ),
    )
    assert stores and all(str(i.ty.dtype) == "int64" for s in stores for i in s.indices)
    evaluate = _Evaluator(kernel)
    for b in (0, 1, plan.grid - 1):
        lo, hi = plan.block_range(b, 0)
        for s in (0, hi - lo - 1):
            env = {"blockIdx_x": b, "sk_unit": 0, "sk_segment": s}
            found = (evaluate("sk_tile", env), evaluate("sk_chunk", env))
            assert found == divmod(lo + s, plan.panels), (b, s)

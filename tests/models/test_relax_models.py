"""Dynamic-shape models through the Relax pipeline (issue 15, item 2): slow, needs torch.

Hugging Face GPT-2 and Llama models built from small configs (random weights, no download),
exported with ``torch.export`` with a dynamic sequence length and imported with TVM's
``from_exported_program``, as TVM users bring LLMs. Each compiles for ``nvidia/nvidia-h100``
with Stream-K on its matmul kernels (chosen per token count at run time), and each of those
kernels, built once, runs correctly on PoCL at 1, 7, 100, 1000 and 4097 tokens, with the
output poisoned: against TVM's LLVM build of the same fused function unscheduled (fused
epilogues included), itself checked against float64 numpy where the kernel is a plain matmul.

Install the model dependencies with ``pip install -e ".[test,models]"``; run ``pytest -m slow``.
"""

import numpy as np
import pytest
import tvm
from tvm import tirx

import tvm_streamk
from tests.helpers import H100, cuda_modules
from tvm_streamk import pocl as pocl_backend
from tvm_streamk import ptxas, workloads
from tvm_streamk._compat import dlight, param_buffers, structural_walk
from tvm_streamk.dlight import StreamKMatmul
from tvm_streamk.relax_pipeline import fusion_passes

pytestmark = pytest.mark.slow

TOKENS = (1, 7, 100, 1000, 4097)


def _extras():
    """torch and transformers (a clear skip, where the model extras are not installed)."""
    why = 'install the model extras: pip install -e ".[test,models]"'
    return pytest.importorskip("torch", reason=why), pytest.importorskip("transformers", reason=why)


def _config(name: str):
    _, transformers = _extras()
    common = {"vocab_size": 512, "bos_token_id": 0, "eos_token_id": 0}
    if name == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=8192, **common)
    return transformers.LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        pad_token_id=0,
        **common,
    )


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request) -> tvm.IRModule:
    """The model's Relax module, its sequence length symbolic."""
    torch, transformers = _extras()
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    cfg = _config(request.param)
    lm = transformers.AutoModelForCausalLM.from_config(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            # An explicit all-ones mask keeps transformers' packed-sequence detection (a cumsum
            # of unknown shape, which TVM's CUDA sort/scan dispatch refuses) out of the graph.
            mask = torch.ones_like(ids)
            return self.lm(input_ids=ids, attention_mask=mask, use_cache=False).logits

    seq = torch.export.Dim("seq", min=1, max=8192)
    ids = torch.randint(0, cfg.vocab_size, (1, 8))
    exported = torch.export.export(Logits(lm), (ids,), dynamic_shapes={"ids": {1: seq}})
    return from_exported_program(exported, keep_params_as_input=True)


def _fused_functions(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    """The fused TIR functions the pipeline hands dlight, unscheduled."""
    with H100:
        fused = tvm.transform.Sequential(fusion_passes(H100))(mod)
    return {
        gv.name_hint: func
        for gv, func in fused.functions.items()
        if isinstance(func, tirx.PrimFunc)
    }


def _shape_var(func: tirx.PrimFunc) -> str:
    names = set()

    def visit(v) -> None:
        names.add(v.name)

    for buf in param_buffers(func):
        for extent in buf.shape:
            if not isinstance(extent, tirx.IntImm):
                structural_walk(extent, (tirx.Var, visit))
    (name,) = names
    return name


def test_compiles_with_stream_k_for_h100(model):
    pipeline = tvm_streamk.relax_pipeline(H100)
    lib = tvm.compile(model, H100, relax_pipeline=pipeline, tir_pipeline="tvm_streamk")
    decided = pipeline.rule.decided
    # Every projection and the LM head: 4 or 5 kernel kinds per model, each decided once.
    assert len(decided) >= 4, pipeline.rule.skipped
    for key, chosen in decided.items():
        assert (chosen.policy, chosen.variant) == ("stream_k", "or_data_parallel"), key
    # The attention matmuls (two run-time extents, or a run-time K) say why not.
    for key, why in pipeline.rule.skipped.items():
        assert "[runtime-tiles]" in why or "[constant-panels]" in why, (key, why)
    sources = [m.inspect_source() for m in cuda_modules(lib)]
    assert sources, "no CUDA module in the build"
    if ptxas.available():
        for text in sources:
            for name, kernel in ptxas.resources(text, "sm_90").items():
                assert kernel.spills == 0 and kernel.stack == 0, (name, kernel)


def test_matmul_kernels_run_at_every_token_count(model):
    checked = 0
    for name, func in _fused_functions(model).items():
        rule = StreamKMatmul()
        with H100:
            scheduled = dlight.ApplyDefaultSchedule(rule)(tvm.IRModule({"main": func}))
        if not rule.decided:
            continue
        sch_mod = tvm.IRModule({"main": scheduled["main"].with_attr("global_symbol", "main")})
        reference = tvm.compile(
            tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm"
        )
        var = _shape_var(func)
        plain = len(param_buffers(func)) == 3
        for tokens in TOKENS:
            args = workloads.random_args(func, np.random.default_rng(tokens), **{var: tokens})
            assert np.isnan(args[-1]).all()
            out = pocl_backend.run(sch_mod, *args, pipeline="tvm_streamk")[-1]
            expected = [tvm.runtime.tensor(a) for a in args]
            reference["main"](*expected)
            ref = expected[-1].numpy().astype(np.float64)
            a, b = (np.asarray(x, np.float64) for x in args[:2])
            if plain and a.ndim == b.ndim == 2 and b.shape[0] != b.shape[1]:
                # A plain matmul whose operand orientation its shapes tell: float64 numpy too.
                ref64 = a @ b if a.shape[-1] == b.shape[0] else a @ b.T
                assert workloads.relative_error(ref, ref64) <= 1e-5, name
                ref = ref64
            err = workloads.relative_error(out, ref)
            assert err <= 1e-5, f"{name} at {tokens} tokens: relative error {err}"
        checked += 1
    assert checked >= 4

"""
Stream-K with a fused epilogue
==============================

Real GEMMs rarely end at ``A @ B``: a linear layer adds a bias, applies an activation and casts
to fp16 in the same kernel. This tutorial shows what that does to Stream-K's fix-up, and how the
workspace fix-up keeps the epilogue fused and the results bit-reproducible.

You will learn

* why the atomic fix-up cannot merge partial tiles through an epilogue, and how the primitive
  says so;
* how ``fixup="workspace"`` (which ``fixup="auto"`` picks here) merges partial tiles in a fixed
  order and then runs the original write-back once per tile;
* how much memory that costs (``explain`` reports it), and that two runs give identical bits.

Run it with ``python tutorials/fused_epilogue.py``; ``main(fast=True)`` is what the test suite
runs.
"""

# %%
# The kernel
# ----------
#
# ``D = fp16(relu(A @ B + bias))``: the reduction accumulates in fp32 registers, and the block
# that writes ``D`` applies the bias, the ReLU and the cast. ``reference_schedule`` makes that
# block each thread's write-back, as a hand-written kernel would.

import numpy as np

from tvm_streamk import device as devices
from tvm_streamk import workloads
from tvm_streamk.errors import StreamKError
from tvm_streamk.explain import explain

# fp16 output: the float64 reference rounded to fp16 differs by at most one fp16 ulp (2^-10
# relative to the largest output), plus the fp32 accumulation error.
TOLERANCE = 2.0**-10 + 1e-5


def gemm_bias_relu(m, n, k, bm=32, bn=32, bk=8):
    """``D = fp16(relu(A @ B + bias))`` with the reference data-parallel GPU schedule."""
    func = workloads.gemm(m, n, k, in_dtype="float16", out_dtype="float16", epilogue="bias_relu")
    return func, workloads.reference_schedule(func, bm=bm, bn=bn, bk=bk)


# %%
# Why atomics do not fit
# ----------------------
#
# With the atomic fix-up every block that holds part of a tile adds its partial sum straight into
# the output. That is only right when the write-back is a plain copy: ``relu(x + y + bias)`` is
# not ``relu(x + bias) + relu(y + bias)``, and fp16 has no atomic add on every GPU. The primitive
# checks this before recording anything and names the broken precondition.


def show_atomic_refusal(sch, num_sms, target):
    """Ask for the atomic fix-up; return the precondition the primitive reports."""
    try:
        sch.stream_k("C_update", num_sms=num_sms, fixup="atomic", target=target)
    except StreamKError as err:
        print(f"atomic fix-up refused: [{err.condition}] {err.found}")
        return err.condition
    raise AssertionError("the atomic fix-up must refuse a fused epilogue")


# %%
# The workspace fix-up
# --------------------
#
# Each block writes the partial tiles it holds to its slots of a global workspace and counts its
# K-panels into the tile's arrival counter. The block whose arrival completes the count sums the
# tile's partials in K order (not arrival order) and runs the original write-back, epilogue
# included. Because the order of the sum is fixed, two runs give the same bits.


def main(fast=False):
    """Check, repeat and time a Stream-K GEMM with a fused bias-ReLU-fp16 epilogue.

    Parameters
    ----------
    fast : bool
        A smaller K and one timed run per kernel, as the test suite runs it.

    Returns
    -------
    dict
        The relative errors of both kernels, whether two Stream-K runs were bitwise equal, and
        the measured seconds of both kernels.
    """
    device = devices.default_device()
    num_sms = devices.num_sms(device)
    target = devices.target(device)
    print(f"device: {device}, {num_sms} SMs, target {target.kind.name}")
    rng = np.random.default_rng()
    # One column of tiles, one tile more than a full wave: the case data-parallel handles worst,
    # and some tile is split between blocks. N is below the tile width, so stores are predicated.
    m, n, k = (num_sms + 1) * 32, 24, 128 if fast else 2048
    repeat = 1 if fast else 5

    func, data_parallel = gemm_bias_relu(m, n, k)
    _, stream_k = gemm_bias_relu(m, n, k)
    assert show_atomic_refusal(stream_k, num_sms, target) == "no-epilogue"
    stream_k.stream_k("C_update", num_sms=num_sms, fixup="auto", target=target)
    report = explain(stream_k)
    assert report.fixup == "workspace", "auto must pick the workspace fix-up for an epilogue"
    assert report.stats.split_tiles > 0 and report.stats.workspace_bytes > 0

    # %%
    # Correctness: fresh random inputs, the output poisoned with NaN, float64 NumPy reference.
    kernels = {
        "data-parallel": devices.compile(data_parallel, device, pipeline="default"),
        "Stream-K": devices.compile(stream_k, device, pipeline="tvm_streamk"),
    }
    args = workloads.random_args(func, rng)
    assert np.isnan(args[-1]).all(), "the output must start poisoned"
    ref = workloads.reference(func, args)
    outputs = {name: kernel.run(*args)[-1] for name, kernel in kernels.items()}
    errors = {name: workloads.relative_error(out, ref) for name, out in outputs.items()}
    for name, err in errors.items():
        print(f"{name:<14} relative error {err:.2e} (tolerance {TOLERANCE:.2e})")
        assert err <= TOLERANCE, f"{name}: relative error {err} exceeds {TOLERANCE}"

    # %%
    # Reproducibility: run the Stream-K kernel again on the same inputs.
    again = kernels["Stream-K"].run(*args)[-1]
    identical = bool(np.array_equal(again.view(np.uint16), outputs["Stream-K"].view(np.uint16)))
    print(f"two Stream-K runs bitwise identical: {identical}")
    assert identical, "the workspace fix-up sums partials in a fixed order"

    # %%
    # Benchmark. On PoCL the times show the kernels' bookkeeping, not a GPU's speed-up; the
    # report above gives the cost model's prediction.
    times = {name: kernel.time(*args, repeat=repeat) for name, kernel in kernels.items()}
    for name, seconds in times.items():
        print(f"{name:<14} {seconds * 1e3:9.3f} ms")
    return {"errors": errors, "bitwise_identical": identical, "seconds": times}


if __name__ == "__main__":
    main()

"""bench.gpu.fit_physical recovers constants it was given, and reports what it fitted."""

from bench.gpu import fit_physical
from tvm_streamk import cost_model
from tvm_streamk.cost_model import physical
from tvm_streamk.decomposition import plan

H200 = cost_model.spec_for("nvidia/nvidia-h200")


def _samples(knobs) -> list:
    """Kernels whose 'measured' times are the model's under ``knobs``: split-K and Stream-K
    of a few shapes of 128x128 tiles, each with its data-parallel baseline."""
    out = []
    for tiles, panels in [(12, 64), (72, 9), (133, 32), (264, 16), (40, 128)]:
        traits = physical.KernelTraits(128, 128, 32, m=128 * tiles, n=128, k=32 * panels)
        price = physical.price(traits, H200, "workspace")
        dp = plan(tiles, panels, 132, 1, "data_parallel")
        for p in (
            plan(tiles, panels, 132, 1, "stream_k"),
            plan(tiles, panels, 132, 1, "split_k", splits=2),
        ):
            sample = fit_physical.Sample(
                f"{tiles}x{panels}-{p.label}", p, dp, "workspace", price, 1.0, 1.0,
                f"{tiles}x{panels}", True,
            )  # fmt: skip
            sample.measured_us, sample.measured_dp_us = fit_physical.times(sample, knobs)
            out.append(sample)
    return out


def test_the_fit_comes_close_to_the_constants_the_times_came_from():
    truth = (1.0, 0.0, 4.0, 2.0)  # a partial tile 4 us dearer, a launch 2 us
    data = _samples(truth)
    shipped = fit_physical.SHIPPED
    assert fit_physical.error(data, truth) < 1e-12
    fitted = fit_physical.fit(data, log=lambda _: None)
    # Coordinate descent finds a local minimum: here the hand-off exactly, and a segment's fill
    # in place of the launch (on these plans nearly the same cost), 450x closer than shipped.
    assert fitted[2] == truth[2]
    assert fit_physical.error(data, fitted) < fit_physical.error(data, shipped) / 400
    text = fit_physical.render(data, truth)
    assert "partial tile +4.0 us, launch +2.0 us" in text
    assert "| fitted | 0.000 | 10 of 10 |" in text

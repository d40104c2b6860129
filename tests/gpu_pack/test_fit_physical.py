"""bench.gpu.fit_physical recovers constants it was given, and reports what it fitted."""

from bench.gpu import fit_physical
from tvm_streamk import cost_model
from tvm_streamk.cost_model import physical
from tvm_streamk.decomposition import plan

H200 = cost_model.spec_for("nvidia/nvidia-h200")


def _samples(knobs) -> list:
    """Kernels whose 'measured' times are the model's under ``knobs``: split-K and Stream-K
    (with both fix-ups, so that a launch, a segment and a hand-off cost differently) of a few
    shapes of 128x128 tiles, two blocks resident per SM, each with its data-parallel
    baseline."""
    out = []
    for tiles, panels in [(12, 64), (72, 9), (133, 32), (264, 16), (40, 128)]:
        traits = physical.KernelTraits(128, 128, 32, m=128 * tiles, n=128, k=32 * panels)
        dp = plan(tiles, panels, 132, 2, "data_parallel")
        for p, fixup in (
            (plan(tiles, panels, 132, 2, "stream_k"), "workspace"),
            (plan(tiles, panels, 132, 2, "stream_k"), "atomic"),
            (plan(tiles, panels, 132, 2, "split_k", splits=2), "workspace"),
        ):
            sample = fit_physical.Sample(
                f"{tiles}x{panels}-{p.label}-{fixup}", p, dp, fixup,
                physical.price(traits, H200, fixup), 1.0, 1.0, f"{tiles}x{panels}", True,
            )  # fmt: skip
            sample.measured_us, sample.measured_dp_us = fit_physical.times(sample, knobs)
            out.append(sample)
    return out


def test_the_fit_comes_close_to_the_constants_the_times_came_from():
    # A partial tile 4 us dearer, a launch 2 us, one block of two on an SM at 0.5 ** 0.6 of its
    # rate.
    truth = (1.0, 0.0, 4.0, 2.0, 0.6)
    data = _samples(truth)
    shipped = fit_physical.SHIPPED
    assert fit_physical.error(data, truth) < 1e-12
    fitted = fit_physical.fit(data, log=lambda _: None)
    # The descent finds a local minimum: here the main loop's scale and the occupancy exponent
    # exactly, and a segment's fill, a hand-off and a launch traded against each other (on
    # these plans nearly the same cost), 100x closer than shipped.
    assert (fitted[0], fitted[4]) == (truth[0], truth[4])
    assert fit_physical.error(data, fitted) < fit_physical.error(data, shipped) / 100
    text = fit_physical.render(data, truth)
    assert "partial tile +4.0 us, launch +2.0 us" in text
    assert "| fitted | 0.000 | 15 of 15 |" in text


def test_the_tensor_core_class_is_fitted_from_its_own_constants():
    # --class mma: the descent starts at the tensor-core occupancy exponent, and the report
    # names the tensor-core constants the fit would make.
    try:
        fit_physical.fit_class("mma")
        assert fit_physical.SHIPPED == (1.0, 0.0, 0.0, 0.0, physical.OCCUPANCY_EXPONENT["mma"])
        assert fit_physical.SOURCES["mma"] == ("dlight_wmma",)
        data = _samples(fit_physical.SHIPPED)
        text = fit_physical.render(data, (2.0, 1.0, 0.0, 0.0, 1.0))
        efficiency = physical.EFFICIENCY["mma"] / 2.0
        fill = physical.FILL_US["mma"] + 1.0
        assert f"(MMA: EFFICIENCY {efficiency:.3g}, FILL_US {fill}," in text
    finally:
        fit_physical.fit_class("ffma")
    assert fit_physical.SHIPPED[4] == physical.OCCUPANCY_EXPONENT["ffma"]

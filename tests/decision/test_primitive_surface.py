"""What a user of the primitive sees before anything is scheduled: its signature in help()."""

import inspect

from tvm_streamk import schedule, workloads


def test_help_of_the_schedule_method_shows_every_keyword():
    sch = workloads.reference_schedule(workloads.gemm(64, 64, 64))
    shown = inspect.signature(sch.stream_k)
    assert "kwargs" not in shown.parameters, shown
    expected = set(inspect.signature(schedule.stream_k).parameters) - {"sch"}
    assert set(shown.parameters) == expected, shown
    assert sch.stream_k.__doc__ == schedule.stream_k.__doc__

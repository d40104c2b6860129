"""The table of known GPUs: where Stream-K's SM count comes from when no device is at hand.

Order of precedence: an explicit ``num_sms``, the target's tag, its arch when every GPU of that
arch has the same count, else :class:`~tvm_streamk.gpus.UnknownGPUError` asking for ``num_sms=``.
"""

import numpy as np
import pytest
import tvm
from tvm.target.tag import list_tags

import tvm_streamk
from tvm_streamk import gpus, workloads
from tvm_streamk.errors import StreamKError
from tvm_streamk.gpus import SM_COUNT_BY_ARCH, SM_COUNT_BY_TAG, UnknownGPUError, resolve_num_sms

REGISTERED_TAGS = list_tags()
# Tags of the table that TVM 0.27 registers, with the arch TVM gives each.
TABLE_ARCH = {
    tag: str(REGISTERED_TAGS[tag].attrs["arch"])
    for tag in SM_COUNT_BY_TAG
    if tag in REGISTERED_TAGS
}


def test_explicit_count_wins_over_tag_and_arch():
    assert resolve_num_sms(96, tag="nvidia/nvidia-a100", arch="sm_70") == 96


def test_tag_lookup():
    assert resolve_num_sms(tag="nvidia/nvidia-a100") == 108
    assert resolve_num_sms(tag="nvidia/nvidia-h100") == 132


def test_tag_wins_over_arch():
    # An A30 is sm_80 like an A100; only the tag tells them apart.
    assert resolve_num_sms(tag="nvidia/nvidia-a30", arch="sm_80") == 56


def test_unambiguous_arch_lookup():
    assert resolve_num_sms(arch="sm_70") == 80
    assert resolve_num_sms(tag="", arch="sm_60") == 56


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"])
def test_ambiguous_arch_is_refused_with_a_request_for_num_sms(arch):
    with pytest.raises(UnknownGPUError) as info:
        resolve_num_sms(arch=arch)
    message = str(info.value)
    assert "spans GPUs with different SM counts" in message
    assert arch in message
    assert "num_sms=" in message


def test_unknown_tag_and_arch_name_what_was_found():
    with pytest.raises(UnknownGPUError) as info:
        resolve_num_sms(tag="vendor/unknown-gpu", arch="sm_1")
    message = str(info.value)
    assert "'vendor/unknown-gpu'" in message and "'sm_1'" in message
    assert "num_sms=" in message
    assert "spans" not in message


def test_nothing_known_is_refused():
    with pytest.raises(UnknownGPUError, match="num_sms="):
        resolve_num_sms()


@pytest.mark.parametrize("bad", [0, -4, 2.0, 1.5, "132", True, False])
def test_invalid_counts_are_refused(bad):
    with pytest.raises(UnknownGPUError, match="positive int"):
        resolve_num_sms(bad, tag="nvidia/nvidia-a100")


def test_integer_like_counts_become_ints():
    value = resolve_num_sms(np.int64(7))
    assert value == 7 and type(value) is int


def test_unknown_gpu_error_is_a_value_error():
    assert issubclass(UnknownGPUError, ValueError)


def test_table_is_read_only():
    with pytest.raises(TypeError):
        gpus.SM_COUNT_BY_TAG["nvidia/nvidia-a100"] = 1  # type: ignore[index]


def test_table_tags_are_tvm_tags_except_the_documented_ones():
    unregistered = {tag for tag in SM_COUNT_BY_TAG if tag not in REGISTERED_TAGS}
    assert unregistered == {
        "nvidia/nvidia-h100-pcie",
        "nvidia/nvidia-h200",
        "nvidia/nvidia-l4",
        "nvidia/nvidia-l40s",
    }


def test_arch_table_agrees_with_every_tag_of_that_arch():
    for arch, count in SM_COUNT_BY_ARCH.items():
        tags = [tag for tag, a in TABLE_ARCH.items() if a == arch]
        assert tags, f"no tag of the table has arch {arch}"
        assert {SM_COUNT_BY_TAG[tag] for tag in tags} == {count}, arch


def test_archs_whose_tags_disagree_are_not_in_the_arch_table():
    counts: dict[str, set[int]] = {}
    for tag, arch in TABLE_ARCH.items():
        counts.setdefault(arch, set()).add(SM_COUNT_BY_TAG[tag])
    ambiguous = {arch for arch, found in counts.items() if len(found) > 1}
    assert {"sm_80", "sm_86", "sm_75"} <= ambiguous
    assert not ambiguous & set(SM_COUNT_BY_ARCH)
    for arch in ambiguous:
        with pytest.raises(UnknownGPUError, match="num_sms="):
            resolve_num_sms(arch=arch)


# Through the primitive: the target a user passes is where the tag and arch come from.


@pytest.fixture(scope="module")
def gemm_func():
    return workloads.gemm(64, 64, 64)


def _stream_k(func, **kwargs):
    sch = workloads.reference_schedule(func)
    return tvm_streamk.stream_k(sch, "C_update", **kwargs)


def test_stream_k_reads_the_count_from_a_target_tag_string(gemm_func):
    plan = _stream_k(gemm_func, target="nvidia/nvidia-a100", policy="data_parallel")
    assert plan.num_sms == 108


def test_stream_k_reads_the_count_from_a_target_built_from_a_tag(gemm_func):
    plan = _stream_k(
        gemm_func, target=tvm.target.Target("nvidia/nvidia-h100"), policy="data_parallel"
    )
    assert plan.num_sms == 132


def test_stream_k_reads_the_count_from_a_target_carrying_its_tag(gemm_func):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80", "tag": "nvidia/nvidia-a30"})
    assert _stream_k(gemm_func, target=target, policy="data_parallel").num_sms == 56


def test_stream_k_reads_the_count_from_an_unambiguous_arch(gemm_func):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_70"})
    assert _stream_k(gemm_func, target=target).num_sms == 80


def test_stream_k_explicit_count_wins_over_the_target(gemm_func):
    plan = _stream_k(gemm_func, target="nvidia/nvidia-a100", num_sms=3, blocks_per_sm=1)
    assert plan.grid == 3


def test_stream_k_refuses_an_ambiguous_arch_asking_for_num_sms(gemm_func):
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    with pytest.raises(StreamKError) as info:
        _stream_k(gemm_func, target=target)
    assert info.value.condition == "num-sms"
    assert "sm_80" in str(info.value) and "num_sms" in str(info.value)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_stream_k_refuses_invalid_counts(gemm_func, bad):
    with pytest.raises(StreamKError) as info:
        _stream_k(gemm_func, target="nvidia/nvidia-a100", num_sms=bad)
    assert info.value.condition == "num-sms"


@pytest.mark.parametrize(
    "target, expected",
    [
        ("nvidia/nvidia-h100", 132),  # the tag, recovered from the attributes TVM 0.27 keeps
        ("nvidia/nvidia-a100", 108),
        ({"kind": "cuda", "arch": "sm_70"}, 80),  # no tag: the arch decides
    ],
)
def test_one_resolver_for_every_integration(target, expected):
    target = tvm.target.Target(target)
    assert gpus.num_sms_for_target(None, target) == expected
    assert gpus.num_sms_for_target(7, target) == 7
    # The MetaSchedule rule resolves through it too (it used to read Target.tag, empty in 0.27).
    from tvm.s_tir import meta_schedule as ms

    rule = tvm_streamk.meta_schedule.StreamKRule()
    rule._initialize_with_tune_context(ms.TuneContext(target=target))
    assert rule._resolved_sms == expected


def test_an_opencl_target_is_told_about_compute_units():
    with pytest.raises(UnknownGPUError, match=r"tvm_streamk\.pocl\.compute_units\(\)"):
        gpus.num_sms_for_target(None, tvm.target.Target({"kind": "opencl"}))

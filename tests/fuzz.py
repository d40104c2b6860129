"""What the fuzz tests share: the campaign knobs (``TVM_STREAMK_FUZZ_SEED``,
``TVM_STREAMK_FUZZ_EXAMPLES``: docs/testing.md), the knob strategies, and the share of drawn
cases that must be decided. The knob fuzz (tests/decision/test_knob_fuzz.py), the workload
fuzz (tests/decision/test_workload_fuzz.py) and the model fuzz
(tests/integrations/test_model_fuzz.py) draw them."""

import os

from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st

from tvm_streamk import fixup_registry
from tvm_streamk.decomposition import policy as policies

# The share of drawn cases that must be decided (not refused, not without a site).
MIN_DECIDED_SHARE = 0.5
# TVM_STREAMK_FUZZ_SEED=<n> draws other cases than the suite's fixed ones (a campaign).
FUZZ_SEED = os.environ.get("TVM_STREAMK_FUZZ_SEED")
EXAMPLES = os.environ.get("TVM_STREAMK_FUZZ_EXAMPLES")


def drawn(default_examples: int = 24):
    """A decorator running a ``@given`` function on ``default_examples`` cases (or
    ``TVM_STREAMK_FUZZ_EXAMPLES``), seeded by ``TVM_STREAMK_FUZZ_SEED`` where it is set."""

    def wrap(test):
        test = settings(
            max_examples=int(EXAMPLES or default_examples),
            deadline=None,
            derandomize=FUZZ_SEED is None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )(test)
        return seed(int(FUZZ_SEED))(test) if FUZZ_SEED is not None else test

    return wrap


@st.composite
def knobs(draw):
    policy = draw(st.sampled_from(policies.names()))
    # The run-time grid is stream_k's alone: drawn for a quarter of its cases, and for one in
    # eight of the others' (their refusal).
    device_grid = draw(st.integers(0, 3 if policy == "stream_k" else 7)) == 0
    out = {
        "policy": policy,
        "num_sms": "device" if device_grid else draw(st.integers(1, 7)),
        "blocks_per_sm": draw(st.integers(1, 3)),
        # Every registered fix-up: a new one is drawn without touching this test.
        "fixup": draw(st.sampled_from(["auto", *fixup_registry.names()])),
        "deterministic": draw(st.sampled_from([False, False, False, True])),
        "group": draw(st.one_of(st.none(), st.integers(1, 4))),
        "batch_invariant": draw(st.sampled_from([False, False, False, True])),
    }
    if policy == "split_k":
        out["splits"] = draw(st.integers(1, 6))
    if policy == "hybrid":
        out["variant"] = draw(st.sampled_from(policies.variants("hybrid")))
    return out


@st.composite
def run_time_knobs(draw):
    """The knobs a run-time tile count takes (hybrids and tile orders are refused there, with
    their reason: test_runtime_tiles.py)."""
    out = draw(knobs())
    out["policy"] = draw(st.sampled_from(["data_parallel", "split_k", "stream_k", "heuristic"]))
    for knob in ("group", "variant", "splits"):
        out.pop(knob, None)
    if out["policy"] == "split_k":
        out["splits"] = draw(st.integers(1, 4))
    return out


def fewer_conflicts(draw, decision: dict) -> dict:
    """``decision`` with the device's grid for Stream-K alone, and the fix-up left to the
    decision in half the cases: the other policies refuse the device's grid, and a fix-up
    named with an epilogue, determinism or batch invariance is often refused (each with its
    reason; test_knob_fuzz.py draws them), and most cases of the workload and model fuzz
    must be decided."""
    if decision["num_sms"] == "device" and decision["policy"] != "stream_k":
        decision["num_sms"] = draw(st.integers(1, 7))
    if draw(st.booleans()):
        decision["fixup"] = "auto"
    return decision

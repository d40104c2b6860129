"""MetaSchedule integration: Stream-K candidates in the design space, measured and modelled."""

from ..lowered_view import has_stream_k, lowered_view
from .annotate import annotate_stream_k, applicable_fixups, site_of
from .builder import build, export, stream_k_builder
from .features import StreamKFeatureExtractor
from .mutator import MutateStreamK, stream_k_decisions
from .rule import StreamKKnobs, StreamKRule
from .runner import PoclRunner
from .tune import (
    best_schedule,
    compile_tuned,
    mutator_probs,
    opencl_target,
    postprocs,
    schedule_rules,
    space,
    tune,
)

__all__ = [
    "MutateStreamK",
    "PoclRunner",
    "StreamKFeatureExtractor",
    "StreamKKnobs",
    "StreamKRule",
    "annotate_stream_k",
    "applicable_fixups",
    "best_schedule",
    "build",
    "compile_tuned",
    "export",
    "has_stream_k",
    "lowered_view",
    "mutator_probs",
    "opencl_target",
    "postprocs",
    "schedule_rules",
    "site_of",
    "space",
    "stream_k_builder",
    "stream_k_decisions",
    "tune",
]

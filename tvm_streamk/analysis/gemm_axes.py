"""The GEMM view of a multiply-accumulate reduction, and which reductions are depthwise.

A reduction ``C[...] += A[...] * B[...]`` reads as ``C[S, I, J] += A[S, I, K] * B[S, J, K]``
when each of its iteration variables of extent above 1 indexes all three buffers (a batch
axis, S), the output and one operand (I with A, J with B), or, reducing, both operands and not
the output (K). That is the form dlight's ``gpu.Matmul`` normalises to and
:func:`tvm_streamk.workloads.implicit_gemm_schedule` tiles; :func:`gemm_axes` finds it.

The indices are read simplified over the block's iteration domain first. TVM's own TE
convolutions (``meta_schedule.testing.te_workload``) read input channel
``co // CO * CI + rc`` for any group count; ungrouped, ``co < CO`` makes that ``rc``, and the
output channel ``co`` is the J axis it is. Read unsimplified, ``co`` indexes all three buffers,
a batch axis, and the convolution looks like a depthwise one (dlight's ``gpu.Matmul`` declines
it for that reason).

A depthwise reduction (:func:`is_depthwise`) is one where each output reads one input channel:
the filter has no axis of its own (no J, or no I), so a GEMM tile has nothing to reuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from tvm import tirx

from .._compat import SBlock, arith, structural_walk
from .flops import multiply_accumulates


@dataclass(frozen=True)
class GemmAxes:
    """The iteration variables of a reduction block by their role in
    ``C[S, I, J] += A[S, I, K] * B[S, J, K]``; ``unit`` holds those of extent 1, which play
    none. ``indices`` are A's, B's and C's, simplified as classified."""

    batch: tuple
    i: tuple
    j: tuple
    k: tuple
    unit: tuple
    extents: dict
    indices: tuple

    def extent(self, axes: tuple) -> int:
        """The product of the extents of ``axes`` (1 for none)."""
        return prod(self.extents[v] for v in axes)

    def role(self, var) -> str:
        """``"batch"``, ``"i"``, ``"j"``, ``"k"`` or ``"unit"``: what ``var`` is."""
        return next(r for r in ROLES if any(var.same_as(v) for v in getattr(self, r)))

    def used_by(self, buffer: int) -> set:
        """The variables indexing A (0), B (1) or C (2)."""
        return _vars_of(self.indices[buffer])


ROLES = ("batch", "i", "j", "k", "unit")


def gemm_axes(block: SBlock) -> GemmAxes | None:
    """``block``'s axes as a GEMM's, or None when it is not ``C[S, I, J] += A[S, I, K] *
    B[S, J, K]``.

    The block qualifies when:

    1. it adds a product to its accumulator, reads two buffers and writes one, each at one
       point per iteration, and every iteration variable has a constant extent;
    2. with its indices simplified over its iteration domain, each iteration variable of extent
       above 1 is spatial and indexes the output and one or both operands (I, J or S), or
       reduces and indexes both operands but not the output (K).

    Examples
    --------
    >>> from tvm_streamk import workloads
    >>> from tvm_streamk.analysis import blocks_under, is_reduction
    >>> func = workloads.conv(data_shape=(1, 9, 9, 4), weight_shape=(3, 3, 4, 8), layout="NHWC")
    >>> (block,) = [b for b in blocks_under(func.body) if is_reduction(b)]
    >>> axes = gemm_axes(block)
    >>> axes.extent(axes.i), axes.extent(axes.j), axes.extent(axes.k)
    (49, 8, 36)
    """
    if not multiply_accumulates(block) or len(block.reads) != 2 or len(block.writes) != 1:
        return None
    if not all(isinstance(iv.dom.extent, tirx.IntImm) for iv in block.iter_vars):
        return None
    analyzer = arith.Analyzer()
    for iv in block.iter_vars:
        # A variable of extent 1 stays in the indices (bound, it would simplify to 0): it plays
        # no role, but ``reindex`` gives it a dimension, which the GEMM's index maps must match.
        if int(iv.dom.extent) != 1:
            analyzer.bind(iv.var, iv.dom)
    indexed = []
    for region in (*block.reads, *block.writes):
        if not all(isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1 for r in region.region):
            return None
        indexed.append(tuple(analyzer.simplify(r.min) for r in region.region))
    in_a, in_b, in_c = (_vars_of(indices) for indices in indexed)
    roles: dict[str, list] = {role: [] for role in ROLES}
    for iv in block.iter_vars:
        var = iv.var
        a, b, c = var in in_a, var in in_b, var in in_c
        if int(iv.dom.extent) == 1:
            role = "unit"
        elif iv.iter_type == tirx.IterVar.DataPar and c and (a or b):
            role = "batch" if a and b else "i" if a else "j"
        elif iv.iter_type == tirx.IterVar.CommReduce and a and b and not c:
            role = "k"
        else:
            return None
        roles[role].append(var)
    return GemmAxes(
        **{role: tuple(vs) for role, vs in roles.items()},
        extents={iv.var: int(iv.dom.extent) for iv in block.iter_vars},
        indices=tuple(indexed),
    )


def is_depthwise(block: SBlock) -> bool:
    """Whether ``block`` is a depthwise reduction: each output reads one input channel.

    In GEMM terms (:func:`gemm_axes`), the block requires:

    1. a batch axis (S, the channel) of extent above 1;
    2. no reduction axis (K) in any operand index that a batch axis is in: the channel an
       output reads is fixed by the output alone (``c``, or ``c // multiplier``), not summed
       over (a grouped convolution reads ``g * C/G + rc``);
    3. no I axis or no J axis: one operand, the filter, is indexed by the channel and the
       window only, so neither operand is reused across a tile of outputs.

    A dense convolution has no batch axis (its output channel is J); a grouped one sums over
    the channels of its group; a batched GEMM has both I and J: none of them is depthwise.
    """
    axes = gemm_axes(block)
    if axes is None or not axes.batch or (axes.i and axes.j):
        return False
    for indices in axes.indices[:2]:
        for index in indices:
            used = _vars_of((index,))
            if any(v in used for v in axes.batch) and any(v in used for v in axes.k):
                return False
    return True


def _vars_of(indices) -> set:
    found: set = set()
    for index in indices:
        structural_walk(index, (tirx.Var, found.add))
    return found

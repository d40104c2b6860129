"""What the model needs of a kernel, read from its analysed site (:class:`KernelTraits`).

* the tile: the first write-back's tile shape (:func:`~tvm_streamk.analysis.writeback_tile_shape`),
  its last axis the tile's columns and the product of the others its rows;
* the K depth of a panel: the update block's reduction extents times the K depth of one of its
  instances (1 for a scalar update; for a tensor-core instance reading an ``m x k`` and a
  ``k x n`` region into an ``m x n`` one, ``sqrt(|A| |B| / |C|) = k``), over the panels;
* the dtypes: of the operands the update reads, of the accumulator and of the output;
* the instruction class: tensor cores (``"mma"``) for a fragment accumulator, else FFMA;
* the GEMM's extents: the output's last axis is ``n``, its other elements ``m`` (0 when they are
  known only at run time), and the inputs' bytes from the function's parameters.
"""

from __future__ import annotations

import math
from dataclasses import replace

import tvm
from tvm import tirx

from .._compat import loaded_buffer, param_buffers
from ..analysis import StreamKSite, writeback_tile_shape
from .gpu_specs import spec_for
from .model import DEFAULT_COST, priced
from .physical import KernelTraits, UnpricedError, price

__all__ = ["cost_for", "costing", "not_a_gpu", "traits_of", "why_unpriced"]


def traits_of(site: StreamKSite) -> KernelTraits:
    """The :class:`KernelTraits` of ``site``'s kernel.

    Raises
    ------
    UnpricedError
        When the tile shape or the reduction depth is not a constant (a non-affine write-back,
        a run-time reduction extent), or the site carries no function.
    """
    if site.func is None:
        raise UnpricedError("the site carries no function to read the tile shape from")
    shape = writeback_tile_shape(site.func, site)
    if not shape:
        raise UnpricedError(
            f"the tile shape of block {site.block.name_hint!r} is not a constant (its write-back "
            "is not affine in the tile's loops)"
        )
    ragged_k = site.ragged is not None and site.ragged.reduction
    # A ragged reduction's K is each group's tokens, known on the device: priced per K-panel
    # (its iterations), the GEMM's K taken as one panel (cost_model.ragged sums the panels).
    depth = site.ragged.tokens_per_panel if ragged_k else _reduction_depth(site)
    output = site.writebacks[0].output
    dims = [int(d) if isinstance(d, tirx.IntImm) else None for d in output.shape]
    n = dims[-1] if dims[-1] is not None else shape[-1]
    rows = math.prod(dims[:-1]) if None not in dims[:-1] else 0
    return KernelTraits(
        tile_m=math.prod(shape[:-1]),
        tile_n=shape[-1],
        panel_k=depth if ragged_k else -(-depth // site.panels),
        in_dtype=_operand_dtype(site),
        acc_dtype=site.accumulator_dtype,
        out_dtype=str(output.dtype),
        instruction="mma" if site.fragment_accumulator else "ffma",
        m=rows,
        n=n,
        k=depth,
        input_bytes=_input_bytes(site) if rows and not ragged_k else None,
    )


def _reduction_depth(site: StreamKSite) -> int:
    """K: the update block's reduction extents times one instance's depth."""
    depth = 1
    for iv in site.block.iter_vars:
        if iv.iter_type != tirx.IterVar.CommReduce:
            continue
        if not isinstance(iv.dom.extent, tirx.IntImm):
            raise UnpricedError(
                f"block {site.block.name_hint!r} reduces over a run-time extent {iv.dom.extent}"
            )
        depth *= int(iv.dom.extent)
    return depth * _instance_depth(site)


def _instance_depth(site: StreamKSite) -> int:
    """The K depth of one instance of the update block: 1 for a scalar update."""
    acc = site.accumulator
    written = [_elements(r) for r in site.block.writes if loaded_buffer(r).same_as(acc)]
    read = sorted(
        (_elements(r) for r in site.block.reads if not loaded_buffer(r).same_as(acc)), reverse=True
    )
    if not written or len(read) < 2 or None in written or None in read[:2] or not written[0]:
        return 1
    return max(1, round(math.sqrt(read[0] * read[1] / written[0])))


def _elements(region) -> int | None:
    extents = [r.extent for r in region.region]
    if any(not isinstance(e, tirx.IntImm) for e in extents):
        return None
    return math.prod(int(e) for e in extents)


def _operand_dtype(site: StreamKSite) -> str:
    for region in site.block.reads:
        if not loaded_buffer(region).same_as(site.accumulator):
            return str(loaded_buffer(region).dtype)
    return site.accumulator_dtype


def _input_bytes(site: StreamKSite) -> float | None:
    """Bytes of the function's parameters other than the outputs (None if one is symbolic)."""
    outputs = [wb.output for wb in site.writebacks]
    total = 0
    for buf in param_buffers(site.func):
        if not hasattr(buf, "shape") or any(buf.same_as(o) for o in outputs):
            continue
        if any(not isinstance(d, tirx.IntImm) for d in buf.shape):
            return None
        width = max(1, tvm.runtime.DataType(str(buf.dtype)).bits // 8)
        total += math.prod(int(d) for d in buf.shape) * width
    return float(total)


def cost_for(site: StreamKSite, target, fixup: str, default=None):
    """The model's constants for ``site`` on ``target``: in microseconds when the target is a GPU
    of :data:`~.gpu_specs.GPU_SPECS` and the kernel can be priced, else ``default``
    (:data:`~.model.DEFAULT_COST` when None), in units of one K-panel iteration.

    ``target`` is a ``tvm.target.Target``, a name of :data:`~.gpu_specs.GPU_SPECS` or None.
    """
    return costing(site, target, fixup, default)[0]


def why_unpriced(site: StreamKSite, target, fixup: str) -> str | None:
    """Why :func:`cost_for` falls back to units for ``site`` on ``target``, or None when it
    prices the kernel in microseconds (or no target is named)."""
    return costing(site, target, fixup)[1]


def costing(site: StreamKSite, target, fixup: str, default=None) -> tuple:
    """``(cost_for(...), why_unpriced(...))`` from one pricing of the kernel."""
    fallback = DEFAULT_COST if default is None else default
    # A batch-invariant view (site.chunked) merges every chunk of every tile.
    fallback = replace(fallback, chunk_merges=bool(site.chunk))
    spec = spec_for(target)
    if spec is None:
        return fallback, None if target is None else not_a_gpu(target)
    try:
        cost = priced(price(traits_of(site), spec, fixup))
    except UnpricedError as err:
        return fallback, str(err)
    return replace(cost, chunk_merges=bool(site.chunk)), None


def not_a_gpu(target) -> str:
    """That :data:`~.gpu_specs.GPU_SPECS` holds no specification of ``target`` (a
    ``tvm.target.Target`` or a name), naming it as a user does."""
    return f"{_named(target)} is not a GPU of tvm_streamk.cost_model.GPU_SPECS"


def _named(target) -> str:
    """A target as a user names it: its tag, else its kind and arch (not its whole JSON)."""
    if isinstance(target, str):
        return target
    from .._compat import target_arch, target_tag

    tag = target_tag(target)
    arch = target_arch(target)
    return tag or f"{target.kind.name} target" + (f" ({arch})" if arch else "")

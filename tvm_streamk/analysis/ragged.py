"""Grouped GEMM: G GEMMs of different row counts in one kernel, written over *ragged views*.

A grouped GEMM is written as the batched GEMM over views: root-allocated buffers of shape
``(G, rows, ...)`` in scope :data:`RAGGED_SCOPE` whose element ``[g, i, ...]`` is element
``[offsets[g] + i, ...]`` of a real parameter buffer, valid while
``i < offsets[g + 1] - offsets[g]``. The function attribute :data:`RAGGED_ATTR` declares them::

    {"offsets": "offsets", "views": {"X_group": "X", "Y_group": "Y"}}

(parameter and buffer names). Schedules, dlight and Stream-K see an ordinary batched GEMM
whose group axis is the batch (:func:`tvm_streamk.workloads.grouped_gemm` builds one);
:mod:`tvm_streamk.transform.ragged_views` turns every access of a view into the guarded access
of its real buffer, so the kernel as scheduled is correct: a block past its group's rows
stores nothing. That kernel launches a tile per group for every row tile of the largest
possible group. The Stream-K lowering walks only the tiles that hold rows: group ``g`` has
``ceil(rows(g) / tile_rows)`` row tiles, their prefix sums (the group tile offsets) are
computed on the device by a prologue kernel, and a tile index finds its group by binary search
in them (:mod:`tvm_streamk.transform.tile_space`).

A grouped *weight gradient* (:func:`tvm_streamk.workloads.grouped_weight_grad`) reads the
views along its reduction and writes a real buffer: its tiles are the band's (a group axis
outermost), but a tile of group ``g`` has ``ceil(rows(g) / tokens_per_panel)`` K-panels, zero
for an empty group (*ragged K*, :class:`RaggedReduction`). The persistent walk then counts
iterations, not tiles: group ``g`` holds ``tiles_per_group * panels(g)`` of them, their prefix
sums are written on the device by the same prologue kernel, and an iteration finds its group
by the same binary search. For the decision an iteration is one panel of one tile, so a ragged
reduction is planned as a grouped GEMM's tile space is: a count only the device knows.

Preconditions the kernel relies on, as CUTLASS's and MLC's grouped GEMMs do: ``offsets`` is
non-decreasing from 0 and ``offsets[G]`` is at most the real buffers' row count.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx

from .._compat import (
    BufferLoadNode,
    SBlock,
    SBlockRealize,
    arith,
    dtype_of,
    loaded_buffer,
    structural_map,
    structural_walk,
)
from ..errors import StreamKError
from .blocks import uses_var

RAGGED_ATTR = "tvm_streamk.ragged"
# A tagged global scope: schedules accept it, and a build that skips the view lowering fails
# (TVM finds no memory info for the tag) instead of reading an unwritten buffer.
RAGGED_SCOPE = "global.tvm_streamk_ragged"
COND_RAGGED = "ragged-groups"


def _int64(value) -> tirx.Expr:
    if isinstance(value, int):
        return tirx.IntImm("int64", value)
    return value if dtype_of(value) == "int64" else tirx.Cast("int64", value)


@dataclass(frozen=True, eq=False)
class RaggedViews:
    """The views of a grouped function (the declaration of :data:`RAGGED_ATTR`)."""

    offsets: tirx.Buffer
    views: tuple[tuple[tirx.Buffer, tirx.Buffer], ...]  # (view, real) pairs

    @property
    def groups(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def real_of(self, view: tirx.Buffer) -> tirx.Buffer | None:
        return next((real for v, real in self.views if v.same_as(view)), None)

    def rows(self, group, bound=None) -> tirx.Expr:
        """The row count of ``group`` (int64), clamped to ``[0, bound]`` when given."""
        g = _int64(group)
        rows = _int64(tirx.BufferLoad(self.offsets, [g + 1])) - _int64(
            tirx.BufferLoad(self.offsets, [g])
        )
        if bound is None:
            return rows
        return tirx.min(tirx.max(rows, _int64(0)), _int64(bound))

    def start(self, group) -> tirx.Expr:
        """The first real row of ``group`` (int64)."""
        return _int64(tirx.BufferLoad(self.offsets, [_int64(group)]))


def _refuse(found: str, todo: str):
    raise StreamKError(COND_RAGGED, found, todo)


def ragged_views(func: tirx.PrimFunc) -> RaggedViews | None:
    """The declared views of ``func`` (None without :data:`RAGGED_ATTR`), checked."""
    attrs = func.attrs
    if attrs is None or RAGGED_ATTR not in attrs:
        return None
    spec = attrs[RAGGED_ATTR]
    todo = (
        "Declare {'offsets': <int parameter of shape (G + 1,)>, 'views': {<view>: <parameter>}} "
        "as tvm_streamk.workloads.grouped_gemm does."
    )
    if "offsets" not in spec or "views" not in spec:
        _refuse(f"{RAGGED_ATTR} = {spec} without 'offsets' and 'views'", todo)
    params = {b.name: b for b in func.params}
    offsets = params.get(str(spec["offsets"]))
    if offsets is None or len(offsets.shape) != 1 or "int" not in str(offsets.dtype):
        _refuse(f"offsets {spec['offsets']!r}: no integer vector parameter of that name", todo)
    if not isinstance(offsets.shape[0], tirx.IntImm) or int(offsets.shape[0]) < 2:
        _refuse(f"offsets {offsets.name} of shape {list(offsets.shape)}", todo)
    groups = int(offsets.shape[0]) - 1
    root = func.body.block
    allocated = {b.name: b for b in root.alloc_buffers}
    pairs = []
    for view_name, real_name in spec["views"].items():
        view, real = allocated.get(str(view_name)), params.get(str(real_name))
        if real is None:
            _refuse(f"view {view_name!r} of {real_name!r}: no parameter of that name", todo)
        if view is None:
            _refuse(
                f"view {view_name!r} of {real_name!r} is no longer a root buffer of the function "
                f"(root buffers: {sorted(allocated)})",
                "A schedule replaced the view (dlight's gpu.Matmul pads it into a reindex "
                "buffer and drops the store): schedule grouped GEMMs with "
                "tvm_streamk.workloads.reference_schedule, or any schedule that keeps the views.",
            )
        if view.scope() != RAGGED_SCOPE:
            _refuse(
                f"view {view.name} in scope {view.scope()!r}", f"Allocate it in {RAGGED_SCOPE!r}."
            )
        same_rest = len(view.shape) == len(real.shape) + 1 and all(
            arith.Analyzer().can_prove_equal(a, b)
            for a, b in zip(view.shape[2:], real.shape[1:], strict=True)
        )
        if not same_rest or str(view.dtype) != str(real.dtype):
            _refuse(
                f"view {view.name} {list(view.shape)} {view.dtype} of {real.name} "
                f"{list(real.shape)} {real.dtype}",
                "A view is (groups, rows, *rest) of a real (total rows, *rest) buffer, same dtype.",
            )
        if not (isinstance(view.shape[0], tirx.IntImm) and int(view.shape[0]) == groups):
            _refuse(
                f"view {view.name} of {view.shape[0]} groups and offsets of {groups}",
                "Give the views one group per offsets entry but the last.",
            )
        pairs.append((view, real))
    return RaggedViews(offsets=offsets, views=tuple(pairs))


class _Grouped:
    """What both ragged spaces count by: their groups and the band's other tiles."""

    @property
    def groups(self) -> int:
        return self.views.groups

    @property
    def others(self) -> int:
        out = 1
        for e in self.other_extents:
            out *= e
        return out


@dataclass(frozen=True, eq=False)
class RaggedSpace(_Grouped):
    """The tile space of a grouped Stream-K site (see the module docstring)."""

    # Rows are ragged (a grouped GEMM); :class:`RaggedReduction` has a ragged K.
    reduction = False
    kind = "grouped GEMM"  # what messages call it

    views: RaggedViews
    group_axis: int | None  # the band loop that walks the groups (None for one group)
    row_axis: int  # the band loop that walks a group's row tiles
    tile_rows: int  # rows per tile
    row_bound: tirx.Expr  # the most rows a group may have (the views' row extent)
    total_rows: tirx.Expr  # the real buffers' row extent
    other_extents: tuple[int, ...]  # the band's other extents, in band order
    tile_offsets: tirx.Buffer  # (G + 1,) int64, written by the lowering's prologue
    tiles: tirx.Var  # the kernel's tile count, read from tile_offsets[G]

    def group_tiles(self, group) -> tirx.Expr:
        """The tiles of ``group`` (int64): its row tiles times the band's other tiles."""
        rows = self.views.rows(group, self.row_bound)
        per = _int64(self.tile_rows)
        return tirx.floordiv(rows + (per - 1), per) * _int64(self.others)

    def tiles_for(self, group_rows) -> int:
        """The tile count when the groups hold ``group_rows`` rows (what the kernel reads)."""
        per = self.tile_rows
        return sum((max(int(r), 0) + per - 1) // per for r in group_rows) * self.others

    @property
    def tile_bound(self) -> tirx.Expr:
        """At most this many tiles (int64): the sum over groups of ``ceil(rows / tile_rows)`` is
        below ``ceil(total_rows / tile_rows) + G`` when the offsets are valid."""
        per = _int64(self.tile_rows)
        row_tiles = tirx.floordiv(_int64(self.total_rows) + (per - 1), per)
        return (row_tiles + _int64(self.groups)) * _int64(self.others)

    @property
    def counter_tiles(self) -> tirx.Expr:
        """The tiles a fix-up keeps a counter for: at most :attr:`tile_bound`."""
        return self.tile_bound


@dataclass(frozen=True, eq=False)
class RaggedReduction(_Grouped):
    """The iteration space of a Stream-K site whose K is ragged (module docstring).

    ``tiles``, ``tile_offsets``, ``tile_bound`` and :meth:`group_tiles` count *iterations*
    (one K-panel of one tile), as :class:`RaggedSpace`'s count tiles: the walk's units.
    """

    reduction = True
    kind = "grouped weight gradient"  # what messages call it
    views: RaggedViews
    tokens_per_panel: int  # the reduction rows one K-panel covers
    row_bound: tirx.Expr  # the most rows a group may have (the views' row extent)
    total_rows: tirx.Expr  # the real buffers' row extent
    other_extents: tuple[int, ...]  # the band's extents after the group axis
    tile_offsets: tirx.Buffer  # (G + 1,) int64 iteration offsets, written by the prologue
    tiles: tirx.Var  # the kernel's iteration count, read from tile_offsets[G]

    @property
    def real_tiles(self) -> int:
        """The band's tiles: ``groups * others``, a compile-time count."""
        return self.groups * self.others

    @property
    def counter_tiles(self) -> int:
        return self.real_tiles

    def group_panels(self, group) -> tirx.Expr:
        """The K-panels of every tile of ``group`` (int64): ``ceil(rows / tokens_per_panel)``."""
        rows = self.views.rows(group, self.row_bound)
        per = _int64(self.tokens_per_panel)
        return tirx.floordiv(rows + (per - 1), per)

    def group_tiles(self, group) -> tirx.Expr:
        """The iterations of ``group`` (int64): its tiles times their panels."""
        return self.group_panels(group) * _int64(self.others)

    def panels_for(self, group_rows) -> list[int]:
        """Each group's K-panels when the groups hold ``group_rows`` rows."""
        per = self.tokens_per_panel
        return [(max(int(r), 0) + per - 1) // per for r in group_rows]

    def tiles_for(self, group_rows) -> int:
        """The iteration count when the groups hold ``group_rows`` rows."""
        return sum(self.panels_for(group_rows)) * self.others

    @property
    def tile_bound(self) -> tirx.Expr:
        """At most this many iterations (int64): the panels over groups are below
        ``ceil(total_rows / tokens_per_panel) + G`` when the offsets are valid."""
        per = _int64(self.tokens_per_panel)
        panels = tirx.floordiv(_int64(self.total_rows) + (per - 1), per)
        return (panels + _int64(self.groups)) * _int64(self.others)


def ragged_space(
    func: tirx.PrimFunc, band: tuple[tirx.For, ...], writebacks, realize_of
) -> RaggedSpace | None:
    """The grouped tile space of a site whose write-back stores a ragged view (None when
    ``func`` declares no views, or its write-back stores none: :func:`ragged_reduction` then
    looks at the reduction); ``realize_of(block)`` is the block's realize."""
    declared = ragged_views(func)
    if declared is None:
        return None
    stores = [(wb, declared.real_of(wb.output)) for wb in writebacks]
    stores = [(wb, real) for wb, real in stores if real is not None]
    if not stores:
        # The views are read along the reduction, or not at all: ragged_reduction's to say.
        return None
    wb, real = stores[0]
    index = _store_index(wb.block, wb.output, realize_of(wb.block))
    band_vars = [loop.loop_var for loop in band]
    group_axis = _axis_of(index[0], band_vars)
    single = declared.groups == 1 and _is_zero(index[0])
    if group_axis is None and not single:
        _refuse(
            f"the group index {index[0]} of {wb.output.name} is not a tile band loop",
            "Bind the group (batch) axis of the grouped GEMM to its own blockIdx loop.",
        )
    row_uses = [i for i, v in enumerate(band_vars) if uses_var(index[1], v)]
    if len(row_uses) != 1 or row_uses[0] == group_axis:
        _refuse(
            f"the row index {index[1]} of {wb.output.name} uses band loops "
            f"{[band_vars[i].name for i in row_uses]}",
            "Tile the rows with one blockIdx loop of their own.",
        )
    row_axis = row_uses[0]
    tile_rows = _tile_rows(index[1], band_vars[row_axis])
    others = []
    for i, loop in enumerate(band):
        if i in (group_axis, row_axis):
            continue
        if not isinstance(loop.extent, tirx.IntImm):
            _refuse(
                f"band loop {loop.loop_var.name} of the run-time extent {loop.extent}",
                "Only the row tiles of a grouped GEMM may have a run-time extent.",
            )
        others.append(int(loop.extent))
    if group_axis is not None and int(band[group_axis].extent) != declared.groups:
        _refuse(
            f"group loop {band_vars[group_axis].name} of extent {band[group_axis].extent} for "
            f"{declared.groups} groups",
            "Walk every group with the group loop.",
        )
    return RaggedSpace(
        views=declared,
        group_axis=group_axis,
        row_axis=row_axis,
        tile_rows=tile_rows,
        row_bound=wb.output.shape[1],
        total_rows=real.shape[0],
        other_extents=tuple(others),
        tile_offsets=tirx.decl_buffer((declared.groups + 1,), "int64", name="sk_tile_offsets"),
        tiles=tirx.Var("sk_tiles", "int64"),
    )


def ragged_reduction(
    func: tirx.PrimFunc, band: tuple[tirx.For, ...], panel: tirx.For, writebacks, realize_of
) -> RaggedReduction | None:
    """The ragged iteration space of a site whose reduction reads ragged views (None when
    ``func`` declares no views); ``realize_of(block)`` is the block's realize.

    Every view read under the panel loop must index the group by the band's outermost loop and
    the row by ``panel * tokens_per_panel`` plus rows within the panel; the write-back stores a
    real buffer.
    """
    declared = ragged_views(func)
    if declared is None:
        return None
    todo = (
        "Write the grouped output through its view (a grouped GEMM), or read the views along "
        "the reduction into a real output (a grouped weight gradient, "
        "tvm_streamk.workloads.grouped_weight_grad)."
    )
    if any(declared.real_of(wb.output) is not None for wb in writebacks):
        return None
    band_vars = [loop.loop_var for loop in band]
    found = []  # (view, index) of every view read under the panel loop

    def on_realize(realize: SBlockRealize) -> None:
        block = realize.block
        binding = {iv.var: value for iv, value in zip(block.iter_vars, realize.iter_values)}

        def bound(v):
            return next((val for var, val in binding.items() if var.same_as(v)), v)

        def on_load(load) -> None:
            view = loaded_buffer(load)
            if declared.real_of(view) is not None:
                found.append((view, [structural_map(i, (tirx.Var, bound)) for i in load.indices]))

        structural_walk(block.body, (BufferLoadNode, on_load))

    structural_walk(panel.body, (SBlockRealize, on_realize))
    if not found:
        _refuse(
            f"a function declaring ragged views {[v.name for v, _ in declared.views]} whose "
            f"write-back stores {[wb.output.name for wb in writebacks]} and whose panel loop "
            "reads no view",
            todo,
        )
    per_panel = None
    for view, index in found:
        if _group_axis(index[0], band, declared.groups) != 0:
            _refuse(
                f"the group index {index[0]} of the view {view.name} read along the reduction "
                "is not the outermost tile band loop",
                "Bind the group axis of the grouped weight gradient to the outermost blockIdx "
                "loop (tvm_streamk.workloads.reference_schedule does).",
            )
        tokens = _tile_rows(index[1], panel.loop_var)
        if per_panel not in (None, tokens):
            _refuse(
                f"views read {per_panel} and {tokens} rows per K-panel",
                "Read every view with the same K-panel depth.",
            )
        per_panel = tokens
    others = []
    for loop in band[1:]:
        if not isinstance(loop.extent, tirx.IntImm):
            _refuse(
                f"band loop {loop.loop_var.name} of the run-time extent {loop.extent}",
                "Only the reduction of a grouped weight gradient is ragged: keep N and K static.",
            )
        others.append(int(loop.extent))
    if int(band[0].extent) != declared.groups:
        _refuse(
            f"group loop {band_vars[0].name} of extent {band[0].extent} for "
            f"{declared.groups} groups",
            "Walk every group with the group loop.",
        )
    view, real = declared.views[0]
    return RaggedReduction(
        views=declared,
        tokens_per_panel=per_panel,
        row_bound=view.shape[1],
        total_rows=real.shape[0],
        other_extents=tuple(others),
        tile_offsets=tirx.decl_buffer((declared.groups + 1,), "int64", name="sk_iteration_offsets"),
        tiles=tirx.Var("sk_iterations", "int64"),
    )


def _store_index(block: SBlock, buffer: tirx.Buffer, realize: SBlockRealize) -> list:
    """The indices ``block`` stores ``buffer`` at, in the loop variables around it."""
    found = []

    def visit(store) -> None:
        if store.buffer.same_as(buffer):
            found.append(store.indices)

    structural_walk(block.body, (tirx.BufferStore, visit))
    if len(found) != 1:
        _refuse(
            f"write-back block {block.name_hint!r} stores {buffer.name} {len(found)} times",
            "Store the grouped output once per element.",
        )
    binding = {iv.var: value for iv, value in zip(block.iter_vars, realize.iter_values)}

    def bound(v):
        return next((val for var, val in binding.items() if var.same_as(v)), v)

    return [structural_map(i, (tirx.Var, bound)) for i in found[0]]


def _is_zero(expr) -> bool:
    expr = arith.Analyzer().simplify(expr)
    return isinstance(expr, tirx.IntImm) and int(expr) == 0


def _group_axis(index, band, groups: int) -> int | None:
    """The band position of the loop a view's group ``index`` reads: of one group, the
    constant 0 TVM folds the group loop of extent 1 to reads the outermost loop when that
    loop is one wide."""
    axis = _axis_of(index, [loop.loop_var for loop in band])
    one_wide = groups == 1 and isinstance(band[0].extent, tirx.IntImm) and band[0].extent == 1
    if axis is None and one_wide and isinstance(index, tirx.IntImm) and int(index) == 0:
        return 0
    return axis


def _axis_of(expr, band_vars) -> int | None:
    expr = arith.Analyzer().simplify(expr)
    if isinstance(expr, tirx.Cast):
        expr = expr.value
    return next((i for i, v in enumerate(band_vars) if expr.same_as(v)), None)


def _tile_rows(index, row_var: tirx.Var) -> int:
    """The row-tile height: ``index`` is ``row_var * tile_rows`` plus offsets below it."""
    free = []
    structural_walk(index, (tirx.Var, lambda v: free.append(v)))

    def at(value: int):
        def sub(v):
            if v.same_as(row_var):
                return tirx.const(value, dtype_of(v))
            if any(v.same_as(f) for f in free):
                return tirx.const(0, dtype_of(v))
            return v

        out = arith.Analyzer().simplify(structural_map(index, (tirx.Var, sub)))
        return int(out) if isinstance(out, tirx.IntImm) else None

    first, second, third = at(0), at(1), at(2)
    if first != 0 or second is None or second <= 0 or third != 2 * second:
        _refuse(
            f"the row index {index} is not {row_var.name} * (rows per tile) + (rows within it)",
            "Split the row axis into row tiles and rows within a tile.",
        )
    return second

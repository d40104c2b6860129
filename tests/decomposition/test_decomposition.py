"""Tests of the work decomposition: hand-computed examples, properties, and error fixtures."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_streamk.decomposition import (
    INT_OPS,
    DecompositionError,
    Plan,
    plan,
    tile_order,
)
from tvm_streamk.decomposition import policy as policies

CONCRETE_POLICIES = tuple(dict.fromkeys(p.name for p in policies.concrete()))


def peers_in_k_order(p: Plan) -> dict[int, list[tuple[int, int]]]:
    """Per split tile, ``(block, position in work[block])`` of its segments in ``k`` order,
    found by enumerating the plan's work: the oracle of the peer closed forms."""
    by_tile: dict[int, list[tuple[int, int, int]]] = {}
    for b, segments in enumerate(p.work):
        for i, (tile, k0, _) in enumerate(segments):
            by_tile.setdefault(tile, []).append((k0, b, i))
    return {t: [(b, i) for _, b, i in sorted(v)] for t, v in by_tile.items() if len(v) > 1}


# --- Hand-computed examples ---------------------------------------------------------------------


def test_data_parallel_one_tile_per_block():
    p = plan(3, 4, None, policy="data_parallel")
    assert (p.grid, p.units(), p.reason) == (3, 1, "requested")
    assert p.work == [[(0, 0, 4)], [(1, 0, 4)], [(2, 0, 4)]]
    assert p.split_tiles == ()


def test_split_k_uneven_splits():
    # P=5, S=2: split 0 takes 5*0//2..5*1//2 = [0, 2), split 1 takes [2, 5).
    p = plan(2, 5, None, policy="split_k", splits=2)
    assert p.grid == 4
    assert p.work == [[(0, 0, 2)], [(0, 2, 5)], [(1, 0, 2)], [(1, 2, 5)]]
    assert p.split_tiles == (0, 1)
    assert p.peers(0) == 2


def test_stream_k_three_tiles_on_two_sms():
    # TOTAL = 12 over 2 blocks: [0, 6) and [6, 12); tile 1 is cut at k = 2.
    p = plan(3, 4, 2, policy="stream_k")
    assert (p.grid, p.sk_tiles) == (2, 3)
    assert p.work == [[(0, 0, 4), (1, 0, 2)], [(1, 2, 4), (2, 0, 4)]]
    assert p.split_tiles == (1,)
    assert [p.peers(t) for t in range(3)] == [1, 2, 1]
    assert p.iterations_per_block == [6, 6]


def test_stream_k_grid_capped_by_iterations():
    p = plan(1, 3, 8, policy="stream_k")
    assert p.grid == 3
    assert p.work == [[(0, 0, 1)], [(0, 1, 2)], [(0, 2, 3)]]


def test_hybrid_one_tile():
    # G = 2, R = 5 % 2 = 1: tile 0 is Stream-K over both blocks, tiles 1..4 data-parallel.
    p = plan(5, 2, 2, policy="hybrid", variant="one_tile")
    assert (p.grid, p.sk_tiles, p.units()) == (2, 1, 3)
    assert p.work == [
        [(0, 0, 1), (1, 0, 2), (3, 0, 2)],
        [(0, 1, 2), (2, 0, 2), (4, 0, 2)],
    ]


def test_hybrid_two_tile_is_default():
    # SK = R + G = 3 tiles (6 iterations) over 2 blocks, then tiles 3 and 4 data-parallel.
    p = plan(5, 2, 2, policy="hybrid")
    assert (p.variant, p.sk_tiles, p.units()) == ("two_tile", 3, 2)
    assert p.work == [[(0, 0, 2), (1, 0, 1), (3, 0, 2)], [(1, 1, 2), (2, 0, 2), (4, 0, 2)]]


def test_hybrid_full_waves_is_data_parallel():
    p = plan(6, 4, 3, policy="hybrid")
    assert p.sk_tiles == 0
    assert p.work == [[(0, 0, 4), (3, 0, 4)], [(1, 0, 4), (4, 0, 4)], [(2, 0, 4), (5, 0, 4)]]


def test_blocks_per_sm_multiplies_slots():
    assert plan(100, 8, 10, blocks_per_sm=3, policy="stream_k").grid == 30


def test_peers_of_a_stream_k_plan():
    p = plan(3, 4, 2, policy="stream_k")
    assert peers_in_k_order(p) == {1: [(0, 1), (1, 0)]}
    assert (p.split_tiles, p.max_peers, p.workspace_slots) == ((1,), 2, 4)


def test_nothing_split_without_peers():
    p = plan(4, 2, None, policy="data_parallel")
    assert (p.split_tiles, p.max_peers, p.workspace_slots) == ((), 1, 0)


def test_tile_order_row_major_with_batch():
    assert tile_order(7, (2, 2, 3)) == (1, 0, 1)
    assert tile_order(4, (5,)) == (4,)


def test_tile_order_grouped_short_last_group():
    # tiles_m = 3, tiles_n = 2, group 2: rows 0-1 column-major, then the short group of row 2.
    got = [tile_order(t, (3, 2), group=2) for t in range(6)]
    assert got == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]


def test_tile_order_grouped_keeps_batch_outermost():
    assert [tile_order(t, (2, 2, 2), group=2) for t in (3, 4, 5)] == [
        (0, 1, 1),
        (1, 0, 0),
        (1, 1, 0),
    ]


# --- Properties ---------------------------------------------------------------------------------

SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def plans(draw, policies=CONCRETE_POLICIES):
    tiles = draw(st.integers(1, 300))
    panels = draw(st.integers(1, 64))
    num_sms = draw(st.integers(1, 140))
    blocks_per_sm = draw(st.integers(1, 3))
    policy = draw(st.sampled_from(policies))
    kwargs = {}
    if policy == "split_k":
        kwargs["splits"] = draw(st.integers(1, min(panels, 8)))
    if policy == "hybrid":
        kwargs["variant"] = draw(st.sampled_from(("one_tile", "two_tile")))
    return plan(tiles, panels, num_sms, blocks_per_sm, policy, **kwargs)


@SETTINGS
@given(plans())
def test_every_iteration_covered_exactly_once(p):
    by_tile = {}
    for segments in p.work:
        for tile, k0, k1 in segments:
            assert 0 <= tile < p.tiles and 0 <= k0 < k1 <= p.panels
            by_tile.setdefault(tile, []).append((k0, k1))
    assert sorted(by_tile) == list(range(p.tiles))
    for ranges in by_tile.values():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == p.panels
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


@SETTINGS
@given(plans())
def test_grid_is_within_resident_slots_for_the_stream_k_family(p):
    if p.policy in ("stream_k", "hybrid"):
        assert p.grid <= p.num_sms * p.blocks_per_sm


@SETTINGS
@given(plans(("stream_k",)))
def test_stream_k_balances_iterations(p):
    counts = p.iterations_per_block
    assert max(counts) - min(counts) <= 1
    assert min(counts) >= 1


@SETTINGS
@given(plans(("hybrid",)))
def test_hybrid_data_parallel_tiles_are_owned_whole(p):
    sk = p.sk_tiles
    owners = {}
    for b, segments in enumerate(p.work):
        sk_iterations = 0
        for tile, k0, k1 in segments:
            if tile >= sk:
                assert (k0, k1) == (0, p.panels)
                owners.setdefault(tile, []).append(b)
            else:
                sk_iterations += k1 - k0
        # Stream-K work is spread evenly: every block gets floor or ceil of the mean.
        assert sk * p.panels // p.grid <= sk_iterations <= -(-sk * p.panels // p.grid)
    assert all(len(blocks) == 1 for blocks in owners.values())
    assert sorted(owners) == list(range(sk, p.tiles))


@SETTINGS
@given(plans(("split_k",)))
def test_split_k_segments_align_to_split_boundaries(p):
    P, S = p.panels, p.splits
    for b, segments in enumerate(p.work):
        t, s = divmod(b, S)
        assert segments == [(t, s * P // S, (s + 1) * P // S)]


@SETTINGS
@given(plans())
def test_block_range_matches_work(p):
    units = p.units()
    for b, segments in enumerate(p.work):
        walked = [(t * p.panels + k0, t * p.panels + k1) for t, k0, k1 in segments]
        ranges = [p.block_range(b, u, INT_OPS) for u in range(units)]
        assert all(0 <= lo and hi <= p.iterations for lo, hi in ranges if lo < hi)
        assert _merge(walked) == _merge([r for r in ranges if r[0] < r[1]])


def _merge(ranges):
    """Join touching half-open ranges."""
    merged = []
    for lo, hi in ranges:
        if merged and merged[-1][1] == lo:
            merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


@SETTINGS
@given(plans())
def test_closed_form_locate_peers_and_peer_index_match_work(p):
    order = peers_in_k_order(p)
    units = p.units()
    for b in range(p.grid):
        for u in range(units):
            lo, hi = p.block_range(b, u)
            for it in range(lo, hi):
                assert p.locate(it) == (b, u)
    for t in range(p.tiles):
        assert p.tile_peers(t) == p.peers(t)
    for b, segments in enumerate(p.work):
        for i, (t, k0, _) in enumerate(segments):
            expected = order[t].index((b, i)) if t in order else 0
            assert p.peer_index(b, t, k0) == expected


def test_closed_forms_with_empty_stream_k_blocks():
    # One Stream-K tile of 4 iterations over 6 blocks: two blocks get nothing, so the tile has
    # 4 peers although its first and last iteration sit 6 blocks apart.
    p = plan(7, 4, 6, policy="hybrid", variant="one_tile")
    assert (p.grid, p.sk_tiles) == (6, 1)
    assert [segments[0] for segments in p.work if segments[0][0] == 0] == [
        (0, 0, 1),
        (0, 1, 2),
        (0, 2, 3),
        (0, 3, 4),
    ]
    assert p.tile_peers(0) == p.peers(0) == 4
    for j, (b, i) in enumerate(peers_in_k_order(p)[0]):
        assert p.peer_index(b, 0, p.work[b][i][1]) == j


@SETTINGS
@given(plans(("stream_k",)))
def test_a_run_time_grids_peers_are_the_blocks_between_the_first_and_the_last(p):
    # What the workspace fix-up's peer record rests on under a grid read at run time (never
    # more blocks than iterations, as every stream_k plan): a split tile's peers are the
    # consecutive blocks from the one holding its panel 0 to the one holding panel P - 1, and
    # every peer but the first has the tile as its first segment.
    assert p.grid <= p.iterations
    holders: dict[int, list[tuple[int, int, int, int]]] = {}
    for b, work in enumerate(p.work):
        for index, (tile, k0, k1) in enumerate(work):
            holders.setdefault(tile, []).append((b, index, k0, k1))
    for tile, peers in holders.items():
        if len(peers) < 2:
            continue
        blocks = [b for b, _, _, _ in peers]
        assert blocks == list(range(blocks[0], blocks[-1] + 1)), tile
        assert peers[0][2] == 0 and peers[-1][3] == p.panels
        assert all(index == 0 for _, index, _, _ in peers[1:]), tile
        # The first peer's slot: its first segment is this tile exactly when its range starts
        # at the tile's first iteration.
        first_lo, _ = p.block_range(blocks[0], 0)
        assert (peers[0][1] == 0) == (first_lo == tile * p.panels)


@SETTINGS
@given(plans())
def test_split_tiles_and_peers_agree_with_the_work(p):
    order = peers_in_k_order(p)
    assert p.split_tiles == tuple(sorted(order))
    assert p.max_peers == max((len(v) for v in order.values()), default=1)
    for t, segments in order.items():
        k_begins = [p.work[b][i][1] for b, i in segments]
        assert k_begins[0] == 0 and k_begins == sorted(k_begins)
        assert [p.peer_block(t, j) for j in range(len(segments))] == [b for b, _ in segments]


@SETTINGS
@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=4),
    st.one_of(st.none(), st.integers(1, 10)),
)
def test_tile_order_is_a_bijection(extents, group):
    extents = tuple(extents)
    if group is not None and len(extents) < 2:
        group = None
    n = 1
    for e in extents:
        n *= e
    coords = [tile_order(t, extents, group) for t in range(n)]
    assert len(set(coords)) == n
    assert all(all(0 <= c < e for c, e in zip(cs, extents, strict=True)) for cs in coords)
    if group is None:
        assert coords == list(itertools.product(*(range(e) for e in extents)))


# --- Symbolic evaluation: the closed forms never branch in Python on a runtime value -------------


class Sym:
    """A tiny expression tree; using it in a Python condition raises, as a TIR PrimExpr would."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, env):
        return self.fn(env)

    def __add__(self, o):
        return Sym(lambda e: self(e) + _ev(o, e))

    def __radd__(self, o):
        return Sym(lambda e: _ev(o, e) + self(e))

    def __sub__(self, o):
        return Sym(lambda e: self(e) - _ev(o, e))

    def __rsub__(self, o):
        return Sym(lambda e: _ev(o, e) - self(e))

    def __mul__(self, o):
        return Sym(lambda e: self(e) * _ev(o, e))

    def __rmul__(self, o):
        return Sym(lambda e: _ev(o, e) * self(e))

    def __bool__(self):
        raise TypeError("a closed form branched in Python on a symbolic value")

    def __index__(self):
        raise TypeError("a closed form used a symbolic value as a Python int")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __floordiv__ = __mod__ = __bool__
    __hash__ = None


def _ev(x, env):
    return x(env) if isinstance(x, Sym) else x


def _lift(f):
    return lambda self, *args: Sym(lambda e: f(*(_ev(a, e) for a in args)))


class SymOps:
    floordiv = _lift(lambda a, b: a // b)
    floormod = _lift(lambda a, b: a % b)
    min = _lift(min)
    max = _lift(max)
    select = _lift(lambda c, a, b: a if c else b)
    lt = _lift(lambda a, b: a < b)
    le = _lift(lambda a, b: a <= b)
    ge = _lift(lambda a, b: a >= b)
    eq = _lift(lambda a, b: a == b)
    ne = _lift(lambda a, b: a != b)
    and_ = _lift(lambda a, b: a and b)


def _var(name):
    return Sym(lambda e: e[name])


@SETTINGS
@given(plans())
def test_closed_forms_evaluate_symbolically(p):
    ops = SymOps()
    b, u, g, it, t, k = (_var(n) for n in ("b", "u", "g", "it", "t", "k"))
    units = p.units(ops, g)
    lo, hi = p.block_range(b, u, ops, g)
    where = p.locate(it, ops, g)
    peers = p.tile_peers(t, ops, g)
    index = p.peer_index(b, t, k, ops, g)
    env = {"g": p.grid}
    assert _ev(units, env) == p.units()
    for env["b"], env["u"] in itertools.product(range(p.grid), range(min(p.units(), 3))):
        assert (_ev(lo, env), _ev(hi, env)) == p.block_range(env["b"], env["u"])
    for env["it"] in range(0, p.iterations, max(1, p.iterations // 50)):
        assert tuple(_ev(x, env) for x in where) == p.locate(env["it"])
    for env["t"] in range(0, p.tiles, max(1, p.tiles // 20)):
        assert _ev(peers, env) == p.peers(env["t"])
        env["b"], env["k"] = 0, 0
        assert _ev(index, env) == p.peer_index(0, env["t"], 0)


def _signed_division(f):
    def divide(a, b):
        assert a >= 0 and b > 0, f"a closed form divides {a} by {b}"
        return f(a, b)

    return divide


class SignCheckedOps(SymOps):
    """:class:`SymOps` whose divisions check the :class:`~tvm_streamk.decomposition.Ops`
    contract: a division whose value is used (a selected branch) divides a non-negative value
    by a positive one. The lowering relies on it where it divides with truncation."""

    floordiv = _lift(_signed_division(lambda a, b: a // b))
    floormod = _lift(_signed_division(lambda a, b: a % b))

    def select(self, cond, a, b):
        # Only the selected branch's value is used.
        return Sym(lambda e: _ev(a, e) if _ev(cond, e) else _ev(b, e))


@SETTINGS
@given(plans(), st.integers(1, 400))
def test_used_divisions_divide_non_negative_by_positive(p, other_grid):
    # The closed forms the lowering emits: units, ranges, peers and the peers' blocks.
    ops = SignCheckedOps()
    b, u, g, t, j = (_var(n) for n in ("b", "u", "g", "t", "j"))
    units = p.units(ops, g)
    lo, hi = p.block_range(b, u, ops, g)
    peers = p.tile_peers(t, ops, g)
    peer = p.peer_block(t, j, ops, g)
    peer_lo, _ = p.block_range(peer, 0, ops, g)
    # A run-time grid may launch another count of blocks than the plan's.
    grids = [p.grid, other_grid] if p.scheme.runtime_grid else [p.grid]
    for grid in grids:
        env = {"g": grid}
        for block, unit in itertools.product(range(grid), range(_ev(units, env))):
            env.update(b=block, u=unit)
            _ev(lo, env), _ev(hi, env)
        for tile in range(p.tiles):
            env["t"] = tile
            for peer_index in range(_ev(peers, env)):
                env["j"] = peer_index
                _ev(peer_lo, env)


@SETTINGS
@given(
    st.lists(st.integers(1, 9), min_size=2, max_size=4),
    st.one_of(st.none(), st.integers(1, 10)),
)
def test_tile_order_evaluates_symbolically(extents, group):
    extents = tuple(extents)
    coords = tile_order(_var("t"), extents, group, SymOps())
    n = 1
    for e in extents:
        n *= e
    for t in range(n):
        assert tuple(_ev(c, {"t": t}) for c in coords) == tile_order(t, extents, group)


@pytest.mark.parametrize("variant", ["one_tile", "two_tile"])
def test_hybrid_with_another_runtime_grid_stays_a_partition(variant):
    # The lowering may launch a symbolic grid; grid > tiles makes every tile Stream-K.
    p = plan(5, 3, 4, policy="hybrid", variant=variant)
    for grid in range(1, 12):
        covered = []
        units = p.units(INT_OPS, grid)
        for b in range(grid):
            for u in range(units):
                lo, hi = p.block_range(b, u, INT_OPS, grid)
                covered.extend(range(lo, hi))
        assert sorted(covered) == list(range(15))


# --- Error fixtures -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tiles": 0}, "tiles must be a positive int, found 0"),
        ({"panels": -3}, "panels must be a positive int, found -3"),
        ({"tiles": 2.5}, "tiles must be a positive int, found 2.5"),
        ({"tiles": True}, "found the bool True"),
        ({"blocks_per_sm": 0}, "blocks_per_sm must be a positive int"),
        ({"num_sms": 0}, "num_sms must be a positive int, found 0"),
        ({"policy": "persistent"}, "policy must be one of ('data_parallel'"),
        ({"policy": "stream_k", "splits": 2}, "splits=2 only applies to policy='split_k'"),
        ({"policy": "split_k", "variant": "one_tile"}, "only applies to policy='hybrid'"),
        ({"policy": "split_k"}, "needs splits=S"),
        ({"policy": "split_k", "splits": 9}, "1 <= splits <= panels = 8, found splits=9"),
        ({"policy": "hybrid", "variant": "three_tile"}, "variant must be one of"),
        ({"policy": "heuristic", "num_sms": None}, "pass num_sms="),
        ({"policy": "stream_k", "num_sms": None}, "found num_sms=None"),
    ],
)
def test_plan_rejects(kwargs, message):
    args = {"tiles": 4, "panels": 8, "num_sms": 2, **kwargs}
    with pytest.raises(DecompositionError) as info:
        plan(**args)
    assert message in str(info.value)


def test_error_is_a_value_error():
    assert issubclass(DecompositionError, ValueError)


def test_plan_constructor_checks_closed_forms():
    with pytest.raises(DecompositionError, match="data_parallel plan needs grid=4, found 3"):
        Plan("data_parallel", 4, 2, grid=3, num_sms=None, blocks_per_sm=1)
    with pytest.raises(DecompositionError, match="persistent grid of resident blocks"):
        Plan("stream_k", 4, 2, grid=5, num_sms=2, blocks_per_sm=2, sk_tiles=4)
    with pytest.raises(DecompositionError, match="use plan\\(\\) to resolve 'heuristic'"):
        Plan("heuristic", 4, 2, grid=4, num_sms=None, blocks_per_sm=1)


def test_peers_rejects_foreign_tile():
    with pytest.raises(DecompositionError, match=r"tile must be in \[0, 3\), found 3"):
        plan(3, 4, 2, policy="stream_k").peers(3)


@pytest.mark.parametrize(
    ("extents", "group", "message"),
    [
        ((), None, "non-empty tuple of positive ints"),
        ((4, 0), None, r"band_extents\[1\] must be a positive int, found 0"),
        ((4,), 2, "group needs at least two band dimensions"),
        ((4, 4), 0, "group must be a positive int, found 0"),
    ],
)
def test_tile_order_rejects(extents, group, message):
    with pytest.raises(DecompositionError, match=message):
        tile_order(0, extents, group)


def test_policies_list_heuristic_last():
    assert policies.names() == (*CONCRETE_POLICIES, "heuristic")

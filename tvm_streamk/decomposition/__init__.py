"""Stream-K work decomposition: the closed forms shared by the lowering, the report and the tests.

Plain Python, no TVM. A GEMM is tiled into ``tiles`` output tiles; each tile reduces over
``P = panels`` K-panels. The iteration space is flattened tile-major: iteration
``it = tile * P + k`` for ``k`` in ``[0, P)``, ``TOTAL = tiles * P``. A kernel launches
``G = grid`` blocks; block ``b`` walks ``U`` work units ``u = 0 .. U-1``, unit ``u`` being one
half-open range ``[lo, hi)`` of flattened iterations (empty when ``hi <= lo``). A block cuts its
ranges at tile boundaries into *segments* ``(tile, k_begin, k_end)``.

Each policy is one module holding one registered :class:`~.policy.Policy` with its closed forms:
:mod:`.data_parallel`, :mod:`.split_k`, :mod:`.stream_k`, :mod:`.hybrid` (one- and two-tile).
A new policy is one new class decorated with :func:`~.policy.register`; the cost model registers
the ``"heuristic"`` chooser on top (:func:`~.policy.register_chooser`).

Fixup convention: a tile covered by more than one segment is *split*; its segments are its
*peers*, numbered in ``k`` order (peer 0 holds ``k_begin == 0``). The workspace fixup of the
lowering lets the last peer to arrive sum all partials in peer order and write the tile, so no
block ever waits on another; :func:`plan` still keeps Stream-K grids within the resident blocks
(``grid <= num_sms * blocks_per_sm``), the persistent kernel the model assumes.

The closed forms are written against an *ops* object (:class:`IntOps` by default, see
:mod:`.ops`), so the lowering evaluates the same functions on TIR ``PrimExpr`` values (including
a symbolic ``grid``) by passing its own ops; a ``grid`` that is a Python int is folded to ints
where that keeps loop extents constant.
"""

from . import data_parallel, hybrid, policy, split_k, stream_k
from .ops import INT_OPS, DecompositionError, IntOps, Ops
from .plans import MAX_RUNTIME_SMS, Plan, check_policy_args, plan
from .policy import Policy, register
from .run_time import RuntimeTilesPlan, plan_at_run_time
from .tile_order import tile_order

__all__ = [
    "check_policy_args",
    "INT_OPS",
    "MAX_RUNTIME_SMS",
    "DecompositionError",
    "IntOps",
    "Ops",
    "Plan",
    "Policy",
    "RuntimeTilesPlan",
    "data_parallel",
    "hybrid",
    "plan",
    "plan_at_run_time",
    "policy",
    "register",
    "split_k",
    "stream_k",
    "tile_order",
]

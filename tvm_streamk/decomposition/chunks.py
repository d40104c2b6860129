"""Batch invariance: the fixed chunk grid along K that every decomposition reduces in.

Plain Python, no TVM. A kernel built with ``batch_invariant=True`` cuts each tile's ``P``
K-panels into ``n = ceil(P / C)`` *chunks* of ``C = chunk_panels(P)`` panels (the last one
shorter when ``C`` does not divide ``P``). Every output element is then reduced in one order,
the *canonical order*::

    c_j   = the schedule's own panel loop over the panels of chunk j, from zero
    total = (((0 + c_0) + c_1) + ...) + c_{n-1}

whatever the decomposition: a data-parallel tile, a split-K split and a Stream-K segment all
cover whole chunks, each chunk is accumulated from zero, and the workspace fix-up sums the
chunks in chunk order. ``C`` depends on ``P`` alone, and ``P`` on K and the schedule's panel
depth: never on M, the grid, the SM count or the policy. So a row of the output has the same
bits at every M, on every grid, under every policy (docs/batch_invariance.md).

The decision plans over *chunk iterations*: the flattened space is ``tiles x n``, and each
policy's closed forms cut it as they cut ``tiles x P`` (:func:`chunk_count` is the ``panels``
they see), so every split point falls on a chunk boundary.

A tuned space (MetaSchedule) chooses the panel depth ``bk`` per candidate, so per M. Measured in
K elements, chunk ``j`` covers ``[j * C * bk, (j + 1) * C * bk)``, and ``C * bk`` equals
:func:`chunk_elements` ``= ceil(K / 4)`` exactly when ``bk`` divides it
(``ceil(ceil(K / 4) / bk) = ceil(K / (4 * bk))``). Candidates whose panel depth divides
``ceil(K / 4)`` therefore share one chunk grid along K, whatever their tiling, and a fixed-
schedule kernel (dlight's, the reference schedule) whose depth divides it shares that grid too
(:func:`chunk_for_depth`).
"""

from __future__ import annotations

# Chunks per tile when the panel count allows: enough for Stream-K and split-K to balance the
# last wave, few enough that every tile's partials stay a small multiple of the output.
CHUNKS = 4


def chunk_panels(panels: int, chunks: int = CHUNKS) -> int:
    """``C``, the K-panels of one chunk of a tile of ``panels`` panels: ``ceil(P / chunks)``.

    Examples
    --------
    >>> chunk_panels(128), chunk_panels(49), chunk_panels(3)
    (32, 13, 1)
    """
    if panels < 1 or chunks < 1:
        raise ValueError(f"panels={panels} and chunks={chunks} must be positive")
    return -(-panels // chunks)


def chunk_count(panels: int, chunk: int) -> int:
    """``n``, the chunks of a tile of ``panels`` panels cut every ``chunk`` panels.

    Examples
    --------
    >>> chunk_count(49, 13)
    4
    """
    if panels < 1 or chunk < 1:
        raise ValueError(f"panels={panels} and chunk={chunk} must be positive")
    return -(-panels // chunk)


def chunk_range(chunk_index, chunk: int, panels: int, ops=None):
    """``(k_begin, k_end)``: the panels of chunk ``chunk_index`` (an int, or an expression with
    ``ops``' ``min``)."""
    begin = chunk_index * chunk
    end = begin + chunk
    if ops is None:
        return begin, min(end, panels)
    return begin, ops.min(end, panels)


def chunk_elements(k: int, chunks: int = CHUNKS) -> int:
    """The K elements of one chunk of a reduction of ``k`` elements, whatever its panel depth:
    ``ceil(K / chunks)``; the chunk grid every tiling of K whose depth divides it shares.

    Examples
    --------
    >>> chunk_elements(4096), chunk_elements(392), chunk_elements(9)
    (1024, 98, 3)
    """
    if k < 1 or chunks < 1:
        raise ValueError(f"k={k} and chunks={chunks} must be positive")
    return -(-k // chunks)


def chunk_for_depth(k: int, depth: int) -> int | None:
    """``C``, the panels per chunk of a tiling of ``k`` K elements into panels ``depth`` deep,
    when its chunks are :func:`chunk_elements` long (``depth`` divides that length); None
    when its chunk boundaries fall elsewhere, so that its order differs from other tilings'.

    Examples
    --------
    >>> chunk_for_depth(512, 8), chunk_for_depth(512, 256), chunk_for_depth(392, 8)
    (16, None, None)
    """
    if k < 1 or depth < 1 or k % depth:
        raise ValueError(f"depth={depth} must be a positive divisor of k={k}")
    width = chunk_elements(k)
    if width % depth:
        return None
    return width // depth

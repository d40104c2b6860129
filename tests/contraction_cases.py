"""The einsum contractions the dlight contraction tests and the ptxas sweep share.

Each is ``(spec, index sizes)`` for ``workloads.contraction``; comments give the GEMM it
normalises to.
"""

# family -> (spec, index sizes); comments give the GEMM dlight makes of it.
CONTRACTION_CASES = {
    # S = 5, I = 50 (2 tiles), J = 40, K = 70 (5 panels): 10 tiles.
    "batched-matmul": ("bmk,bkn->bmn", {"b": 5, "m": 50, "k": 70, "n": 40}),
    # I = a*b = 99 (4 tiles), J = e*f = 76 (2 tiles), K = c*d = 54 (4 panels).
    "tensor-contraction": ("abcd,cdef->abef", {"a": 9, "b": 11, "c": 6, "d": 9, "e": 4, "f": 19}),
    # Attention scores Q K^T: S = b*h = 10, I = 37 (2 tiles), J = 45, K = 40 (3 panels).
    "attention-scores": ("bhqd,bhkd->bhqk", {"b": 2, "h": 5, "q": 37, "k": 45, "d": 40}),
    # Both operands K-major ("NT"): I = 50, J = 70 (2 tiles), K = 90 (6 panels).
    "matmul-nt": ("mk,nk->mn", {"m": 50, "n": 70, "k": 90}),
    # Both operands K-outer ("TN"-like for A).
    "matmul-tn": ("km,kn->mn", {"m": 50, "n": 70, "k": 90}),
    # B shared across the batch: the batch fuses into I (I = b*m = 60).
    "broadcast-weight": ("bmk,kn->bmn", {"b": 2, "m": 30, "n": 70, "k": 90}),
}

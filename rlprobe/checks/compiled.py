"""reduce_pair, the token kernel's Python face: one pair of per-token log-prob tensors reduced into the figures
of token_figures.py by kernels.reduce_rows (rlprobe/checks/kernels.pyx, compiled at install)."""

from __future__ import annotations

import math

import numpy as np

from rlprobe.checks.kernels import reduce_rows
from rlprobe.checks.token_figures import LOG_THRESHOLDS, PROBABILITY_OF, PairFigures, as_rows, check_shapes, mask_bytes

__all__ = ["kernel_arrays", "reduce_pair"]


def kernel_arrays(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, mask) as the kernels take them: (rows, tokens) C-contiguous, both float32 or else both float64 (a
    float64 copy of a float32 side is exact, Δ and the buckets the same), the mask uint8 (None: every token)."""
    a, b = np.asarray(a), np.asarray(b)
    check_shapes(a, b, mask)
    dtype = np.float32 if a.dtype == b.dtype == np.float32 else np.float64
    a2, b2 = (np.ascontiguousarray(as_rows(x), dtype) for x in (a, b))
    m2 = np.ones(a2.shape, np.uint8) if mask is None else np.ascontiguousarray(mask_bytes(mask).reshape(a2.shape))
    return a2, b2, m2


def reduce_pair(a: np.ndarray, b: np.ndarray, eps: float, mask: np.ndarray | None = None,
                into: PairFigures | None = None) -> tuple[PairFigures, np.ndarray, np.ndarray]:
    """(figures, per-sequence Σ Δ, per-sequence token count) of one pair of equal shapes (a mask
    of the same number of elements). Floating point only: token ids are no log-probs. With `into`
    the pair's figures are added to those (one kernel call per pair, no per-pair histogram)."""
    a2, b2, m2 = kernel_arrays(a, b, mask)
    f = PairFigures() if into is None else into
    sums = np.zeros(7)
    seq_sum = np.zeros(a2.shape[0])
    seq_n = np.zeros(a2.shape[0], np.int64)
    lo = math.log(1.0 - eps) if eps < 1 else -math.inf
    reduce_rows(a2, b2, m2, lo, math.log(1.0 + eps), PROBABILITY_OF, LOG_THRESHOLDS, sums, f.hist, None,
                f.pos_count, f.pos_sum, f.pos_max, f.prob_count, f.prob_sum, seq_sum, seq_n)
    f.tokens += int(sums[0])
    f.sum_delta += sums[1]
    f.sum_sq += sums[2]
    f.sum_abs += sums[3]
    f.max_abs = max(f.max_abs, sums[4])
    f.outside += int(sums[5])
    f.nonfinite += int(sums[6])
    return f, seq_sum, seq_n

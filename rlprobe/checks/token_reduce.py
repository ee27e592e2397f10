"""reduce_pair: one pair of per-token log-prob tensors reduced into the figures of token_figures.py by the compiled
token kernel (checks/compiled.py picks the ahead-of-time copy or numba's JIT kernel)."""

from __future__ import annotations

import math

import numpy as np

from rlprobe.checks.compiled import rows_kernel
from rlprobe.checks.token_figures import LOG_THRESHOLDS, PROBABILITY_OF, PairFigures, as_rows, check_shapes, mask_bytes


def reduce_pair(a: np.ndarray, b: np.ndarray, eps: float, mask: np.ndarray | None = None,
                into: PairFigures | None = None) -> tuple[PairFigures, np.ndarray, np.ndarray]:
    """(figures, per-sequence Σ Δ, per-sequence token count) of one pair of equal shapes (a mask
    of the same number of elements). Floating point only: token ids are no log-probs. With `into`
    the pair's figures are added to those (one kernel call per pair, no per-pair histogram)."""
    a, b = np.asarray(a), np.asarray(b)
    check_shapes(a, b, mask)
    a2, b2 = as_rows(a), as_rows(b)
    m2 = np.ones(a2.shape, np.uint8) if mask is None else mask_bytes(mask).reshape(a2.shape)
    f = PairFigures() if into is None else into
    sums = np.zeros(7)
    seq_sum = np.zeros(a2.shape[0])
    seq_n = np.zeros(a2.shape[0], np.int64)
    lo = math.log(1.0 - eps) if eps < 1 else -math.inf
    rows_kernel(a2, b2, m2)(a2, b2, m2, lo, math.log(1.0 + eps), PROBABILITY_OF, LOG_THRESHOLDS, sums, f.hist, None,
                f.pos_count, f.pos_sum, f.pos_max, f.prob_count, f.prob_sum, seq_sum, seq_n)
    f.tokens += int(sums[0])
    f.sum_delta += sums[1]
    f.sum_sq += sums[2]
    f.sum_abs += sums[3]
    f.max_abs = max(f.max_abs, sums[4])
    f.outside += int(sums[5])
    f.nonfinite += int(sums[6])
    return f, seq_sum, seq_n


"""Reduce one pair of per-token log-prob tensors (trainer `a`, other `b`; Δ = b − a) to the
figures the token-level checks read, in compiled code (checks/compiled.py: reduce_pair, the Cython kernel
checks/kernels.pyx built at install), no Python per token. This module imports no kernel: the figures,
their bins and buckets. Pairs are independent:
rlprobe/checks/token_tables.py runs them on a thread pool (the kernel releases the GIL), adding the pairs
of one step into one set of figures (`into`).

Per pair: token count, Σ Δ, Σ Δ², Σ |Δ|, max |Δ|, the count of tokens whose ratio exp(Δ) lies
outside [1 − ε, 1 + ε] (Δ < log(1 − ε) or Δ > log(1 + ε): no exp per token); a histogram of Δ
over float32 bit buckets (the sign, exponent and top 6 mantissa bits of the float64 Δ rounded
toward zero to float32, so each token's bin holds its Δ, even where Δ is below float32's resolution
of the log-probs: 64 log-spaced bins an octave, no logarithm per token; quantiles read from it are
within one bin, at most 1/64 ≈ 1.6 % above the exact value, and reported as the bin's upper edge); |Δ| by response position
(buckets [0,1), [1,2), [2,4), [4,8)…); |Δ| by the trainer's token probability exp(a) (ten
buckets of 0.1); per sequence (row) Σ Δ, the log of the sequence's importance ratio. A mask
(nonzero: counted) selects the response tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

N_BINS = 1 << 15  # float32 bits >> 17: bins 0..16383 are Δ >= 0, 16384.. are Δ < 0
HALF = N_BINS // 2
TABLE_BITS = 3  # token_hist's rows: 2^3 of these bins summed (8 an octave); quantiles read the fine bins
N_POSITIONS = 24  # position buckets [2^(k-1), 2^k); the last takes everything beyond
N_PROBABILITY = 10
LOG_THRESHOLDS = np.log(np.arange(1, N_PROBABILITY) / N_PROBABILITY)


def bin_upper_edges() -> np.ndarray:
    """Upper edge of |Δ| in each of the HALF magnitude bins."""
    with np.errstate(invalid="ignore"):  # the top bins hold the NaN bit patterns
        edges = ((np.arange(HALF, dtype=np.int64) + 1) << 17).astype(np.uint32).view(np.float32).astype(np.float64)
    edges[-1] = math.inf  # the NaN patterns' bin, never filled (non-finite Δ is counted apart)
    return edges


def quantile_edges() -> np.ndarray:
    """What a quantile in each |Δ| bin reads: its upper edge, but 0 in bin 0. Bin 0 holds the exact zeros (a
    token whose two log-probs are equal) and float32 denormals below 2^-132 ≈ 1.8e-40, far below the rounding
    of any log-prob; its upper edge printed a median of zeros as 1.8367e-40."""
    edges = bin_upper_edges()
    edges[0] = 0.0
    return edges


def bin_lower_edges() -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (np.arange(HALF, dtype=np.int64) << 17).astype(np.uint32).view(np.float32).astype(np.float64)


def position_bounds(bucket: int) -> tuple[int, int]:
    """[first, last] response position of a position bucket."""
    return (0, 0) if bucket == 0 else (2 ** (bucket - 1), 2 ** bucket - 1)


@dataclass
class PairFigures:
    """The sums of one or more pairs (add() merges another pair's into these)."""

    tokens: int = 0
    sum_delta: float = 0.0
    sum_sq: float = 0.0
    sum_abs: float = 0.0
    max_abs: float = 0.0
    outside: int = 0
    nonfinite: int = 0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS, np.int64))
    pos_count: np.ndarray = field(default_factory=lambda: np.zeros(N_POSITIONS, np.int64))
    pos_sum: np.ndarray = field(default_factory=lambda: np.zeros(N_POSITIONS))
    pos_max: np.ndarray = field(default_factory=lambda: np.zeros(N_POSITIONS))
    prob_count: np.ndarray = field(default_factory=lambda: np.zeros(N_PROBABILITY, np.int64))
    prob_sum: np.ndarray = field(default_factory=lambda: np.zeros(N_PROBABILITY))

    def add(self, other: "PairFigures") -> None:
        for name in ("tokens", "sum_delta", "sum_sq", "sum_abs", "outside", "nonfinite"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_abs = max(self.max_abs, other.max_abs)
        for name in ("hist", "pos_count", "pos_sum", "prob_count", "prob_sum"):
            getattr(self, name).__iadd__(getattr(other, name))
        np.maximum(self.pos_max, other.pos_max, out=self.pos_max)

    def abs_hist(self) -> np.ndarray:
        return self.hist[:HALF] + self.hist[HALF:]

    def quantile(self, q: float, upper: np.ndarray | None = None) -> float | None:
        """The upper edge of the |Δ| bin holding quantile q (0 in the bin of zeros), at most max |Δ| (None without
        tokens); `upper`: quantile_edges(), when the caller has it already."""
        return self.quantiles((q,), upper)[0]

    def quantiles(self, qs: tuple[float, ...], upper: np.ndarray | None = None, counts: np.ndarray | None = None,
                  filled: np.ndarray | None = None) -> list[float | None]:
        """quantile() of each of qs, from one pass over the histogram (its nonzero bins only);
        `counts`, `filled`: abs_hist() and its nonzero bins, when the caller has them already."""
        counts = self.abs_hist() if counts is None else counts
        filled = np.flatnonzero(counts != 0) if filled is None else filled
        if filled.size == 0:
            return [None] * len(qs)
        cumulative = np.cumsum(counts[filled])
        total = int(cumulative[-1])
        index = filled[np.searchsorted(cumulative, [max(1, math.ceil(q * total)) for q in qs])]
        edges = (quantile_edges() if upper is None else upper)[index]
        return [float(min(edge, self.max_abs)) for edge in edges]

    def clear(self, filled: np.ndarray) -> None:
        """Back to no pairs, zeroing only the histogram bins in `filled` (indexes of hist)."""
        self.tokens = self.outside = self.nonfinite = 0
        self.sum_delta = self.sum_sq = self.sum_abs = self.max_abs = 0.0
        self.hist[filled] = 0
        for name in ("pos_count", "pos_sum", "pos_max", "prob_count", "prob_sum"):
            getattr(self, name).fill(0)


def _probability_table() -> np.ndarray:
    """Probability bucket of each float32 bit bucket of a (bits >> 17, as the Δ histogram), -1
    where the bucket's values (or the float64 values that round into it) straddle a threshold
    log(k/10), or are not finite: the kernel compares those tokens with the thresholds."""
    bits = np.arange(N_BINS, dtype=np.uint32) << np.uint32(17)
    with np.errstate(all="ignore"):  # the top buckets hold inf and NaN
        near, far = bits.view(np.float32), (bits | np.uint32(0x1FFFF)).view(np.float32)
        low = np.nextafter(np.minimum(near, far), np.float32(-np.inf))
        high = np.nextafter(np.maximum(near, far), np.float32(np.inf))
    below = (low.astype(np.float64)[:, None] >= LOG_THRESHOLDS).sum(axis=1)
    above = (high.astype(np.float64)[:, None] >= LOG_THRESHOLDS).sum(axis=1)
    finite = np.isfinite(near) & np.isfinite(far) & np.isfinite(low) & np.isfinite(high)
    return np.where(finite & (below == above), below, -1).astype(np.int8)


PROBABILITY_OF = _probability_table()


BLOCK_BITS = 6  # 64 bins: one octave of one sign of Δ


def as_rows(x: np.ndarray) -> np.ndarray:
    """A tensor as (sequences, tokens): a batch's leading dimension is the sequence."""
    x = np.asarray(x)
    if x.ndim == 0:
        return x.reshape(1, 1)
    return x.reshape(x.shape[0] if x.ndim > 1 else 1, -1)


def check_shapes(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None) -> None:
    if a.shape != b.shape or (mask is not None and np.asarray(mask).size != a.size):
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}"
                         + ("" if mask is None else f", mask {np.asarray(mask).shape}"))


def mask_bytes(mask: np.ndarray) -> np.ndarray:
    """A mask as uint8 0/1 (a bool mask's own bytes: no copy)."""
    m = np.asarray(mask)
    return m.view(np.uint8) if m.dtype == np.bool_ else (m != 0).view(np.uint8)

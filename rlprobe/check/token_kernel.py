"""Reduce one pair of per-token log-prob tensors (trainer `a`, other `b`; Δ = b − a) to the
figures the token-level checks read, in one compiled pass over the tokens (numba), no Python
per token. Pairs are independent: rlprobe/check/token_tables.py runs them on a thread pool (the
kernel releases the GIL), adding the pairs of one step into one set of figures (`into`).

Per pair: token count, Σ Δ, Σ Δ², Σ |Δ|, max |Δ|, the count of tokens whose ratio exp(Δ) lies
outside [1 − ε, 1 + ε] (Δ < log(1 − ε) or Δ > log(1 + ε): no exp per token); a histogram of Δ
over float32 bit buckets (the sign, exponent and top 6 mantissa bits of Δ rounded to float32:
64 log-spaced bins an octave, no logarithm per token; quantiles read from it are within one bin,
at most 1/64 ≈ 1.6 % relative, and reported as the bin's upper edge); |Δ| by response position
(buckets [0,1), [1,2), [2,4), [4,8)…); |Δ| by the trainer's token probability exp(a) (ten
buckets of 0.1); per sequence (row) Σ Δ, the log of the sequence's importance ratio. A mask
(nonzero: counted) selects the response tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numba
import numpy as np

N_BINS = 1 << 15  # float32 bits >> 17: bins 0..16383 are Δ >= 0, 16384.. are Δ < 0
HALF = N_BINS // 2
N_POSITIONS = 24  # position buckets [2^(k-1), 2^k); the last takes everything beyond
N_PROBABILITY = 10
_LOG_THRESHOLDS = np.log(np.arange(1, N_PROBABILITY) / N_PROBABILITY)


def bin_upper_edges() -> np.ndarray:
    """Upper edge of |Δ| in each of the HALF magnitude bins."""
    with np.errstate(invalid="ignore"):  # the top bins hold the NaN bit patterns
        edges = ((np.arange(HALF, dtype=np.int64) + 1) << 17).astype(np.uint32).view(np.float32).astype(np.float64)
    edges[-1] = math.inf  # the NaN patterns' bin, never filled (non-finite Δ is counted apart)
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
        """The upper edge of the |Δ| bin holding quantile q, at most max |Δ| (None without tokens);
        `upper`: bin_upper_edges(), when the caller has it already."""
        counts = self.abs_hist()
        total = int(counts.sum())
        if total == 0:
            return None
        index = int(np.searchsorted(np.cumsum(counts), max(1, math.ceil(q * total))))
        return float(min((bin_upper_edges() if upper is None else upper)[index], self.max_abs))


@numba.njit(cache=True, nogil=True)
def _reduce(a, b, mask, lo, hi, position_of, thr, sums, hist, pos_count, pos_sum, pos_max, prob_count, prob_sum,
            seq_sum, seq_n):  # pragma: no cover - compiled
    rows, width = a.shape
    scratch = np.empty(width, np.float32)
    bits = scratch.view(np.uint32)
    total = 0.0
    sq = 0.0
    absolute = 0.0
    largest = 0.0
    outside = 0
    bad = 0
    for r in range(rows):
        for t in range(width):
            scratch[t] = np.float32(b[r, t]) - np.float32(a[r, t])
        s = 0.0
        n = 0
        for t in range(width):
            if mask[r, t] == 0:
                continue
            x = np.float64(a[r, t])
            d = np.float64(b[r, t]) - x
            if not math.isfinite(d):
                bad += 1
                continue
            ad = abs(d)
            n += 1
            s += d
            sq += d * d
            absolute += ad
            largest = max(largest, ad)
            outside += (d < lo) | (d > hi)
            hist[bits[t] >> 17] += 1
            p = position_of[t]
            pos_count[p] += 1
            pos_sum[p] += ad
            pos_max[p] = max(pos_max[p], ad)
            q = ((x >= thr[0]) + (x >= thr[1]) + (x >= thr[2]) + (x >= thr[3]) + (x >= thr[4]) + (x >= thr[5])
                 + (x >= thr[6]) + (x >= thr[7]) + (x >= thr[8]))
            prob_count[q] += 1
            prob_sum[q] += ad
        seq_sum[r] = s
        seq_n[r] = n
        total += s
        sums[0] += n
    sums[1] += total
    sums[2] += sq
    sums[3] += absolute
    sums[4] = max(sums[4], largest)
    sums[5] += outside
    sums[6] += bad


def as_rows(x: np.ndarray) -> np.ndarray:
    """A tensor as (sequences, tokens): a batch's leading dimension is the sequence."""
    x = np.asarray(x)
    if x.ndim == 0:
        return x.reshape(1, 1)
    return x.reshape(x.shape[0] if x.ndim > 1 else 1, -1)


@lru_cache(maxsize=64)
def _positions(width: int) -> np.ndarray:
    position_of = np.zeros(width, np.int64)
    if width > 1:
        position_of[1:] = np.minimum(np.floor(np.log2(np.arange(1, width))).astype(np.int64) + 1, N_POSITIONS - 1)
    return position_of


def reduce_pair(a: np.ndarray, b: np.ndarray, eps: float, mask: np.ndarray | None = None,
                into: PairFigures | None = None) -> tuple[PairFigures, np.ndarray, np.ndarray]:
    """(figures, per-sequence Σ Δ, per-sequence token count) of one pair of equal shapes (a mask
    of the same number of elements). Floating point only: token ids are no log-probs. With `into`
    the pair's figures are added to those (one kernel call per pair, no per-pair histogram)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or (mask is not None and np.asarray(mask).size != a.size):
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}"
                         + ("" if mask is None else f", mask {np.asarray(mask).shape}"))
    a2, b2 = as_rows(a), as_rows(b)
    if mask is None:
        m2 = np.ones(a2.shape, np.uint8)
    else:
        m2 = as_rows(np.asarray(mask)).reshape(a2.shape)
        m2 = m2.view(np.uint8) if m2.dtype == np.bool_ else (m2 != 0).view(np.uint8)  # bool: no copy
    f = PairFigures() if into is None else into
    sums = np.zeros(7)
    seq_sum = np.zeros(a2.shape[0])
    seq_n = np.zeros(a2.shape[0], np.int64)
    lo = math.log(1.0 - eps) if eps < 1 else -math.inf
    _reduce(a2, b2, m2, lo, math.log(1.0 + eps), _positions(a2.shape[1]), _LOG_THRESHOLDS, sums, f.hist, f.pos_count,
            f.pos_sum, f.pos_max, f.prob_count, f.prob_sum, seq_sum, seq_n)
    f.tokens += int(sums[0])
    f.sum_delta += sums[1]
    f.sum_sq += sums[2]
    f.sum_abs += sums[3]
    f.max_abs = max(f.max_abs, sums[4])
    f.outside += int(sums[5])
    f.nonfinite += int(sums[6])
    return f, seq_sum, seq_n

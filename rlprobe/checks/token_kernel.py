"""The compiled token kernel (numba): reduce_rows, which reduces rows of a log-prob pair to the figures
of rlprobe/checks/token_figures.py (its docstring says which). Callers take it through checks/compiled.py
(the ahead-of-time copy where built: no numba imported); compiled.reduce_pair is its Python face."""

from __future__ import annotations

import math

import numpy as np

from rlprobe.checks.token_figures import BLOCK_BITS, N_POSITIONS, N_PROBABILITY
from rlprobe.numba_cache import import_numba, use_user_cache_dir

use_user_cache_dir()  # where the compare kernels are cached too, whichever module loads numba first
import_numba()

import numba  # noqa: E402  (after the cache dir is set)
from llvmlite import ir  # noqa: E402
from numba.core import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402


@intrinsic
def float32_bits(typingctx, x):  # pragma: no cover - compiled
    """The bits of a float32 as uint32 (a register move: no memory round trip per token)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _float64_bits(typingctx, x):  # pragma: no cover - compiled
    """The bits of a float64 as int64: ordered as the values for values >= 0 (an integer max vectorizes)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _bits_float64(typingctx, x):  # pragma: no cover - compiled
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


_SKIP = 0xFFFF  # a token the scatter pass skips (masked out or non-finite Δ); bins stop at 0x7FFF
_BANKS = 4  # probability figures in 4 interleaved copies: a token's update does not wait for the previous one's


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def reduce_rows(a, b, mask, lo, hi, prob_of, thr, sums, hist, touched, pos_count, pos_sum, pos_max, prob_count,
                prob_sum, seq_sum, seq_n):  # pragma: no cover - compiled
    """Row by row, two passes over the row (its tokens stay in the first-level cache between them):
    1. per position bucket, the sums, count, max and outside count of Δ; a loop without stores to
       shared figures, which the compiler runs on vector registers (`reassoc`: sums in several lanes,
       the same figures up to the rounding of the order of addition). It leaves each token's |Δ| and
       histogram bin in scratch rows.
    2. the scatter: the histogram bin and the probability bucket of each counted token, and the
       bin's block of 2^BLOCK_BITS bins marked in `touched` unless it is None (token_batch.py takes a
       key's few hundred filled bins of 32,768 from the marked blocks only).
    Indexes are row views and unsigned where the compiler could not prove them >= 0 (numba's
    negative-index wrap-around per access keeps a loop off the vector registers)."""
    rows, width = a.shape
    bins = np.empty(width, np.uint16)
    magnitude = np.empty(width, np.float64)
    bank = np.zeros((_BANKS * 16, 2), np.float64)  # [Σ |Δ|, count]: one 16-byte update per token
    total = 0.0
    sq = 0.0
    absolute = 0.0
    largest = 0
    outside = 0
    bad = 0
    for r in range(rows):
        ar, br, mr = a[r], b[r], mask[r]
        s = 0.0
        n = 0
        start = 0
        for p in range(N_POSITIONS):
            if start >= width:
                break
            stop = width if p == N_POSITIONS - 1 else min(width, 1 << p)
            av, bv, mv = ar[start:stop], br[start:stop], mr[start:stop]
            bin_v, mag_v = bins[start:stop], magnitude[start:stop]
            count = 0
            bucket_bad = 0
            bucket_delta = 0.0
            bucket_sq = 0.0
            bucket_abs = 0.0
            bucket_max = 0
            bucket_out = 0
            for t in range(stop - start):
                x = av[t]
                y = bv[t]
                d = np.float64(y) - np.float64(x)
                finite = abs(d) < math.inf
                counted = (mv[t] != 0) & finite
                kept = d if counted else 0.0
                ad = abs(kept)
                count += counted
                bucket_bad += (mv[t] != 0) & (not finite)
                bucket_delta += kept
                bucket_sq += kept * kept
                bucket_abs += ad
                bucket_max = max(bucket_max, _float64_bits(ad))
                bucket_out += counted & ((d < lo) | (d > hi))
                near = np.float32(d)  # Δ's bin from Δ itself, rounded toward zero: not from float32 operands
                bits = float32_bits(near) - (abs(np.float64(near)) > ad)  # (a float64 pair's tiny Δ)
                bin_v[t] = np.uint16(bits >> 17) if counted else _SKIP
                mag_v[t] = ad
            pos_count[p] += count
            pos_sum[p] += bucket_abs
            pos_max[p] = max(pos_max[p], _bits_float64(bucket_max))
            absolute += bucket_abs
            largest = max(largest, bucket_max)
            sq += bucket_sq
            outside += bucket_out
            bad += bucket_bad
            s += bucket_delta
            n += count
            start = stop
        for t in range(width):
            i = bins[t]
            if i == _SKIP:
                continue
            hist[i] += 1
            if touched is not None:  # pruned at compile time where it is None (one store a token less)
                touched[i >> BLOCK_BITS] = 1
            x = ar[t]
            q = prob_of[float32_bits(np.float32(x)) >> 17]
            if q < 0:
                x64 = np.float64(x)
                q = ((x64 >= thr[0]) + (x64 >= thr[1]) + (x64 >= thr[2]) + (x64 >= thr[3]) + (x64 >= thr[4])
                     + (x64 >= thr[5]) + (x64 >= thr[6]) + (x64 >= thr[7]) + (x64 >= thr[8]))
            k = np.uint64((t & (_BANKS - 1)) * 16 + q)
            bank[k, 0] += magnitude[t]
            bank[k, 1] += 1.0
        seq_sum[r] = s
        seq_n[r] = n
        total += s
        sums[0] += n
    for k in range(_BANKS):
        for q in range(N_PROBABILITY):
            prob_sum[q] += bank[k * 16 + q, 0]
            prob_count[q] += np.int64(bank[k * 16 + q, 1])  # exact: a count below 2**53
    sums[1] += total
    sums[2] += sq
    sums[3] += absolute
    sums[4] = max(sums[4], _bits_float64(largest))
    sums[5] += outside
    sums[6] += bad



@numba.njit(cache=True, nogil=True)
def reduce_maxima(a, b, mask, out):  # pragma: no cover - compiled
    """Of reduce_rows' figures only the counted tokens (out[0] +=), max |Δ| (out[1], as the bits of a float64:
    the max of non-negative values through their bits vectorizes) and the masked tokens whose Δ is not finite
    (out[2] +=), by the same rules: a token counts where its mask is nonzero and Δ = b − a (in float64) is
    finite. One branch-free pass a row: what the on_policy rule reads (token_maxima.py)."""
    rows, width = a.shape
    count = 0
    largest = out[1]
    bad = 0
    for r in range(rows):
        ar, br, mr = a[r], b[r], mask[r]
        for t in range(width):
            d = np.float64(br[t]) - np.float64(ar[t])
            finite = abs(d) < math.inf
            masked = mr[t] != 0
            counted = masked & finite
            count += counted
            bad += masked & (not finite)
            largest = max(largest, _float64_bits(abs(d) if counted else 0.0))
    out[0] += count
    out[1] = largest
    out[2] += bad

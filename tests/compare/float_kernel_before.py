"""The float kernel of rlprobe.comparison.pair_kernels as it was before its loop was split (issue 18,
second numba pass), kept verbatim as an oracle: tests/compare/test_float_kernel_split.py checks that
the current kernel gives the same bits on every field, the reassociated sums included. What the split
left as it was (the exact element-by-element kernel, the integer maximum, the block sizes) is imported."""

from __future__ import annotations

import numpy as np

from rlprobe.numba_cache import import_numba, use_user_cache_dir

use_user_cache_dir()
import_numba()

import numba  # noqa: E402

from rlprobe.comparison.pair_kernels import _BLOCK, _SEQUENTIAL_BELOW, _float_exact, _max_int  # noqa: E402


@numba.njit(nogil=True, cache=True)
def _nonfinite_count(ac, bc):  # pragma: no cover - runs compiled
    """How many of the block's values are NaN or infinite (x - x is NaN exactly for those)."""
    c = 0
    for i in range(ac.size):
        c += not (ac[i] - ac[i] == 0.0)
        c += not (bc[i] - bc[i] == 0.0)
    return c


@numba.njit(nogil=True, cache=True, fastmath={"reassoc"})
def _finite_block(ac, bc, dbuf, rbuf):  # pragma: no cover - runs compiled (reassociating sums)
    """A block whose values are all finite: equal and within counts, the dot and square sums,
    and each element's |a - b| and rel err written to dbuf/rbuf. Branch-free, so it vectorizes;
    equal elements have d = 0 and count as within, as the exact kernel counts them."""
    eq = 0
    w3 = 0
    w2 = 0
    dot = 0.0
    sa = 0.0
    sb = 0.0
    for i in range(ac.size):
        x = np.float64(ac[i])
        y = np.float64(bc[i])
        eq += x == y
        d = abs(x - y)
        ax = abs(x)
        ay = abs(y)
        m = ax if ax > ay else ay
        w3 += d <= 1e-3 * m
        w2 += d <= 1e-2 * m
        dot += x * y
        sa += x * x
        sb += y * y
        dbuf[i] = d
        rbuf[i] = d / m if m > 0.0 else 0.0
    return eq, w3, w2, dot, sa, sb


@numba.njit(nogil=True, cache=True)
def float_kernel_before(a, b, start, stop):  # pragma: no cover - runs compiled
    """Partial aggregates of float arrays ``a``, ``b`` over flat indices [start, stop).

    Block by block: a block with only finite values (the common case) takes the vectorized
    `_finite_block`; one holding a NaN or an infinity, or whose float64 difference overflows,
    is redone by `_float_exact`, and so is one shorter than _SEQUENTIAL_BELOW. The first mismatch
    is searched for only in the first block that has one."""
    eq = 0
    first = -1
    max_abs = 0.0
    max_rel = 0.0
    w3 = 0
    w2 = 0
    dot = 0.0
    sa = 0.0
    sb = 0.0
    nanmis = 0
    dbuf = np.empty(_BLOCK, np.float64)
    rbuf = np.empty(_BLOCK, np.float64)
    dbits = dbuf.view(np.int64)
    rbits = rbuf.view(np.int64)
    out = np.empty(2, np.int64)
    outf = out.view(np.float64)
    for bs in range(start, stop, _BLOCK):
        be = min(bs + _BLOCK, stop)
        n = be - bs
        ac = a[bs:be]
        bc = b[bs:be]
        fast = n >= _SEQUENTIAL_BELOW and _nonfinite_count(ac, bc) == 0
        if fast:
            e, c3, c2, d_, s1, s2 = _finite_block(ac, bc, dbuf, rbuf)
            out[0] = _max_int(dbits[:n])
            out[1] = _max_int(rbits[:n])
            fast = outf[0] != np.inf  # else a difference of two finite float64s overflowed
        if fast:
            eq += e
            w3 += c3
            w2 += c2
            dot += d_
            sa += s1
            sb += s2
            if outf[0] > max_abs:
                max_abs = outf[0]
            if outf[1] > max_rel:
                max_rel = outf[1]
            if first < 0 and e < n:
                for i in range(bs, be):
                    if ac[i - bs] != bc[i - bs]:
                        first = i
                        break
            continue
        t = _float_exact(a, b, bs, be)
        eq += t[1]
        if first < 0 and t[2] >= 0:
            first = t[2]
        if t[3] > max_abs:
            max_abs = t[3]
        if t[4] > max_rel:
            max_rel = t[4]
        w3 += t[5]
        w2 += t[6]
        dot += t[7]
        sa += t[8]
        sb += t[9]
        nanmis += t[10]
    return (stop - start, eq, first, max_abs, max_rel, w3, w2, dot, sa, sb, nanmis)

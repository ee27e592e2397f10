"""The parameter fingerprint's CPU kernel: one numba pass per parameter (docs/dump-format.md, "param").

`fingerprint` reads a flat array once, in chunks that stay in the L1 cache while two passes run
over each: the `mix64` digest of its 32-bit words (lake/grad_stats.mix64_numpy, bit for bit;
64-bit multiplies vectorize where the CPU has them) and the float64 sum and sum of squares of
its values. Imported only when a CPU parameter monitor runs; compiled on first use, cached on disk.
"""

from __future__ import annotations

import numpy as np

from rlprobe.lake.grad_stats import MIX_K1, MIX_K2
from rlprobe.numba_cache import use_user_cache_dir

use_user_cache_dir()

import numba  # noqa: E402  (after the cache dir is set)

_CHUNK = 4096
_K1 = np.int64(MIX_K1)
_K2 = np.int64(MIX_K2)


@numba.njit(nogil=True, cache=True)
def _mix(w, start):  # pragma: no cover (compiled)
    """Sum of mix64 terms of 32-bit words `w` at positions start.. (int64, wrapping)."""
    h = np.int64(0)
    for j in range(w.size):
        x = (np.int64(w[j]) ^ ((start + j) * _K1)) * _K2
        h += x ^ (x >> 31)
    return h


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _sums(a):  # pragma: no cover (compiled)
    s = 0.0
    ss = 0.0
    for i in range(a.size):
        x = np.float64(a[i])
        s += x
        ss += x * x
    return s, ss


@numba.njit(nogil=True, cache=True)
def _fingerprint(values, words, ratio):  # pragma: no cover (compiled)
    """values: the floats; words: their bytes as uint32, `ratio` words per value (1: float32, 2:
    float64; 0: unrelated arrays, each read in a pass of its own)."""
    digest = np.int64(0)
    s = 0.0
    ss = 0.0
    if ratio == 0:
        for start in range(0, words.size, _CHUNK):
            digest += _mix(words[start: start + _CHUNK], np.int64(start))
        for start in range(0, values.size, _CHUNK):
            cs, css = _sums(values[start: start + _CHUNK])
            s += cs
            ss += css
        return digest, s, ss
    for start in range(0, values.size, _CHUNK):
        digest += _mix(words[start * ratio: (start + _CHUNK) * ratio], np.int64(start * ratio))
        cs, css = _sums(values[start: start + _CHUNK])
        s += cs
        ss += css
    return digest, s, ss


def fingerprint(values: np.ndarray, words: np.ndarray | None = None) -> tuple[int, float, float]:
    """(mix64 digest as uint64 int, sum, norm) of a 1-D C-contiguous float32/float64 array; `words`:
    the uint32 words to digest when they are not `values`' own bytes (bf16, odd-sized 16-bit)."""
    if words is None:
        ratio = values.dtype.itemsize // 4
        words = values.view(np.uint32)
    else:
        ratio = 0
    digest, s, ss = _fingerprint(values, words, np.int64(ratio))
    return int(digest) & 0xFFFFFFFFFFFFFFFF, float(s), float(np.sqrt(ss))

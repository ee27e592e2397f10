"""Element-wise comparison of two tensors in one fused pass.

One compiled kernel walks two flat arrays once and returns *partial aggregates* for a range of
flat (C-order) indices; partials of any set of ranges combine into the final metrics, so a
large pair can be split over threads, workers or machines.

Element semantics (DESIGN.md, "Element semantics"); ``a`` and ``b`` are the two elements at
one flat index, widened to float64 (integers are compared as integers):

* **equal** when ``a == b`` (so ``-0.0`` equals ``0.0``), when both are NaN, or when both are
  the same signed infinity. Integers: exact integer equality (never through float).
* **NaN against anything else** (a number or an infinity) is a mismatch, counted in
  ``nan_mismatch_count`` and left out of ``max_abs_err`` and ``max_rel_err``: an error is
  never NaN because a NaN was present.
* **abs err** ``|a - b|``; **rel err** ``|a - b| / max(|a|, |b|)`` (0 where both are 0). For
  two finite float64 values whose difference overflows, abs err is inf and rel err is
  computed as ``|a/m - b/m|`` (so it stays <= 2).
* **Infinities**: an infinity against a finite value, or ``+inf`` against ``-inf``, has abs
  err ``inf``; its rel err is **1.0** (finite vs inf) and **2.0** (+inf vs -inf) - the limits
  of ``|a - b| / max(|a|, |b|)`` - and it is *not* within any tolerance.
* **within_1e3** counts elements with ``|a - b| <= 1e-3 * max(|a|, |b|)``; equal elements
  (both-NaN and same-signed infinities included) always count as within; NaN-vs-other and
  inf-vs-other never do. Likewise ``within_1e2``.
* **cosine** is ``dot / (|a| |b|)`` over the elements where *both* values are finite; 1.0 when
  both norms are 0, 0.0 when exactly one is, ``None`` for an empty pair (and ``None`` if the
  float64 sums overflow).

On data without NaN/inf these are msprobe's ``SingleComparator`` formulas (same %, first
mismatch, max abs/rel err, % within 1e-3/1e-2); msprobe computes in the stored dtype
(float32) while rlprobe computes every element in float64, so a float32 element lying within
one float32 rounding of a tolerance bound may be counted differently.

Everything is accumulated in float64 (counts in int64). The kernels (rlprobe/comparison/kernels.pyx, their
loops in float_lanes.h) are compiled when rlprobe is installed, for exactly three signatures - (float32,
float32), (float64, float64) and (int64, int64), C-contiguous 1-D arrays; ``python hatch_build.py`` rebuilds
them in a checkout. Other dtype pairs are converted chunk by chunk:
bool/int/uint -> int64 (a chunk holding uint64 values above 2**63-1 takes a slower exact path),
float16/float32 -> float32 (exact), any other float mix and int-vs-float -> float64
(int-vs-float is compared as floats, so integers above 2**53 round).

The float kernel works in blocks of 2048 elements: a block goes through a branch-free loop in eight lanes
(its float64 sums added lane by lane, element i in lane i % 8, the lanes added in order: the same bits at
every vector width, SSE2, AVX2 or AVX-512), the rel errors' division only where some element differs; a
block with a NaN or an infinity, or a float64 difference that overflows, is redone element by element with
every rule above, its sums in the same lanes. Sums are reduced per chunk of ``chunk`` elements (blocks start
at the chunk's start), chunks are aligned to multiples of ``chunk`` in the flat index space, and ``combine``
adds the chunk sums with ``math.fsum`` (exactly rounded, order independent). So splitting a pair into ranges
whose boundaries are multiples of ``chunk`` gives bit-identical results, whatever the number of workers.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from rlprobe.comparison import kernels
from rlprobe.comparison.flat_sources import ArraySource, FlatSource, MappedPages, chunk_bounds
from rlprobe.comparison.partials import METRIC_KEYS, Partial, combine, partial_from

__all__ = [
    "DEFAULT_CHUNK",
    "METRIC_KEYS",
    "ArraySource",
    "chunk_partial",
    "combine",
    "common_dtype",
    "FlatSource",
    "MappedPages",
    "pair_kernel",
    "pair_metrics",
    "Partial",
    "range_partials",
    "ranges",
]

DEFAULT_CHUNK = 1 << 20
_INT64_MAX = np.iinfo(np.int64).max


# --------------------------------------------------------------------------------------
def common_dtype(dtype_a: np.dtype, dtype_b: np.dtype) -> np.dtype:
    """The kernel dtype a pair of stored dtypes is compared in (TypeError when unsupported)."""
    da, db = np.dtype(dtype_a), np.dtype(dtype_b)
    for d in (da, db):
        if d.kind not in "biuf":
            raise TypeError(f"cannot compare elements of dtype {d} (only bool, integer and real float dtypes)")
    if da.kind in "biu" and db.kind in "biu":
        return np.dtype(np.int64)
    if da.kind == "f" and db.kind == "f" and da.itemsize <= 4 and db.itemsize <= 4:
        return np.dtype(np.float32)  # float16/float32 widen to float32 exactly
    return np.dtype(np.float64)


def _fits_int64(chunk: np.ndarray) -> bool:
    return chunk.dtype != np.uint64 or chunk.size == 0 or int(chunk.max()) <= _INT64_MAX


def _prepare(chunk: np.ndarray, target: np.dtype) -> np.ndarray:
    chunk = np.asarray(chunk)  # drop ndarray subclasses (np.memmap)
    if chunk.dtype == target and chunk.flags.c_contiguous and chunk.flags.aligned and chunk.ndim == 1:
        return chunk
    return chunk.reshape(-1).astype(target, order="C")


def _wide_int_partial(ca: np.ndarray, cb: np.ndarray, offset: int) -> Partial:
    """Integer chunks with uint64 values above 2**63-1: exact, through Python ints (rare, slow)."""
    xa = ca.astype(object)
    xb = cb.astype(object)
    fa = ca.astype(np.float64)
    fb = cb.astype(np.float64)
    equal = np.asarray(xa == xb, dtype=bool)
    d = np.abs(xa - xb).astype(np.float64)  # exact difference, rounded once
    m = np.maximum(np.abs(fa), np.abs(fb))
    mism = ~equal
    mismatches = np.flatnonzero(mism)
    rel = np.zeros_like(d)
    np.divide(d, m, out=rel, where=mism)
    w3 = int(np.count_nonzero(mism & (d <= 1e-3 * m)))
    w2 = int(np.count_nonzero(mism & (d <= 1e-2 * m)))
    eq = int(np.count_nonzero(equal))
    n = int(ca.shape[0])
    return Partial(n, eq, int(mismatches[0]) + offset if mismatches.size else -1,
                   float(d.max(initial=0.0)), float(rel.max(initial=0.0)), eq + w3, eq + w2,
                   math.fsum(fa * fb), math.fsum(fa * fa), math.fsum(fb * fb), 0)


def chunk_partial(ca: np.ndarray, cb: np.ndarray, offset: int = 0) -> Partial:
    """Aggregates of two 1-D chunks of equal length; ``offset`` is the flat index of element 0.

    Converts the chunks only when their dtypes are not a compiled signature.
    """
    if ca.shape[0] != cb.shape[0]:
        raise ValueError(f"chunks differ in length: {ca.shape[0]} vs {cb.shape[0]}")
    target = common_dtype(ca.dtype, cb.dtype)
    if target == np.int64 and not (_fits_int64(ca) and _fits_int64(cb)):
        return _wide_int_partial(np.asarray(ca).reshape(-1), np.asarray(cb).reshape(-1), offset)
    ca = _prepare(ca, target)
    cb = _prepare(cb, target)
    return partial_from(pair_kernel(target)(ca, cb, 0, ca.shape[0]), offset)


def range_partials(a: FlatSource, b: FlatSource, start: int, stop: int, chunk: int = DEFAULT_CHUNK) -> list[Partial]:
    """One :class:`Partial` per chunk of [start, stop) (chunks aligned to multiples of ``chunk``)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    out = []
    for s, e in chunk_bounds(start, stop, chunk):
        out.append(chunk_partial(a.read(s, e), b.read(s, e), s))
        a.release(s, e)
        b.release(s, e)
    return out


def ranges(numel: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """Split [0, numel) into at most ``parts`` contiguous, near-equal ranges covering it.

    Inner boundaries are multiples of ``align`` (pass the chunk size to keep results
    bit-identical to a one-shot pass). Always at least one range: ``[(0, 0)]`` for numel 0.
    """
    if numel < 0 or parts < 1 or align < 1:
        raise ValueError(f"bad split: numel={numel}, parts={parts}, align={align}")
    blocks = -(-numel // align)  # units of `align` elements
    parts = max(1, min(parts, blocks))
    bounds = [min(numel, (blocks * i // parts) * align) for i in range(parts + 1)]
    bounds[-1] = numel
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


def pair_metrics(a: Any, b: Any, chunk: int = DEFAULT_CHUNK) -> dict[str, Any]:
    """Compare two arrays element-wise (flat, C order) and return the final metrics.

    ``a`` and ``b`` may have any shape (and be ``np.memmap``); they must have the same number
    of elements. Memory stays bounded by a few chunks of ``chunk`` elements: a chunk is
    copied only when its dtype is not a compiled signature or it is not contiguous, and the
    pages of a memmap are dropped from the resident set once compared (:class:`MappedPages`).
    See :func:`combine` for the keys.
    """
    sa, sb = ArraySource(a), ArraySource(b)
    if sa.size != sb.size:
        raise ValueError(f"arrays differ in size: {sa.size} vs {sb.size} elements")
    common_dtype(sa.dtype, sb.dtype)  # TypeError early, also for empty arrays
    return combine(range_partials(sa, sb, 0, sa.size, chunk))


_KERNELS = {np.dtype(np.float32): kernels.pair_f4, np.dtype(np.float64): kernels.pair_f8,
            np.dtype(np.int64): kernels.pair_i8}


def pair_kernel(dtype: np.dtype) -> Callable[..., tuple]:
    """The element kernel for float32, float64 or int64 chunks (C-contiguous, 1-D, of that dtype),
    `(a, b, start, stop) -> its partial aggregates` (partials.FIELDS' order)."""
    return _KERNELS[np.dtype(dtype)]

"""Element-wise comparison of two tensors in one fused pass.

One numba kernel walks two flat arrays once and returns *partial aggregates* for a range of
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

Everything is accumulated in float64 (counts in int64). The kernel is compiled for exactly
three signatures - (float32, float32), (float64, float64) and (int64, int64), read-only
C-contiguous 1-D arrays - lazily on first use (``warm_up()`` pays it up front) and cached on
disk (``cache=True``). Other dtype pairs are converted chunk by chunk: bool/int/uint ->
int64 (a chunk holding uint64 values above 2**63-1 takes a slower exact path),
float16/float32 -> float32 (exact), any other float mix and int-vs-float -> float64
(int-vs-float is compared as floats, so integers above 2**53 round).

The float kernel works in blocks of 2048 elements: a block whose values are all finite (the
common case) goes through a branch-free loop that the compiler vectorizes (its float64 sums
may be reassociated, its maxima taken over the bits of the non-negative errors); a block with
a NaN or an infinity, or a float64 difference that overflows, is redone element by element
with every rule above. Sums are reduced per chunk of ``chunk`` elements (blocks start at the
chunk's start), chunks are aligned to multiples of ``chunk`` in the flat index space, and
``combine`` adds the chunk sums with ``math.fsum`` (exactly rounded, order independent). So
splitting a pair into ranges whose boundaries are multiples of ``chunk`` gives bit-identical
results, whatever the number of workers.
"""

from __future__ import annotations

import math
import mmap as _mmap_mod
import threading
from typing import Any, Iterable, NamedTuple, Protocol

import numpy as np

from rlprobe.numba_cache import use_user_cache_dir

use_user_cache_dir()

import numba  # noqa: E402  (after the cache dir is set)
from numba import types as _nt  # noqa: E402

__all__ = [
    "DEFAULT_CHUNK",
    "ArraySource",
    "FlatSource",
    "MappedPages",
    "METRIC_KEYS",
    "Partial",
    "chunk_partial",
    "combine",
    "common_dtype",
    "pair_metrics",
    "range_partials",
    "ranges",
    "warm_up",
]

DEFAULT_CHUNK = 1 << 20

#: keys of the dict returned by :func:`pair_metrics` and :func:`combine`
METRIC_KEYS = (
    "numel",
    "equal_count",
    "first_mismatch_index",
    "max_abs_err",
    "max_rel_err",
    "within_1e3_count",
    "within_1e2_count",
    "cosine",
    "nan_mismatch_count",
)

_INT64_MAX = np.iinfo(np.int64).max


# --------------------------------------------------------------------------------------
# kernels (plain Python here; compiled lazily, see _kernel())


@numba.njit(nogil=True, cache=True)
def _float_exact(a, b, start, stop):  # pragma: no cover - runs compiled
    """Partial aggregates of float arrays ``a``, ``b`` over flat indices [start, stop), one element
    at a time with every special case (NaN, infinities, overflowing differences)."""
    inf = np.inf
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
    for i in range(start, stop):
        x = np.float64(a[i])
        y = np.float64(b[i])
        if x == y:
            eq += 1
            if x - x == 0.0:  # finite (inf - inf is NaN)
                dot += x * y
                sa += x * x
                sb += y * y
            continue
        if x != x or y != y:  # at least one NaN
            if x != x and y != y:
                eq += 1
            else:
                nanmis += 1
                if first < 0:
                    first = i
            continue
        if first < 0:
            first = i
        ax = abs(x)
        ay = abs(y)
        m = ax if ax > ay else ay
        if m == inf:  # an infinity against a finite value or the opposite infinity
            max_abs = inf
            rel = 2.0 if ax == ay else 1.0
            if rel > max_rel:
                max_rel = rel
            continue
        d = abs(x - y)
        if d == inf:  # two finite float64 values whose difference overflows
            rel = abs(x / m - y / m)
        else:
            rel = d / m
        if d > max_abs:
            max_abs = d
        if rel > max_rel:
            max_rel = rel
        if d <= 1e-3 * m:
            w3 += 1
        if d <= 1e-2 * m:
            w2 += 1
        dot += x * y
        sa += x * x
        sb += y * y
    return (stop - start, eq, first, max_abs, max_rel, eq + w3, eq + w2, dot, sa, sb, nanmis)


_BLOCK = 2048  # elements per block of the float kernel (a few KB: stays in L1 across its passes)


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
def _max_int(v):  # pragma: no cover - runs compiled
    """Max of int64 values: the max of non-negative float64s through their bits (integer
    max vectorizes, float max does not)."""
    m = v[0]
    for i in range(v.size):
        m = max(m, v[i])
    return m


def _float_kernel(a, b, start, stop):  # pragma: no cover - runs compiled
    """Partial aggregates of float arrays ``a``, ``b`` over flat indices [start, stop).

    Block by block: a block with only finite values (the common case) takes the vectorized
    `_finite_block`; one holding a NaN or an infinity, or whose float64 difference overflows,
    is redone by `_float_exact`. The first mismatch is searched for only in the first block that
    has one."""
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
        fast = _nonfinite_count(ac, bc) == 0
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


def _int_kernel(a, b, start, stop):  # pragma: no cover - runs compiled
    """Partial aggregates of int64 arrays: exact equality, errors in float64."""
    eq = 0
    first = -1
    max_abs = 0.0
    max_rel = 0.0
    w3 = 0
    w2 = 0
    dot = 0.0
    sa = 0.0
    sb = 0.0
    for i in range(start, stop):
        p = a[i]
        q = b[i]
        x = np.float64(p)
        y = np.float64(q)
        dot += x * y
        sa += x * x
        sb += y * y
        if p == q:
            eq += 1
            continue
        if first < 0:
            first = i
        # the exact difference, in uint64 arithmetic (no int64 overflow), rounded once
        if p > q:
            d = np.float64(np.uint64(p) - np.uint64(q))
        else:
            d = np.float64(np.uint64(q) - np.uint64(p))
        ax = abs(x)
        ay = abs(y)
        m = ax if ax > ay else ay
        rel = d / m
        if d > max_abs:
            max_abs = d
        if rel > max_rel:
            max_rel = rel
        if d <= 1e-3 * m:
            w3 += 1
        if d <= 1e-2 * m:
            w2 += 1
    return (stop - start, eq, first, max_abs, max_rel, eq + w3, eq + w2, dot, sa, sb, 0)


def _array_type(dtype):
    return _nt.Array(dtype, 1, "C", readonly=True)


_SIGNATURES = {
    np.dtype(np.float32): (_float_kernel, _nt.float32),
    np.dtype(np.float64): (_float_kernel, _nt.float64),
    np.dtype(np.int64): (_int_kernel, _nt.int64),
}
_compiled: dict[np.dtype, Any] = {}
_compile_lock = threading.Lock()


def _kernel(dtype: np.dtype):
    """The compiled kernel for one of the three dtypes (compiled or loaded from cache once)."""
    k = _compiled.get(dtype)
    if k is None:
        with _compile_lock:
            k = _compiled.get(dtype)
            if k is None:
                pyfunc, nbtype = _SIGNATURES[dtype]
                arr = _array_type(nbtype)
                k = numba.njit([(arr, arr, _nt.int64, _nt.int64)], nogil=True, cache=True)(pyfunc)
                _compiled[dtype] = k
    return k


def warm_up() -> None:
    """Compile (or load from the on-disk cache) the three kernels by running them on tiny arrays.

    Thread-safe; a CLI may call it in a background thread while it reads the dumps.
    """
    for dtype in _SIGNATURES:
        x = np.zeros(2, dtype=dtype)
        _kernel(dtype)(x, x, 0, 2)


# --------------------------------------------------------------------------------------
# partial aggregates


class Partial(NamedTuple):
    """Aggregates of one range of flat indices (what a kernel returns)."""

    n: int
    equal_count: int
    first_mismatch: int  # flat index, -1 when none
    max_abs_err: float
    max_rel_err: float
    within_1e3: int
    within_1e2: int
    dot: float  # over elements where both values are finite
    sum_sq_a: float
    sum_sq_b: float
    nan_mismatch_count: int


def _partial(t: tuple, offset: int) -> Partial:
    n, eq, first, mabs, mrel, w3, w2, dot, sa, sb, nanmis = t
    return Partial(int(n), int(eq), int(first) + offset if first >= 0 else -1, float(mabs), float(mrel),
                   int(w3), int(w2), float(dot), float(sa), float(sb), int(nanmis))


def _cosine(n: int, dot: float, sa: float, sb: float) -> float | None:
    if n == 0:
        return None
    if sa == 0.0 and sb == 0.0:
        return 1.0
    if sa == 0.0 or sb == 0.0:
        return 0.0
    if not (math.isfinite(sa) and math.isfinite(sb) and math.isfinite(dot)):
        return None  # the float64 sums overflowed (|values| beyond ~1e154)
    prod = sa * sb
    # sqrt(s*s) == s exactly, so identical arrays give exactly 1.0; fall back when the
    # product over- or underflows
    denom = math.sqrt(prod) if 0.0 < prod < math.inf else math.sqrt(sa) * math.sqrt(sb)
    cos = dot / denom
    if not math.isfinite(cos):
        return None
    return max(-1.0, min(1.0, cos))


def _fsum(xs: list[float]) -> float:
    """Exactly rounded sum; inf/NaN propagate (fsum would raise on inf + -inf)."""
    if not all(math.isfinite(x) for x in xs):
        return sum(xs)
    try:
        return math.fsum(xs)
    except OverflowError:  # a partial sum overflowed: add scaled values (inf if the total overflows)
        return math.fsum(x * 2.0**-64 for x in xs) * 2.0**64


def combine(partials: Iterable[Partial | tuple]) -> dict[str, Any]:
    """Merge partial aggregates of disjoint ranges (in any order) into the final metrics.

    Returns a dict with the keys of :data:`METRIC_KEYS`: ``numel``, ``equal_count``,
    ``first_mismatch_index`` (int, None when none), ``max_abs_err``, ``max_rel_err``,
    ``within_1e3_count``, ``within_1e2_count``, ``cosine`` (None for numel 0) and
    ``nan_mismatch_count``. Sums are added with ``math.fsum``, so the result does not
    depend on the order of ``partials``.
    """
    n = eq = w3 = w2 = nanmis = 0
    first = -1
    mabs = mrel = 0.0
    dots: list[float] = []
    sas: list[float] = []
    sbs: list[float] = []
    for p in partials:
        p = p if isinstance(p, Partial) else Partial(*p)
        n += p.n
        eq += p.equal_count
        if p.first_mismatch >= 0 and (first < 0 or p.first_mismatch < first):
            first = p.first_mismatch
        if p.max_abs_err > mabs:
            mabs = p.max_abs_err
        if p.max_rel_err > mrel:
            mrel = p.max_rel_err
        w3 += p.within_1e3
        w2 += p.within_1e2
        dots.append(p.dot)
        sas.append(p.sum_sq_a)
        sbs.append(p.sum_sq_b)
        nanmis += p.nan_mismatch_count
    dot, sa, sb = _fsum(dots), _fsum(sas), _fsum(sbs)
    return {
        "numel": n,
        "equal_count": eq,
        "first_mismatch_index": first if first >= 0 else None,
        "max_abs_err": mabs,
        "max_rel_err": mrel,
        "within_1e3_count": w3,
        "within_1e2_count": w2,
        "cosine": _cosine(n, dot, sa, sb),
        "nan_mismatch_count": nanmis,
    }


# --------------------------------------------------------------------------------------
# dtypes and chunks


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
    return _partial(_kernel(target)(ca, cb, 0, ca.shape[0]), offset)


class FlatSource(Protocol):
    """Anything that yields C-order flat pieces of one tensor (arrays here; files in the executor)."""

    dtype: np.dtype
    size: int

    def read(self, start: int, stop: int) -> np.ndarray:  # 1-D, may be a view or a reused buffer
        ...

    def release(self, start: int, stop: int) -> None:  # done with [start, stop): free what it held
        ...


class MappedPages:
    """Drops the pages of a memory-mapped array from the resident set once they were read.

    Pages of a file mapping that were touched stay in the process's RSS until the map is
    closed, so a pass over a 4 GB memmap would end with 4 GB resident. ``madvise(DONTNEED)``
    on a read-only shared file mapping just unmaps them (the data stays in the page cache and
    is faulted in again if touched). A no-op for arrays that are not ``np.memmap``.
    """

    def __init__(self, arr: np.ndarray):
        self._mm = None
        mm = getattr(arr, "_mmap", None)
        if mm is None or arr.size == 0 or not hasattr(mm, "madvise") or not hasattr(_mmap_mod, "MADV_DONTNEED"):
            return
        try:
            base = np.frombuffer(mm, dtype=np.uint8)
            self._start = arr.ctypes.data - base.ctypes.data
            del base
        except (TypeError, ValueError, BufferError):
            return
        self._mm = mm
        self._item = arr.dtype.itemsize
        self._c_order = bool(arr.flags.c_contiguous)

    def release(self, start: int, stop: int) -> None:
        if self._mm is None:
            return
        try:
            if self._c_order:
                lo = self._start + start * self._item
                hi = self._start + stop * self._item
                lo -= lo % _mmap_mod.PAGESIZE
                if hi > lo:
                    self._mm.madvise(_mmap_mod.MADV_DONTNEED, lo, hi - lo)
            else:  # C-order reads of a non-C-order array are scattered: drop the whole map
                self._mm.madvise(_mmap_mod.MADV_DONTNEED)
        except (OSError, ValueError):
            self._mm = None


def _flat_slice(arr: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Elements [start, stop) of ``arr`` in C order, copying at most ``stop - start`` elements."""
    if arr.ndim <= 1 or arr.flags.c_contiguous:
        return arr.reshape(-1)[start:stop]
    row = math.prod(arr.shape[1:])
    r0, o0 = divmod(start, row)
    r1, o1 = divmod(stop, row)
    if r0 == r1:
        return _flat_slice(arr[r0], o0, o1)
    pieces = []
    if o0:
        pieces.append(_flat_slice(arr[r0], o0, row))
        r0 += 1
    if r1 > r0:
        pieces.append(arr[r0:r1].reshape(-1))
    if o1:
        pieces.append(_flat_slice(arr[r1], 0, o1))
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class ArraySource:
    """A :class:`FlatSource` over an in-memory array or a memmap (any shape and strides)."""

    def __init__(self, arr: Any):
        arr = arr if isinstance(arr, np.ndarray) else np.asarray(arr)
        self.arr = arr.reshape(-1) if arr.flags.c_contiguous else arr
        self.dtype = arr.dtype
        self.size = int(arr.size)
        self._pages = MappedPages(arr)

    def read(self, start: int, stop: int) -> np.ndarray:
        return _flat_slice(self.arr, start, stop)

    def release(self, start: int, stop: int) -> None:
        self._pages.release(start, stop)


def _chunk_bounds(start: int, stop: int, chunk: int):
    """[start, stop) cut at the multiples of ``chunk``."""
    s = start
    while s < stop:
        e = min(stop, (s // chunk + 1) * chunk)
        yield s, e
        s = e


def range_partials(a: FlatSource, b: FlatSource, start: int, stop: int, chunk: int = DEFAULT_CHUNK) -> list[Partial]:
    """One :class:`Partial` per chunk of [start, stop) (chunks aligned to multiples of ``chunk``)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    out = []
    for s, e in _chunk_bounds(start, stop, chunk):
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

"""Compiled listing of a folder for rlprobe.lake.msprobe_kernels (numba, ``nogil``): its names and their
types with libc's ``opendir``/``readdir`` (the ``struct dirent`` of 64-bit Linux), names sorted as Python
sorts them (by code point: UTF-8's byte order), one found by name, and the check that a name is UTF-8."""

from __future__ import annotations

import numpy as np

from rlprobe.numba_cache import import_numba, use_user_cache_dir

use_user_cache_dir()
import_numba()

import numba  # noqa: E402  (after the cache dir is set)
from numba import types as _nt  # noqa: E402

__all__ = ["DT_DIR", "DT_LNK", "DT_UNKNOWN", "find_name", "grow", "is_utf8", "list_folder", "sorted_names"]

_OPENDIR = _nt.ExternalFunction("opendir", _nt.int64(_nt.voidptr))
_READDIR = _nt.ExternalFunction("readdir", _nt.int64(_nt.int64))
_CLOSEDIR = _nt.ExternalFunction("closedir", _nt.int32(_nt.int64))
_STRLEN = _nt.ExternalFunction("strlen", _nt.uint64(_nt.int64))
_MEMCPY = _nt.ExternalFunction("memcpy", _nt.int64(_nt.voidptr, _nt.int64, _nt.uint64))
_NAME_OFFSET = 19  # struct dirent on 64-bit Linux: d_ino, d_off (8 bytes each), d_reclen (2), d_type (1), d_name
DT_UNKNOWN, DT_DIR, DT_LNK = 0, 4, 10


@numba.njit(nogil=True, cache=True)
def grow(a, need):  # pragma: no cover - runs compiled
    """`a`, or a copy at least `need` long (twice as long) where it is shorter."""
    if need <= a.shape[0]:
        return a
    b = np.empty(max(2 * a.shape[0], need), a.dtype)
    b[:a.shape[0]] = a
    return b


@numba.njit(nogil=True, cache=True)
def is_utf8(buf, start, end):  # pragma: no cover - runs compiled
    """Whether buf[start:end] is strict UTF-8 (as Python decodes it: no surrogates, no overlong forms)."""
    p = start
    while p < end:
        c = buf[p]
        if c < 0x80:
            p += 1
            continue
        if 0xC2 <= c <= 0xDF:
            n, lo, hi = 1, 0x80, 0xBF
        elif 0xE0 <= c <= 0xEF:
            n = 2
            lo = 0xA0 if c == 0xE0 else 0x80
            hi = 0x9F if c == 0xED else 0xBF
        elif 0xF0 <= c <= 0xF4:
            n = 3
            lo = 0x90 if c == 0xF0 else 0x80
            hi = 0x8F if c == 0xF4 else 0xBF
        else:
            return False
        if p + n >= end:
            return False
        if not (lo <= buf[p + 1] <= hi):
            return False
        for k in range(2, n + 1):
            if not (0x80 <= buf[p + k] <= 0xBF):
                return False
        p += n + 1
    return True


@numba.njit(nogil=True, cache=True)
def list_folder(path, names):  # pragma: no cover - runs compiled
    """The entries of the folder whose NUL-terminated path is `path` but . and ..: their names one after
    another in the returned `names` (grown), their starts, lengths and d_type; count -1: not listed."""
    starts = np.empty(16, np.int64)
    lengths = np.empty(16, np.int64)
    types = np.empty(16, np.int64)
    head = np.empty(_NAME_OFFSET, np.uint8)
    dirp = _OPENDIR(path.ctypes.data)
    if dirp == 0:
        return -1, names, starts, lengths, types
    count = 0
    pos = 0
    while True:
        entry = _READDIR(dirp)
        if entry == 0:
            break
        _MEMCPY(head.ctypes.data, entry, _NAME_OFFSET)
        length = np.int64(_STRLEN(entry + _NAME_OFFSET))
        names = grow(names, pos + length + 1)
        _MEMCPY(names[pos:].ctypes.data, entry + _NAME_OFFSET, length)
        if names[pos] == 46 and (length == 1 or (length == 2 and names[pos + 1] == 46)):  # . and ..
            continue
        starts = grow(starts, count + 1)
        lengths = grow(lengths, count + 1)
        types = grow(types, count + 1)
        starts[count] = pos
        lengths[count] = length
        types[count] = head[18]
        count += 1
        pos += length
    _CLOSEDIR(dirp)
    return count, names, starts, lengths, types


@numba.njit(nogil=True, cache=True)
def _before(names, starts, lengths, numbers, i, j):  # pragma: no cover - runs compiled
    """Whether entry i sorts before entry j: by number, then name (bytes: code points for UTF-8)."""
    if numbers[i] != numbers[j]:
        return numbers[i] < numbers[j]
    a, b = starts[i], starts[j]
    n = min(lengths[i], lengths[j])
    for k in range(n):
        if names[a + k] != names[b + k]:
            return names[a + k] < names[b + k]
    return lengths[i] < lengths[j]


@numba.njit(nogil=True, cache=True)
def sorted_names(names, starts, lengths, numbers, picked):  # pragma: no cover - runs compiled
    """The entries `picked` in order (a merge sort: stable, n log n)."""
    order = picked.copy()
    work = np.empty_like(order)
    width = 1
    n = order.size
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if _before(names, starts, lengths, numbers, order[j], order[i]):
                    work[k] = order[j]
                    j += 1
                else:
                    work[k] = order[i]
                    i += 1
                k += 1
            while i < mid:
                work[k] = order[i]
                i += 1
                k += 1
            while j < hi:
                work[k] = order[j]
                j += 1
                k += 1
        order, work = work, order
        width *= 2
    return order


@numba.njit(nogil=True, cache=True)
def find_name(names, starts, lengths, order, want, size):  # pragma: no cover - runs compiled
    """The entry of `order` (sorted by name) named want[:size], or -1."""
    lo, hi = 0, order.size
    while lo < hi:
        mid = (lo + hi) // 2
        e = order[mid]
        s, n = starts[e], lengths[e]
        cmp = 0
        for k in range(min(n, size)):
            if names[s + k] != want[k]:
                cmp = -1 if names[s + k] < want[k] else 1
                break
        if cmp == 0 and n != size:
            cmp = -1 if n < size else 1
        if cmp == 0:
            return e
        if cmp < 0:
            lo = mid + 1
        else:
            hi = mid
    return -1

"""The compiled parser of one msprobe statistics file (rlprobe.lake.msprobe_kernels' reading of a dump): it
takes a file only where it is written the way msprobe writes it - one object ``{"data": {...}}`` of min, max,
mean, norm (a JSON number, NaN, Infinity, -Infinity or null) and shape (a list of integers or null), each at
most once, nothing else - and leaves every other one to Python's reading. A number is handed back as its
text: JSON's grammar is checked here, the value parsed by the caller (correctly rounded, as Python's float)."""

from __future__ import annotations

import numpy as np

from rlprobe.lake.msprobe_codes import STAT_INF, STAT_NAN, STAT_NEG_INF, STAT_NULL, STAT_NUMBER
from rlprobe.lake.regular_files import READ_FLAGS
from rlprobe.numba_cache import import_numba, use_user_cache_dir

use_user_cache_dir()
import_numba()

import numba  # noqa: E402  (after the cache dir is set)
from numba import types as _nt  # noqa: E402

__all__ = ["MAX_DIMS", "READ_SIZE", "at", "parse_statistics", "read_file"]

_OPEN = _nt.ExternalFunction("open", _nt.int32(_nt.voidptr, _nt.int32))
_PREAD = _nt.ExternalFunction("pread", _nt.int64(_nt.int32, _nt.voidptr, _nt.uint64, _nt.int64))
_CLOSE = _nt.ExternalFunction("close", _nt.int32(_nt.int32))
_O_FLAGS = READ_FLAGS  # O_NONBLOCK among them: a FIFO never blocks, it reads short (lake/regular_files.py)
READ_SIZE = 1 << 16  # msprobe_scan._READ_SIZE: a file this long or longer is Python's
MAX_DIMS = 64
_MAX_NUMBER = 40  # longer number texts are Python's (a float of an integer that long could overflow there)
_DATA_KEY = np.frombuffer(b'"data"', np.uint8)
_NULL = np.frombuffer(b"null", np.uint8)
_NAN = np.frombuffer(b"NaN", np.uint8)
_INFINITY = np.frombuffer(b"Infinity", np.uint8)
# the statistics in msprobe_scan.COLUMNS' order, then shape: their names in quotes, one after another
_FIELDS = np.frombuffer(b'"min""max""mean""norm""shape"', np.uint8)
_FIELD_ENDS = np.array([5, 10, 16, 22, 29], np.int64)


@numba.njit(nogil=True, cache=True)
def at(buf, pos, end, text):  # pragma: no cover - runs compiled
    """Whether buf[pos:end] starts with `text`."""
    if pos + text.size > end:
        return False
    for i in range(text.size):
        if buf[pos + i] != text[i]:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def _ws(buf, p, end):  # pragma: no cover - runs compiled
    while p < end and (buf[p] == 32 or buf[p] == 10 or buf[p] == 13 or buf[p] == 9):
        p += 1
    return p


@numba.njit(nogil=True, cache=True)
def _number(buf, p, end):  # pragma: no cover - runs compiled
    """The end of the JSON number at p (-1: none, or one Python reads otherwise than its text's float:
    -0 is the integer 0 there)."""
    s = p
    if p < end and buf[p] == 45:
        p += 1
    if p < end and buf[p] == 48:
        p += 1
        if p == s + 2 and buf[s] == 45 and (p >= end or (buf[p] != 46 and buf[p] != 101 and buf[p] != 69)):
            return -1  # the integer -0
    elif p < end and 49 <= buf[p] <= 57:
        while p < end and 48 <= buf[p] <= 57:
            p += 1
    else:
        return -1
    if p < end and buf[p] == 46:
        p += 1
        if p >= end or not (48 <= buf[p] <= 57):
            return -1
        while p < end and 48 <= buf[p] <= 57:
            p += 1
    if p < end and (buf[p] == 101 or buf[p] == 69):
        p += 1
        if p < end and (buf[p] == 43 or buf[p] == 45):
            p += 1
        if p >= end or not (48 <= buf[p] <= 57):
            return -1
        while p < end and 48 <= buf[p] <= 57:
            p += 1
    if p - s > _MAX_NUMBER:
        return -1
    return p


@numba.njit(nogil=True, cache=True)
def parse_statistics(buf, end, stats, dims):  # pragma: no cover - runs compiled
    """Parse a statistics file buf[:end] written the way msprobe writes it: stats[f] = (code, start, end)
    of min, max, mean, norm; the shape's number of dims (-1: null or missing; -2: not parsed: Python's)."""
    for f in range(4):
        stats[f, 0] = STAT_NULL
    ndim = -1
    seen = np.zeros(5, np.bool_)
    p = _ws(buf, 0, end)
    if p >= end or buf[p] != 123:
        return -2
    p = _ws(buf, p + 1, end)
    if not at(buf, p, end, _DATA_KEY):
        return -2
    p = _ws(buf, p + _DATA_KEY.size, end)
    if p >= end or buf[p] != 58:
        return -2
    p = _ws(buf, p + 1, end)
    if p >= end or buf[p] != 123:
        return -2
    p = _ws(buf, p + 1, end)
    if p < end and buf[p] == 125:
        p += 1
    else:
        while True:
            field = -1
            for f in range(5):
                text = _FIELDS[0 if f == 0 else _FIELD_ENDS[f - 1]:_FIELD_ENDS[f]]
                if at(buf, p, end, text):
                    field = f
                    p += text.size
                    break
            if field < 0 or seen[field]:
                return -2
            seen[field] = True
            p = _ws(buf, p, end)
            if p >= end or buf[p] != 58:
                return -2
            p = _ws(buf, p + 1, end)
            if p >= end:
                return -2
            if at(buf, p, end, _NULL):
                p += _NULL.size
                if field == 4:
                    ndim = -1
            elif field == 4:
                if buf[p] != 91:
                    return -2
                p = _ws(buf, p + 1, end)
                ndim = 0
                if p < end and buf[p] == 93:
                    p += 1
                else:
                    while True:
                        if p >= end or not (48 <= buf[p] <= 57) or ndim >= MAX_DIMS:
                            return -2
                        s = p
                        value = np.int64(0)
                        while p < end and 48 <= buf[p] <= 57:
                            value = value * 10 + (buf[p] - 48)
                            p += 1
                        if p - s > 18 or (p - s > 1 and buf[s] == 48):
                            return -2
                        dims[ndim] = value
                        ndim += 1
                        p = _ws(buf, p, end)
                        if p < end and buf[p] == 44:
                            p = _ws(buf, p + 1, end)
                        elif p < end and buf[p] == 93:
                            p += 1
                            break
                        else:
                            return -2
            elif at(buf, p, end, _NAN):
                stats[field, 0] = STAT_NAN
                p += _NAN.size
            elif at(buf, p, end, _INFINITY):
                stats[field, 0] = STAT_INF
                p += _INFINITY.size
            elif buf[p] == 45 and at(buf, p + 1, end, _INFINITY):
                stats[field, 0] = STAT_NEG_INF
                p += 1 + _INFINITY.size
            else:
                q = _number(buf, p, end)
                if q < 0:
                    return -2
                stats[field, 0] = STAT_NUMBER
                stats[field, 1] = p
                stats[field, 2] = q
                p = q
            p = _ws(buf, p, end)
            if p < end and buf[p] == 44:
                p = _ws(buf, p + 1, end)
            elif p < end and buf[p] == 125:
                p += 1
                break
            else:
                return -2
    p = _ws(buf, p, end)
    if p >= end or buf[p] != 125:
        return -2
    if _ws(buf, p + 1, end) != end:
        return -2
    return ndim


@numba.njit(nogil=True, cache=True)
def read_file(path, buf):  # pragma: no cover - runs compiled
    """Up to len(buf) bytes of the file at the NUL-terminated path (-1: not opened or not read)."""
    fd = _OPEN(path.ctypes.data, _O_FLAGS)
    if fd < 0:
        return -1
    got = np.int64(0)
    while got < buf.size:
        asked = buf.size - got
        n = _PREAD(fd, buf[got:].ctypes.data, asked, got)
        if n < 0:
            _CLOSE(fd)
            return -1
        got += n
        if n < asked:  # a regular file reads short only at its end (as msprobe_scan's one read assumes)
            break
    _CLOSE(fd)
    return got

"""The compiled half of rlprobe.comparison.small_pairs (numba, ``nogil``): read many small ``.npy``
files into one buffer with libc's ``open``/``pread``/``close`` and parse their headers, then run
the element kernel of rlprobe.comparison.pair_kernels over every pair - no Python and no GIL per file.

A header is taken only when it is written the way numpy writes it (``{'descr': '<f4',
'fortran_order': False, 'shape': (4, 64), }``, spaces, newline) with a three-character descr of
a bool, integer or float dtype that is native here; anything else is marked ``SLOW`` for the
per-pair path, which names the problem.
"""

from __future__ import annotations

import os

import numpy as np

from rlprobe.comparison.partials import ALIGN, BIG, F4, F8, I8, KINDS, OK, SLOW
from rlprobe.comparison.pair_kernels import compiled_float_kernel, compiled_int_kernel
from rlprobe.lake.libc import CLOSE, LSEEK, OPEN, PREAD
from rlprobe.lake.regular_files import READ_FLAGS

import numba  # noqa: E402,I001  (pair_kernels set numba's cache dir before this import)

__all__ = ["ALIGN", "BIG", "F4", "F8", "I8", "KINDS", "OK", "SLOW", "compare_batch", "read_files"]

_SEEK_END = os.SEEK_END
_O_FLAGS = READ_FLAGS  # O_NONBLOCK among them: a FIFO never blocks, it reads short (lake/regular_files.py)
FD_CACHE = 16  # descriptors read_files keeps open at once (a batch's packed files: a few per rank)

_DESCR = np.frombuffer(b"{'descr': '", np.uint8)
_FORTRAN = np.frombuffer(b"', 'fortran_order': False, 'shape': (", np.uint8)
_MAGIC = np.frombuffer(b"\x93NUMPY", np.uint8)
_LITTLE = np.dtype("<f4").isnative  # '<' descrs are native only on little-endian machines


@numba.njit(nogil=True, cache=True)
def _expect(buf, pos, end, text):  # pragma: no cover - runs compiled
    """Position after `text` if the bytes at `pos` are `text`, else -1."""
    if pos + text.size > end:
        return -1
    for i in range(text.size):
        if buf[pos + i] != text[i]:
            return -1
    return pos + text.size


@numba.njit(nogil=True, cache=True)
def parse_header(buf, start, size, out):  # pragma: no cover - runs compiled
    """Fill out = (status, dtype code, numel, data offset) for the file at buf[start:start+size]."""
    out[0] = SLOW
    if size < 10 or _expect(buf, start, start + 6, _MAGIC) < 0:
        return
    major = buf[start + 6]
    if major == 1:
        h0 = 10
        hlen = np.int64(buf[start + 8]) | (np.int64(buf[start + 9]) << 8)
    elif (major == 2 or major == 3) and size >= 12:
        h0 = 12
        hlen = 0
        for k in range(4):
            hlen |= np.int64(buf[start + 8 + k]) << (8 * k)
    else:
        return
    end = start + h0 + hlen
    if h0 + hlen > size:
        return
    p = _expect(buf, start + h0, end, _DESCR)
    if p < 0 or p + 4 > end or buf[p + 3] != 39:  # a three-character descr and its closing quote
        return
    order, kind, digit = buf[p], buf[p + 1], buf[p + 2]
    item = digit - 48
    if not (item == 1 or item == 2 or item == 4 or item == 8):
        return
    if not ((order == 124 and item == 1) or (order == 60 and _LITTLE)):  # '|' or '<'
        return
    if kind == 98:  # b
        code = item if item == 1 else -1
    elif kind == 105 or kind == 117:  # i, u
        code = (1 if kind == 105 else 2) * 16 + item
    elif kind == 102 and item != 1:  # f2, f4, f8
        code = 3 * 16 + item
    else:
        return
    if code < 0:
        return
    p = _expect(buf, p + 3, end, _FORTRAN)
    if p < 0:
        return
    numel = np.int64(1)
    while p < end and buf[p] != 41:  # up to ')'
        while p < end and buf[p] == 32:
            p += 1
        dim = np.int64(0)
        digits = 0
        while p < end and 48 <= buf[p] <= 57 and digits < 13:
            dim = dim * 10 + (buf[p] - 48)
            p += 1
            digits += 1
        if digits == 0 or digits == 13 or p >= end:
            return
        numel *= dim
        if numel > (np.int64(1) << 40):
            return
        if buf[p] == 44:  # ','
            p += 1
        elif buf[p] != 41:
            return
    if p >= end or buf[p] != 41:
        return
    p += 1
    # numpy ends the dict with ", }", pads with spaces and ends the header with a newline
    if p + 3 > end or buf[p] != 44 or buf[p + 1] != 32 or buf[p + 2] != 125:
        return
    p += 3
    while p < end - 1 and buf[p] == 32:
        p += 1
    if p != end - 1 or buf[p] != 10:
        return
    data = start + h0 + hlen
    if (h0 + hlen) + numel * item > size or data % item != 0:
        return
    out[0] = OK
    out[1] = code
    out[2] = numel
    out[3] = data


@numba.njit(nogil=True, cache=True)
def read_files(paths, path_starts, offsets, lengths, limit, info, sizes):  # pragma: no cover - runs compiled
    """Read file i (NUL-terminated path at paths[path_starts[i]:]) whole into the returned buffer, or
    the `lengths[i]` bytes at `offsets[i]` where lengths[i] >= 0 (a record of a packed file, lake/
    tensor_pack.py), at a multiple of ALIGN, when it has at most `limit` bytes (else status BIG), and
    parse its header into info[i]; sizes[i] is its size (-1: it could not be opened or sized).

    Files given by the same path start (small_pairs.path_bytes stores a path once) are opened once while
    they stay among the last FD_CACHE files opened: the records of a packed file are read through one
    descriptor (an open and a close cost ~1.5 us, as much as reading a 1 KB record)."""
    buf = np.empty(1 << 16, np.uint8)
    pos = 0
    cached_start = np.full(FD_CACHE, -1, np.int64)  # path start of each cached descriptor (-1: none)
    cached_fd = np.full(FD_CACHE, -1, np.int32)
    victim = 0  # the slot a newly opened file takes when none is free (round robin)
    for i in range(path_starts.size):
        info[i, 0] = SLOW
        sizes[i] = -1
        fd = np.int32(-1)
        for k in range(FD_CACHE):
            if cached_start[k] == path_starts[i]:
                fd = cached_fd[k]
                break
        if fd < 0:
            fd = OPEN(paths[path_starts[i]:].ctypes.data, _O_FLAGS)
            if fd < 0:
                continue
            if cached_start[victim] >= 0:
                CLOSE(cached_fd[victim])
            cached_start[victim] = path_starts[i]
            cached_fd[victim] = fd
            victim = (victim + 1) % FD_CACHE
        size = LSEEK(fd, 0, _SEEK_END) if lengths[i] < 0 else lengths[i]
        if size < 0:
            continue
        sizes[i] = size
        at = offsets[i]
        if size > limit:
            info[i, 0] = BIG
            continue
        if pos + size + ALIGN > buf.size:
            grown = np.empty(max(2 * buf.size, pos + size + ALIGN), np.uint8)
            grown[:pos] = buf[:pos]
            buf = grown
        got = np.int64(0)
        while got < size:
            n = PREAD(fd, buf[pos + got:].ctypes.data, size - got, at + got)
            if n <= 0:
                break
            got += n
        if got == size:
            parse_header(buf, pos, size, info[i])
        pos += (size + ALIGN - 1) // ALIGN * ALIGN
    for k in range(FD_CACHE):
        if cached_start[k] >= 0:
            CLOSE(cached_fd[k])
    return buf[:pos + ALIGN]


@numba.njit(nogil=True, cache=True)
def compare_batch(buf, info, ia, ib, rows):  # pragma: no cover - runs compiled
    """Kernel of every pair (info rows ia[p], ib[p]: same dtype code F4, F8 or I8 and numel), its partials in
    rows[p] (partials.FIELDS' order)."""
    f4 = buf.view(np.float32)
    f8 = buf.view(np.float64)
    i8 = buf.view(np.int64)
    for p in range(ia.size):
        code = info[ia[p], 1]
        n = info[ia[p], 2]
        oa = info[ia[p], 3]
        ob = info[ib[p], 3]
        if code == F4:
            t = compiled_float_kernel(f4[oa // 4:oa // 4 + n], f4[ob // 4:ob // 4 + n], 0, n)
        elif code == F8:
            t = compiled_float_kernel(f8[oa // 8:oa // 8 + n], f8[ob // 8:ob // 8 + n], 0, n)
        else:
            t = compiled_int_kernel(i8[oa // 8:oa // 8 + n], i8[ob // 8:ob // 8 + n], 0, n)
        for k in range(len(t)):
            rows[p, k] = t[k]

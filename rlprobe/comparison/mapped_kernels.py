"""The compiled half of rlprobe.comparison.small_pairs (numba, ``nogil``): many pairs of larger ``.npy`` files
compared in one call, each file opened, mapped with libc's ``mmap`` and compared chunk by chunk by the element
kernel of rlprobe.comparison.pair_kernels, then unmapped and closed: no Python and no GIL per pair.

A file is taken only where its header is written the way numpy writes it (batch_kernels' parser) and both
files of a pair hold the same kernel dtype (float32, float64, int64) and number of elements, at most `limit`;
anything else is marked ``SLOW`` (a file that cannot be opened, mapped or parsed too) for the per-pair path,
which names the problem, and a pair over `limit` elements ``BIG`` (the executor splits it between workers).
"""

from __future__ import annotations

import mmap
import os

import numba  # noqa: E402,I001  (pair_kernels set numba's cache dir before this import)
import numpy as np

from rlprobe.comparison.batch_kernels import parse_header
from rlprobe.comparison.pair_kernels import compiled_float_kernel, compiled_int_kernel
from rlprobe.comparison.partials import BIG, F4, F8, FIRST, I8, OK, SLOW
from rlprobe.lake.libc import CLOSE, LSEEK, MADVISE, MMAP, MUNMAP, OPEN, PREAD, pointer
from rlprobe.lake.regular_files import READ_FLAGS

__all__ = ["compare_mapped"]

_SEEK_END = os.SEEK_END
_O_FLAGS = READ_FLAGS  # O_NONBLOCK among them: a FIFO never blocks, it reads short (lake/regular_files.py)
_PROT_READ = mmap.PROT_READ
_MAP_SHARED = mmap.MAP_SHARED
_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)
_PAGE = mmap.PAGESIZE
_HEAD = 4096  # bytes read for the header (numpy pads a simple array's to 64 or 128)


@numba.njit(nogil=True, cache=True)
def _open_header(paths, start, at, length, head, out):  # pragma: no cover - runs compiled
    """Open the file whose NUL-terminated path starts at paths[start], parse the header of its .npy (the
    whole file, or with length >= 0 the record of `length` bytes at `at`, lake/tensor_pack.py) into out =
    (status, dtype code, numel, data offset in the record) as batch_kernels does; returns (fd, size of the
    record), fd -1 where it cannot be opened or sized or the record lies beyond the file (status SLOW)."""
    out[0] = SLOW
    fd = OPEN(paths[start:].ctypes.data, _O_FLAGS)
    if fd < 0:
        return -1, 0
    size = LSEEK(fd, 0, _SEEK_END)
    if length >= 0:
        if size < at + length:  # never map past the end (a truncated file: the per-pair path names it)
            CLOSE(fd)
            return -1, 0
        size = length
    got = PREAD(fd, head.ctypes.data, min(size, head.size), at) if size > 0 else 0
    if size < 0 or got < 12:
        CLOSE(fd)
        return -1, 0
    # the parser reads the header's own length (bytes 8-9, or 8-11 from version 2): only within what was read
    hlen = np.int64(head[8]) | (np.int64(head[9]) << 8)
    end = 10 + hlen
    if head[6] != 1:
        end = 12 + (hlen | (np.int64(head[10]) << 16) | (np.int64(head[11]) << 24))
    if end <= got:
        parse_header(head, 0, size, out)
    return fd, size


@numba.njit(nogil=True, cache=True)
def _drop_pages(view, start, stop):  # pragma: no cover - runs compiled
    """madvise(DONTNEED) the mapped pages of view's bytes [start, stop) (from the page holding `start` on)."""
    lo = view.ctypes.data + start
    lo -= lo % _PAGE
    MADVISE(pointer(lo), view.ctypes.data + stop - lo, _DONTNEED)


@numba.njit(nogil=True, cache=True)
def _compare_pair(xa, xb, code, n, chunk, whole, rows, row):  # pragma: no cover - runs compiled
    """The partials of one mapped pair (its data bytes `xa`, `xb`), a row a chunk from `row` on (chunks aligned
    to multiples of `chunk`, as the per-pair path cuts them, each compared as that path compares it, its first
    mismatch in the pair's flat index); the pages of each chunk dropped once compared unless the pair is one
    chunk (`whole`: munmap drops them)."""
    k = 0
    item = 4 if code == F4 else 8
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        if code == F4:
            t = compiled_float_kernel(xa.view(np.float32)[s:e], xb.view(np.float32)[s:e], 0, e - s)
        elif code == F8:
            t = compiled_float_kernel(xa.view(np.float64)[s:e], xb.view(np.float64)[s:e], 0, e - s)
        else:
            t = compiled_int_kernel(xa.view(np.int64)[s:e], xb.view(np.int64)[s:e], 0, e - s)
        r = row + k
        for f in range(len(t)):
            rows[r, f] = t[f]
        if rows[r, FIRST] >= 0:
            rows[r, FIRST] += s
        k += 1
        if not whole:
            _drop_pages(xa, s * item, e * item)
            _drop_pages(xb, s * item, e * item)
    return k


@numba.njit(nogil=True, cache=True)
def compare_mapped(paths, path_starts, offsets, lengths, limit, chunk, info, first_row, rows):  # pragma: no cover
    """Pair p: files path_starts[p] (a) and path_starts[n + p] (b) (records of `lengths` bytes at `offsets`
    where lengths >= 0, else whole files), its partials in rows first_row[p] .. first_row[p + 1] - 1 of `rows`
    (partials.FIELDS' order); info[p] = (status, dtype code, numel, chunks)."""
    n = first_row.size - 1
    head = np.empty(_HEAD, np.uint8)
    side = np.zeros(4, np.int64)
    for p in range(n):
        info[p, 0] = SLOW
        fa, size_a = _open_header(paths, path_starts[p], offsets[p], lengths[p], head, info[p])
        fb, size_b = _open_header(paths, path_starts[n + p], offsets[n + p], lengths[n + p], head, side)
        code, numel = info[p, 1], info[p, 2]
        # a record is mapped from the page holding its start: its data lies `skip` bytes further in the map
        skip_a, skip_b = offsets[p] % _PAGE, offsets[n + p] % _PAGE
        data_a, data_b = info[p, 3] + skip_a, side[3] + skip_b
        size_a, size_b = size_a + skip_a, size_b + skip_b
        if info[p, 0] == OK and side[0] == OK and side[1] == code and side[2] == numel and numel > 0 \
                and (code == F4 or code == F8 or code == I8):
            item = 4 if code == F4 else 8
            chunks = (numel + chunk - 1) // chunk
            if numel > limit:
                info[p, 0] = BIG
            elif chunks > first_row[p + 1] - first_row[p]:
                info[p, 0] = SLOW
            else:
                ma = MMAP(0, size_a, _PROT_READ, _MAP_SHARED, fa, offsets[p] - skip_a)
                mb = MMAP(0, size_b, _PROT_READ, _MAP_SHARED, fb, offsets[n + p] - skip_b)
                if ma != -1 and mb != -1:
                    va = numba.carray(pointer(ma), size_a)[data_a:data_a + numel * item]
                    vb = numba.carray(pointer(mb), size_b)[data_b:data_b + numel * item]
                    info[p, 3] = _compare_pair(va, vb, code, numel, chunk, chunks == 1, rows, first_row[p])
                else:
                    info[p, 0] = SLOW
                if ma != -1:
                    MUNMAP(pointer(ma), size_a)
                if mb != -1:
                    MUNMAP(pointer(mb), size_b)
        elif info[p, 0] == OK:
            info[p, 0] = SLOW  # another dtype, a mixed pair or a size mismatch: the per-pair path
        if fa >= 0:
            CLOSE(fa)
        if fb >= 0:
            CLOSE(fb)

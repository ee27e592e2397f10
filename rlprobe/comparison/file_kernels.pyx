"""The compiled halves of rlprobe.comparison.small_pairs, without the GIL: read_files reads many small ``.npy``
files (or records of packed files, lake/tensor_pack.py) into one buffer with POSIX open/pread/close and parses
their headers; compare_batch runs the element kernel (kernels.pxd) over every pair in that buffer; compare_mapped
maps each pair of larger files and compares them chunk by chunk. No Python and no GIL per file.

A header is taken only when it is written the way numpy writes it (``{'descr': '<f4', 'fortran_order': False,
'shape': (4, 64), }``, spaces, newline) with a three-character descr of a bool, integer or float dtype that is
native here; anything else (a file that cannot be opened, read or mapped too) is marked SLOW for the per-pair
path, which names the file and the problem.
"""

import mmap

import numpy as np

from libc.stdint cimport int64_t, uint8_t
from posix.fcntl cimport open as c_open
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, mmap as c_mmap, munmap
from posix.unistd cimport SEEK_END, close, lseek, pread

from rlprobe.comparison.kernels cimport partials

from rlprobe.comparison.partials import ALIGN, BIG, F4, F8, FIRST, I8, OK, SLOW, WIDTH
from rlprobe.lake.regular_files import READ_FLAGS

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void *addr, size_t length, int advice)
    int MADV_DONTNEED

__all__ = ["FD_CACHE", "compare_batch", "compare_mapped", "read_files"]

FD_CACHE = 16  # descriptors read_files keeps open at once (a batch's packed files: a few per rank)
cdef enum:
    _FD_CACHE = 16
    _HEAD = 4096  # bytes compare_mapped reads for a header (numpy pads a simple array's to 64 or 128)

cdef int _FLAGS = READ_FLAGS  # O_NONBLOCK among them: a FIFO never blocks, it reads short (lake/regular_files.py)
cdef int64_t _OK = OK, _SLOW = SLOW, _BIG = BIG, _F4 = F4, _F8 = F8, _I8 = I8, _ALIGN = ALIGN
cdef int64_t _PAGE = mmap.PAGESIZE
cdef bint _LITTLE = np.dtype("<f4").isnative  # '<' descrs are native only on little-endian machines
assert WIDTH == 11 and FIRST == 2


cdef inline int64_t _expect(const uint8_t *buf, int64_t pos, int64_t end, const char *text, int64_t size) noexcept nogil:
    """Position after `text` if the bytes at `pos` are `text`, else -1."""
    cdef int64_t i
    if pos + size > end:
        return -1
    for i in range(size):
        if buf[pos + i] != <uint8_t>text[i]:
            return -1
    return pos + size


cdef void _parse_header(const uint8_t *buf, int64_t size, int64_t *out) noexcept nogil:
    """out = (status, dtype code, numel, data offset) for the .npy file whose `size` bytes start at buf."""
    cdef int64_t h0, hlen, end, p, item, code, numel, dim, digits
    cdef uint8_t order, kind
    out[0] = _SLOW
    if size < 10 or _expect(buf, 0, 6, b"\x93NUMPY", 6) < 0:
        return
    if buf[6] == 1:
        h0 = 10
        hlen = <int64_t>buf[8] | (<int64_t>buf[9] << 8)
    elif (buf[6] == 2 or buf[6] == 3) and size >= 12:
        h0 = 12
        hlen = <int64_t>buf[8] | (<int64_t>buf[9] << 8) | (<int64_t>buf[10] << 16) | (<int64_t>buf[11] << 24)
    else:
        return
    end = h0 + hlen
    if end > size:
        return
    p = _expect(buf, h0, end, b"{'descr': '", 11)
    if p < 0 or p + 4 > end or buf[p + 3] != 39:  # a three-character descr and its closing quote
        return
    order, kind, item = buf[p], buf[p + 1], buf[p + 2] - 48
    if not (item == 1 or item == 2 or item == 4 or item == 8):
        return
    if not ((order == 124 and item == 1) or (order == 60 and _LITTLE)):  # '|' or '<'
        return
    if kind == 98 and item == 1:  # b1
        code = 1
    elif kind == 105 or kind == 117:  # i, u
        code = (1 if kind == 105 else 2) * 16 + item
    elif kind == 102 and item != 1:  # f2, f4, f8
        code = 3 * 16 + item
    else:
        return
    p = _expect(buf, p + 3, end, b"', 'fortran_order': False, 'shape': (", 37)
    if p < 0:
        return
    numel = 1
    while p < end and buf[p] != 41:  # up to ')'
        while p < end and buf[p] == 32:
            p += 1
        dim = 0
        digits = 0
        while p < end and 48 <= buf[p] <= 57 and digits < 13:
            dim = dim * 10 + (buf[p] - 48)
            p += 1
            digits += 1
        if digits == 0 or digits == 13 or p >= end:
            return
        numel *= dim
        if numel > (<int64_t>1 << 40):
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
    if end + numel * item > size or end % item != 0:
        return
    out[0] = _OK
    out[1] = code
    out[2] = numel
    out[3] = end


def read_files(const uint8_t[::1] paths, const int64_t[::1] path_starts, const int64_t[::1] offsets,
               const int64_t[::1] lengths, int64_t limit, int64_t[:, ::1] info, int64_t[::1] sizes):
    """Read file i (NUL-terminated path at paths[path_starts[i]:]) whole into the returned buffer, or the
    `lengths[i]` bytes at `offsets[i]` where lengths[i] >= 0 (a record of a packed file), at a multiple of ALIGN,
    when it has at most `limit` bytes (else status BIG), and parse its header into info[i]; sizes[i] is its size
    (-1: it could not be opened or sized). Files given by the same path start (small_pairs.path_bytes stores a
    path once) are opened once while they stay among the last FD_CACHE files opened."""
    cdef Py_ssize_t n = path_starts.shape[0]
    if info.shape[0] < n or info.shape[1] < 4 or sizes.shape[0] < n or offsets.shape[0] < n or lengths.shape[0] < n:
        raise ValueError(f"read_files: info, sizes, offsets and lengths must have a row for each of the {n} files")
    buf = np.empty(1 << 16, np.uint8)
    cdef uint8_t[::1] view = buf
    cdef int64_t pos = 0, size, got, r, at
    cdef int64_t cached_start[_FD_CACHE]
    cdef int cached_fd[_FD_CACHE]
    cdef int fd, victim = 0, k
    cdef Py_ssize_t i
    for k in range(_FD_CACHE):
        cached_start[k] = -1
        cached_fd[k] = -1
    with nogil:
        for i in range(n):
            info[i, 0] = _SLOW
            sizes[i] = -1
            fd = -1
            for k in range(_FD_CACHE):
                if cached_start[k] == path_starts[i]:
                    fd = cached_fd[k]
                    break
            if fd < 0:
                fd = c_open(<const char *>&paths[path_starts[i]], _FLAGS)
                if fd < 0:
                    continue
                if cached_start[victim] >= 0:
                    close(cached_fd[victim])
                cached_start[victim] = path_starts[i]
                cached_fd[victim] = fd
                victim = (victim + 1) % _FD_CACHE
            size = lseek(fd, 0, SEEK_END) if lengths[i] < 0 else lengths[i]
            if size < 0:
                continue
            sizes[i] = size
            if size > limit:
                info[i, 0] = _BIG
                continue
            if pos + size + _ALIGN > view.shape[0]:
                with gil:
                    grown = np.empty(max(2 * view.shape[0], pos + size + _ALIGN), np.uint8)
                    grown[:pos] = buf[:pos]
                    buf = grown
                    view = buf
            at = offsets[i]
            got = 0
            while got < size:
                r = pread(fd, &view[pos + got], size - got, at + got)
                if r <= 0:
                    break
                got += r
            if got == size:
                _parse_header(&view[pos], size, &info[i, 0])
                if info[i, 0] == _OK:
                    info[i, 3] += pos
            pos += (size + _ALIGN - 1) // _ALIGN * _ALIGN
        for k in range(_FD_CACHE):
            if cached_start[k] >= 0:
                close(cached_fd[k])
    return buf[:pos + _ALIGN]


def compare_batch(const uint8_t[::1] buf, const int64_t[:, ::1] info, const int64_t[::1] ia, const int64_t[::1] ib,
                  double[:, ::1] rows):
    """Kernel of every pair (info rows ia[p], ib[p], as read_files left them: same dtype code F4, F8 or I8 and
    numel), its partials in rows[p] (partials.FIELDS' order)."""
    cdef Py_ssize_t p, n = ia.shape[0]
    cdef int64_t oa, ob, numel, item
    if ib.shape[0] != n or rows.shape[0] < n or rows.shape[1] < 11:
        raise ValueError(f"compare_batch: ib and rows must have {n} pairs (rows of 11 partials)")
    for p in range(n):  # checked here, with the GIL: a kernel never reads past the buffer
        numel, item = info[ia[p], 2], 4 if info[ia[p], 1] == _F4 else 8
        if info[ia[p], 1] not in (_F4, _F8, _I8) or info[ib[p], 1] != info[ia[p], 1] or info[ib[p], 2] != numel \
                or max(info[ia[p], 3], info[ib[p], 3]) + numel * item > buf.shape[0]:
            raise ValueError(f"compare_batch: pair {p} (files {ia[p]} and {ib[p]}) is not two arrays of one kernel "
                             f"dtype and size in the buffer")
    with nogil:
        for p in range(n):
            oa, ob = info[ia[p], 3], info[ib[p], 3]
            partials(<int>info[ia[p], 1], &buf[oa] if oa < buf.shape[0] else NULL,
                     &buf[ob] if ob < buf.shape[0] else NULL, info[ia[p], 2], &rows[p, 0])


cdef int _open_header(const uint8_t[::1] paths, int64_t start, int64_t at, int64_t length, uint8_t *head,
                      int64_t *out, int64_t *size) noexcept nogil:
    """Open the file whose path starts at paths[start] and parse the header of its .npy (the whole file, or with
    length >= 0 the record of `length` bytes at `at`) into out = (status, dtype code, numel, data offset in the
    record); returns the descriptor and sets `size` (the record's), -1 where it cannot be opened or sized or the
    record lies beyond the file (status SLOW)."""
    cdef int64_t got, end
    out[0] = _SLOW
    size[0] = 0
    cdef int fd = c_open(<const char *>&paths[start], _FLAGS)
    if fd < 0:
        return -1
    cdef int64_t total = lseek(fd, 0, SEEK_END)
    if length >= 0:
        if total < at + length:  # never map past the end (a truncated file: the per-pair path names it)
            close(fd)
            return -1
        total = length
    got = pread(fd, head, min(total, _HEAD), at) if total > 0 else 0
    if total < 0 or got < 12:
        close(fd)
        return -1
    size[0] = total
    end = 10 + (<int64_t>head[8] | (<int64_t>head[9] << 8))  # the header's own length, within what was read
    if head[6] != 1:
        end = 12 + (<int64_t>head[8] | (<int64_t>head[9] << 8) | (<int64_t>head[10] << 16)
                    | (<int64_t>head[11] << 24))
    if end <= got:
        _parse_header(head, total, out)
    return fd


cdef inline void _drop_pages(const uint8_t *base, int64_t start, int64_t stop) noexcept nogil:
    """madvise(DONTNEED) the mapped pages of base's bytes [start, stop) (from the page holding `start` on)."""
    cdef size_t lo = <size_t>base + start
    lo -= lo % _PAGE
    madvise(<void *>lo, <size_t>base + stop - lo, MADV_DONTNEED)


cdef int64_t _compare_pair(const uint8_t *xa, const uint8_t *xb, int code, int64_t n, int64_t chunk, bint whole,
                           double[:, ::1] rows, int64_t row) noexcept nogil:
    """The partials of one mapped pair (its data bytes at xa, xb), a row a chunk from `row` on (chunks at multiples
    of `chunk`, as the per-pair path cuts them, its first mismatch in the pair's flat index); the pages of each
    chunk dropped once compared unless the pair is one chunk (`whole`: munmap drops them). Returns the chunks."""
    cdef int64_t k = 0, s = 0, e, item = 4 if code == _F4 else 8
    while s < n:
        e = min(n, s + chunk)
        partials(code, xa + s * item, xb + s * item, e - s, &rows[row + k, 0])
        if rows[row + k, 2] >= 0:
            rows[row + k, 2] += s
        k += 1
        if not whole:
            _drop_pages(xa, s * item, e * item)
            _drop_pages(xb, s * item, e * item)
        s = e
    return k


def compare_mapped(const uint8_t[::1] paths, const int64_t[::1] path_starts, const int64_t[::1] offsets,
                   const int64_t[::1] lengths, int64_t limit, int64_t chunk, int64_t[:, ::1] info,
                   const int64_t[::1] first_row, double[:, ::1] rows):
    """Pair p: files path_starts[p] (a) and path_starts[n + p] (b) (records of `lengths` bytes at `offsets` where
    lengths >= 0, else whole files), its partials in rows first_row[p] .. first_row[p + 1] - 1 (partials.FIELDS'
    order); info[p] = (status, dtype code, numel, chunks): OK, SLOW (the per-pair path names the problem) or BIG
    (over `limit` elements: the executor splits it)."""
    cdef Py_ssize_t p, n = first_row.shape[0] - 1
    if n < 0 or path_starts.shape[0] < 2 * n or offsets.shape[0] < 2 * n or lengths.shape[0] < 2 * n \
            or info.shape[0] < n or info.shape[1] < 4 or chunk < 1 or rows.shape[1] < 11 \
            or (n > 0 and (first_row[n] > rows.shape[0] or first_row[0] < 0)):
        raise ValueError("compare_mapped: path_starts, offsets and lengths need 2n entries, info n rows, rows "
                         "first_row[n] rows of 11, chunk >= 1")
    cdef uint8_t head[_HEAD]
    cdef int64_t side[4]
    cdef int64_t size_a, size_b, skip_a, skip_b, data_a, data_b, code, numel, item, chunks
    cdef int fa, fb
    cdef void *ma
    cdef void *mb
    with nogil:
        for p in range(n):
            info[p, 0] = _SLOW
            fa = _open_header(paths, path_starts[p], offsets[p], lengths[p], head, &info[p, 0], &size_a)
            fb = _open_header(paths, path_starts[n + p], offsets[n + p], lengths[n + p], head, side, &size_b)
            code, numel = info[p, 1], info[p, 2]
            # a record is mapped from the page holding its start: its data lies `skip` bytes further in the map
            skip_a, skip_b = offsets[p] % _PAGE, offsets[n + p] % _PAGE
            data_a, data_b = info[p, 3] + skip_a, side[3] + skip_b
            size_a, size_b = size_a + skip_a, size_b + skip_b
            if info[p, 0] == _OK and side[0] == _OK and side[1] == code and side[2] == numel and numel > 0 \
                    and (code == _F4 or code == _F8 or code == _I8):
                item = 4 if code == _F4 else 8
                chunks = (numel + chunk - 1) // chunk
                if numel > limit:
                    info[p, 0] = _BIG
                elif chunks > first_row[p + 1] - first_row[p]:
                    info[p, 0] = _SLOW
                else:
                    ma = c_mmap(NULL, size_a, PROT_READ, MAP_SHARED, fa, offsets[p] - skip_a)
                    mb = c_mmap(NULL, size_b, PROT_READ, MAP_SHARED, fb, offsets[n + p] - skip_b)
                    if ma != MAP_FAILED and mb != MAP_FAILED:
                        info[p, 3] = _compare_pair(<const uint8_t *>ma + data_a, <const uint8_t *>mb + data_b,
                                                   <int>code, numel, chunk, chunks == 1, rows, first_row[p])
                    else:
                        info[p, 0] = _SLOW
                    if ma != MAP_FAILED:
                        munmap(ma, size_a)
                    if mb != MAP_FAILED:
                        munmap(mb, size_b)
            elif info[p, 0] == _OK:
                info[p, 0] = _SLOW  # another dtype, a mixed pair or a size mismatch: the per-pair path
            if fa >= 0:
                close(fa)
            if fb >= 0:
                close(fb)

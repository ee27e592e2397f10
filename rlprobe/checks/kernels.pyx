"""The compiled token kernels of the checks (C in token_loops.h, built at install by hatch_build.py):
reduce_rows reduces rows of a log-prob pair to the figures of token_figures.py (its docstring says which),
reduce_maxima to the counted tokens and max |Δ| only (token_maxima.py), and reduce_batch reads a pool job's many
small pairs (token_batch.py) and reduces them in one call. Every call releases the GIL. compiled.reduce_pair is
reduce_rows' Python face."""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release, PyObject_GetBuffer
from libc.math cimport ceil
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset
from posix.unistd cimport close, pread

from rlprobe.checks.token_figures import BLOCK_BITS, N_POSITIONS, N_PROBABILITY
from rlprobe.lake.npy_header import DESCR_AT

cdef extern from "fcntl.h" nogil:
    int openat(int directory, const char *path, int flags)

cdef extern from "token_loops.h" nogil:
    enum:
        TOKEN_POSITIONS, TOKEN_PROBABILITY, TOKEN_BLOCK_BITS
    ctypedef struct token_figures:
        double lo, hi
        const int8_t *prob_of
        const double *thr
        double *sums
        int64_t *hist
        uint8_t *touched
        int64_t *pos_count
        double *pos_sum
        double *pos_max
        int64_t *prob_count
        double *prob_sum
        double *seq_sum
        int64_t *seq_n
        uint16_t *bins
        double *magnitude
    ctypedef struct token_isa:
        const char *name
        void (*rows_f32)(const void *, const void *, const uint8_t *, int64_t, int64_t, const token_figures *) noexcept nogil
        void (*rows_f64)(const void *, const void *, const uint8_t *, int64_t, int64_t, const token_figures *) noexcept nogil
        void (*maxima_f32)(const void *, const void *, const uint8_t *, int64_t, int64_t *) noexcept nogil
        void (*maxima_f64)(const void *, const void *, const uint8_t *, int64_t, int64_t *) noexcept nogil
    const token_isa TOKEN_ISAS[]
    const token_isa *token_kernels
    int token_use_isa(int level)

if (TOKEN_POSITIONS, TOKEN_PROBABILITY, TOKEN_BLOCK_BITS) != (N_POSITIONS, N_PROBABILITY, BLOCK_BITS):
    raise ImportError("rlprobe/checks/token_loops.h disagrees with token_figures.py: edit it and rebuild "
                      "(python hatch_build.py rlprobe/checks/kernels.pyx)")
cdef Py_ssize_t _DESCR_AT = DESCR_AT
token_use_isa(-1)


def use_isa(level: int = -1) -> str:
    """Run the kernels on an instruction set: TOKEN_ISAS[level] (0: the compiler's default, on x86-64 SSE2; 1:
    AVX2; 2: AVX-512), -1: the widest this CPU runs (as at import). The same bits at each. Returns its name."""
    if token_use_isa(level) < 0:
        raise ValueError(f"this CPU does not run instruction set {level} of rlprobe's token kernels")
    return token_kernels.name.decode()


cdef bint _open(a, b, Py_buffer *va, Py_buffer *vb) except -1:
    """The buffers of C-contiguous a and b, both float32 (True) or both float64 (False); released by the caller."""
    PyObject_GetBuffer(a, va, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    try:
        PyObject_GetBuffer(b, vb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    except BaseException:
        PyBuffer_Release(va)
        raise
    if va.format[0] == vb.format[0] and va.format[1] == 0 and vb.format[1] == 0 and va.format[0] in b"fd":
        return va.format[0] == b"f"
    PyBuffer_Release(va)
    PyBuffer_Release(vb)
    raise ValueError(f"rlprobe's token kernels take a and b both float32 or both float64, not {a.dtype}, {b.dtype}")


cdef token_figures _figures(double lo, double hi, const int8_t[::1] prob_of, const double[::1] thr,
                            int64_t[::1] hist, uint8_t[::1] touched):
    cdef token_figures f
    memset(&f, 0, sizeof(f))
    f.lo, f.hi, f.prob_of, f.thr, f.hist = lo, hi, &prob_of[0], &thr[0], &hist[0]
    f.touched = NULL if touched is None else &touched[0]
    return f


def reduce_rows(a, b, const uint8_t[:, ::1] mask, double lo, double hi, const int8_t[::1] prob_of,
                const double[::1] thr, double[::1] sums, int64_t[::1] hist, uint8_t[::1] touched,
                int64_t[::1] pos_count, double[::1] pos_sum, double[::1] pos_max, int64_t[::1] prob_count,
                double[::1] prob_sum, double[::1] seq_sum, int64_t[::1] seq_n) -> None:
    """The figures of (rows, tokens) arrays a, b (both float32 or both float64, C-contiguous) and a uint8 mask of
    their shape added into these (seq_sum, seq_n: written, a row each); touched: None, or the histogram's blocks
    of 2^BLOCK_BITS bins, each marked 1 where a token fell into it (token_batch.py takes a key's filled bins from
    those only)."""
    cdef Py_buffer va, vb
    cdef bint single = _open(a, b, &va, &vb)
    cdef Py_ssize_t rows = mask.shape[0], width = mask.shape[1]
    try:
        if va.ndim != 2 or vb.ndim != 2 or va.shape[0] != rows or va.shape[1] != width or vb.shape[0] != rows \
                or vb.shape[1] != width or seq_sum.shape[0] < rows or seq_n.shape[0] < rows:
            raise ValueError(f"reduce_rows: shapes differ: a {a.shape}, b {b.shape}, mask {(rows, width)}, "
                             f"{seq_sum.shape[0]} row sums")
        if sums.shape[0] < 7 or hist.shape[0] < 1 << 15 or min(pos_count.shape[0], pos_sum.shape[0], pos_max.shape[0]) \
                < TOKEN_POSITIONS or min(prob_count.shape[0], prob_sum.shape[0]) < TOKEN_PROBABILITY \
                or prob_of.shape[0] < 1 << 15 or thr.shape[0] < 9:
            raise ValueError("reduce_rows: figures of other sizes than token_figures.PairFigures'")
        _rows(single, va.buf, vb.buf, mask, lo, hi, prob_of, thr, sums, hist, touched, pos_count, pos_sum, pos_max,
              prob_count, prob_sum, seq_sum, seq_n)
    finally:
        PyBuffer_Release(&va)
        PyBuffer_Release(&vb)


cdef _rows(bint single, const void *pa, const void *pb, const uint8_t[:, ::1] mask, double lo, double hi,
           const int8_t[::1] prob_of, const double[::1] thr, double[::1] sums, int64_t[::1] hist, uint8_t[::1] touched,
           int64_t[::1] pos_count, double[::1] pos_sum, double[::1] pos_max, int64_t[::1] prob_count,
           double[::1] prob_sum, double[::1] seq_sum, int64_t[::1] seq_n):
    cdef Py_ssize_t rows = mask.shape[0], width = mask.shape[1]
    cdef token_figures f = _figures(lo, hi, prob_of, thr, hist, touched)
    f.sums, f.pos_count, f.pos_sum, f.pos_max = &sums[0], &pos_count[0], &pos_sum[0], &pos_max[0]
    f.prob_count, f.prob_sum, f.seq_sum, f.seq_n = &prob_count[0], &prob_sum[0], &seq_sum[0], &seq_n[0]
    f.bins = <uint16_t *> malloc(width * (sizeof(uint16_t) + sizeof(double)) + 8)
    if f.bins == NULL:
        raise MemoryError()
    f.magnitude = <double *> (f.bins + width + (-width & 3))  # 8-byte aligned
    with nogil:
        (token_kernels.rows_f32 if single else token_kernels.rows_f64)(pa, pb, &mask[0, 0], rows, width, &f)
    free(f.bins)


def reduce_maxima(a, b, const uint8_t[::1] mask, int64_t[::1] out) -> None:
    """Of reduce_rows' figures only the counted tokens (out[0] +=), max |Δ| (out[1], the bits of a float64) and the
    masked tokens whose Δ is not finite (out[2] +=), by the same rules, over flat arrays of equal size (a and b
    both float32 or both float64)."""
    cdef Py_buffer va, vb
    cdef bint single = _open(a, b, &va, &vb)
    cdef Py_ssize_t n = mask.shape[0]
    try:
        if va.len != vb.len or va.len != n * va.itemsize or out.shape[0] < 3:
            raise ValueError(f"reduce_maxima: sizes differ: {a.size}, {b.size}, mask {n}")
        with nogil:
            (token_kernels.maxima_f32 if single else token_kernels.maxima_f64)(va.buf, vb.buf, &mask[0], n, &out[0])
    finally:
        PyBuffer_Release(&va)
        PyBuffer_Release(&vb)


cdef bint _read_npy(int directory, int flags, const uint8_t *path, int64_t offset, const uint8_t *header,
                    int64_t size, const uint8_t *descrs, Py_ssize_t n_descrs, uint8_t *buffer,
                    int64_t nbytes) noexcept nogil:
    """The file at `path` (NUL-terminated, relative to the open `directory`) from byte `offset` on (a record of a
    packed file, lake/tensor_pack.py; 0: a whole .npy) into buffer[:size + nbytes]: openat, one pread, close.
    True where it holds that many bytes and starts with `header` (the one numpy writes for the index's shape:
    lake/npy_header.header_bytes) save for the dtype, one of `descrs` ([k, 3] bytes); False (or the file cannot
    be opened): the caller has numpy read it, which reads it or says why not."""
    cdef int fd = openat(directory, <const char *> path, flags)
    if fd < 0:
        return False
    cdef int64_t got = pread(fd, buffer, size + nbytes, offset)
    close(fd)
    if got != size + nbytes:
        return False
    cdef int64_t i
    for i in range(size):
        if buffer[i] != header[i] and not _DESCR_AT <= i < _DESCR_AT + 3:
            return False
    for i in range(n_descrs):
        if buffer[_DESCR_AT] == descrs[3 * i] and buffer[_DESCR_AT + 1] == descrs[3 * i + 1] \
                and buffer[_DESCR_AT + 2] == descrs[3 * i + 2]:
            return True
    return False


def reduce_batch(const int32_t[::1] folders, int flags, const uint8_t[::1] paths, const int64_t[:, ::1] parts,
                 const uint8_t[:, ::1] headers, const int64_t[::1] header_sizes, const float[::1] pre_a,
                 const float[::1] pre_b, const uint8_t[::1] pre_m, int64_t start, int64_t used, double lo, double hi,
                 const int8_t[::1] prob_of, const double[::1] thr, const double[::1] qs, const uint8_t[:, ::1] float32,
                 const uint8_t[:, ::1] mask_bytes, double[:, ::1] part_sums, int64_t[::1] hist, uint8_t[::1] touched,
                 int merge, const double[::1] table_lo, const double[::1] table_hi, double[:, ::1] sums,
                 int64_t[:, ::1] pos_count, double[:, ::1] pos_sum, double[:, ::1] pos_max,
                 int64_t[:, ::1] prob_count, double[:, ::1] prob_sum, double[::1] seq_sum, int64_t[::1] seq_n,
                 int64_t[::1] counts, double[::1] hist_lo, double[::1] hist_hi, int64_t[::1] ends,
                 int64_t[:, ::1] quantile_bins) -> tuple[int, int]:
    """From part `start` on (token_batch._Plan.parts), each read (its files, or pre_*[at:] where preloaded) and
    reduced by reduce_rows into its key's figures as reduce_pair adds a key's parts; after a key's last part its
    quantile bins and its histogram rows (2^merge fine bins summed, table_lo/hi their edges) into counts, hist_lo,
    hist_hi from row `used` on, the histogram zeroed again. (The part it could not read, or len(parts); the table
    rows written so far.)"""
    cdef Py_ssize_t count = parts.shape[0], p = start, i, block, row, bin_
    cdef int64_t most = 1, head = 0, widest = 1, k, rows, width, n, at, size, mask_size, tokens
    if qs.shape[0] > 16:
        raise ValueError(f"reduce_batch: {qs.shape[0]} quantiles, at most 16")
    cdef token_figures f = _figures(lo, hi, prob_of, thr, hist, touched)
    for p in range(start, count):
        most = max(most, parts[p, 1] * parts[p, 2])
        widest = max(widest, parts[p, 2])
    for p in range(header_sizes.shape[0]):
        head = max(head, header_sizes[p])
    cdef uint8_t *buf_a = <uint8_t *> malloc(head + 4 * most)
    cdef uint8_t *buf_b = <uint8_t *> malloc(head + 4 * most)
    cdef uint8_t *buf_m = <uint8_t *> malloc(head + most)
    f.bins = <uint16_t *> malloc(widest * (sizeof(uint16_t) + sizeof(double)) + 8)
    f.magnitude = <double *> (f.bins + widest + (-widest & 3))
    cdef const uint8_t *f32 = &float32[0, 0]
    cdef const uint8_t *masks = &mask_bytes[0, 0]
    cdef Py_ssize_t n_f32 = float32.shape[0], n_masks = mask_bytes.shape[0]
    cdef const void *a
    cdef const void *b
    cdef const uint8_t *m
    try:
        if buf_a == NULL or buf_b == NULL or buf_m == NULL or f.bins == NULL:
            raise MemoryError()
        with nogil:
            for p in range(start, count):
                k, rows, width, at = parts[p, 0], parts[p, 1], parts[p, 2], parts[p, 4]
                n = rows * width
                if at >= 0:
                    a, b, m = &pre_a[at], &pre_b[at], &pre_m[at]
                else:
                    size = header_sizes[parts[p, 8]]
                    if not (_read_npy(folders[parts[p, 10]], flags, &paths[parts[p, 5]], parts[p, 13],
                                      &headers[parts[p, 8], 0], size, f32, n_f32, buf_a, 4 * n)
                            and _read_npy(folders[parts[p, 11]], flags, &paths[parts[p, 6]], parts[p, 14],
                                          &headers[parts[p, 8], 0], size, f32, n_f32, buf_b, 4 * n)):
                        break
                    a, b, m = buf_a + size, buf_b + size, buf_m
                    if parts[p, 7] < 0:
                        for i in range(n):
                            buf_m[i] = 1
                    else:
                        mask_size = header_sizes[parts[p, 9]]
                        if not _read_npy(folders[parts[p, 12]], flags, &paths[parts[p, 7]], parts[p, 15],
                                         &headers[parts[p, 9], 0], mask_size, masks, n_masks, buf_m, n):
                            break
                        m = buf_m + mask_size
                f.sums, f.pos_count, f.pos_sum, f.pos_max = &part_sums[p, 0], &pos_count[k, 0], &pos_sum[k, 0], \
                    &pos_max[k, 0]
                f.prob_count, f.prob_sum, f.seq_sum, f.seq_n = &prob_count[k, 0], &prob_sum[k, 0], \
                    &seq_sum[parts[p, 3]], &seq_n[parts[p, 3]]
                token_kernels.rows_f32(a, b, m, rows, width, &f)
                for i in range(7):  # as reduce_pair adds a pair's sums to its PairFigures
                    if i == 4:
                        sums[k, 4] = max(sums[k, 4], part_sums[p, 4])
                    else:
                        sums[k, i] += part_sums[p, i]
                if p + 1 < count and parts[p + 1, 0] == k:
                    continue
                _quantile_bins(&hist[0], &touched[0], touched.shape[0], <int64_t> sums[k, 0], &qs[0], qs.shape[0],
                               &quantile_bins[k, 0])
                for block in range(touched.shape[0]):  # the key's filled bins in bin order (Δ >= 0, then Δ < 0)
                    if touched[block] == 0:
                        continue
                    touched[block] = 0
                    for row in range((block << TOKEN_BLOCK_BITS) >> merge, ((block + 1) << TOKEN_BLOCK_BITS) >> merge):
                        tokens = 0  # a table row's 2^merge bins lie in one block (merge <= BLOCK_BITS)
                        for bin_ in range(row << merge, (row + 1) << merge):
                            tokens += hist[bin_]
                            hist[bin_] = 0
                        if tokens != 0:
                            counts[used], hist_lo[used], hist_hi[used] = tokens, table_lo[row], table_hi[row]
                            used += 1
                ends[k] = used
            else:
                p = count
        return p, used
    finally:
        free(buf_a)
        free(buf_b)
        free(buf_m)
        free(f.bins)


cdef void _quantile_bins(const int64_t *hist, const uint8_t *touched, Py_ssize_t n_blocks, int64_t total,
                         const double *qs, Py_ssize_t n_qs, int64_t *found) noexcept nogil:
    """The |Δ| bin of each quantile: the first whose cumulative count reaches max(1, ⌈q · total⌉), the |Δ| bins
    summed from the Δ >= 0 and Δ < 0 ones (as PairFigures.quantiles); total: the histogram's count. Block by
    block of |Δ| (a Δ >= 0 block and its Δ < 0 twin), whole blocks added up, bin by bin only in the block that
    reaches a quantile, none after the last (bin by bin with a compare per quantile took ~6 % of `many`'s CPU)."""
    cdef Py_ssize_t width = 1 << TOKEN_BLOCK_BITS, blocks = n_blocks // 2, half = blocks * width
    cdef Py_ssize_t q, i, block, left = 0
    cdef int64_t seen = 0, inside, lowest
    cdef int64_t need[16]  # token_rows.QUANTILES: fewer
    for q in range(n_qs):
        need[q] = max(1, <int64_t> ceil(qs[q] * total))
        left += found[q] < 0
    for block in range(blocks):
        if left == 0:
            break
        if touched[block] == 0 and touched[block + blocks] == 0:
            continue
        inside = 0
        for i in range(block * width, (block + 1) * width):
            inside += hist[i] + hist[half + i]
        lowest = total + 1
        for q in range(n_qs):
            if found[q] < 0:
                lowest = min(lowest, need[q])
        if seen + inside < lowest:
            seen += inside
            continue
        for i in range(block * width, (block + 1) * width):
            seen += hist[i] + hist[half + i]
            for q in range(n_qs):
                if found[q] < 0 and seen >= need[q]:
                    found[q] = i
                    left -= 1

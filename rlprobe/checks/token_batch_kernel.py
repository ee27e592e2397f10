"""The compiled call of token_batch.py (numba): a pool job of many small pairs read (read_npy) and
reduced (token_kernel.reduce_rows) in one call, each key's filled histogram bins and quantile bins taken from
the blocks reduce_rows marked. Callers take it through checks/compiled.py (the ahead-of-time copy where built)."""

from __future__ import annotations

import math

import numpy as np

from rlprobe.lake.npy_header import DESCR_AT
from rlprobe.checks.token_figures import BLOCK_BITS
from rlprobe.checks.token_kernel import reduce_rows
from rlprobe.lake.libc import CLOSE, OPENAT, PREAD

import numba  # noqa: E402  (after token_kernel has set numba's cache dir)


@numba.njit(cache=True, nogil=True)
def read_npy(directory, flags, paths, at, offset, header, descrs, buffer, nbytes):  # pragma: no cover - compiled
    """The file whose NUL-terminated path (relative to the open `directory`) starts at paths[at], from byte
    `offset` on (a record of a packed file, lake/tensor_pack.py; 0: a whole .npy), into
    buffer[:header.size + nbytes]: openat, one pread of header and data, close, with no Python and no GIL a
    file (reading 3,072 small files from Python took as long as the kernel on their tokens). True where it
    holds that many bytes and starts with `header` (the one numpy writes for the shape in the tensor index:
    lake/npy_header.header_bytes) save for the dtype, which is one of `descrs` ([k, 3] bytes); False (or the file
    cannot be opened): the caller has numpy read it, which reads it or says why not."""
    fd = OPENAT(np.int32(directory), paths[at:].ctypes.data, np.int32(flags))
    if fd < 0:
        return False
    want = header.size + nbytes
    got = PREAD(fd, buffer.ctypes.data, want, offset)
    CLOSE(fd)
    if got != want:
        return False
    for i in range(header.size):
        if buffer[i] != header[i] and not DESCR_AT <= i < DESCR_AT + 3:
            return False
    for d in range(descrs.shape[0]):
        if (buffer[DESCR_AT] == descrs[d, 0]) & (buffer[DESCR_AT + 1] == descrs[d, 1]) \
                & (buffer[DESCR_AT + 2] == descrs[d, 2]):
            return True
    return False


@numba.njit(cache=True, nogil=True)
def reduce_batch(folders, flags, paths, parts, headers, header_sizes, pre_a, pre_b, pre_m, start, used, lo, hi,
                 prob_of, thr, qs, float32, mask_bytes, part_sums, hist, touched, merge, table_lo, table_hi, sums,
                 pos_count, pos_sum, pos_max, prob_count, prob_sum, seq_sum, seq_n, counts, hist_lo, hist_hi, ends,
                 quantile_bins):  # pragma: no cover - compiled
    """From part `start` on, as reduce_pair adds each of a key's parts into its figures in order;
    (the part it could not read, or len(parts); table rows written so far). The quantiles are read from
    the key's fine bins; its histogram rows are 2^merge of them summed (table_lo/hi: their edges)."""
    most = 1
    for p in range(start, parts.shape[0]):
        most = max(most, parts[p, 1] * parts[p, 2])
    head = header_sizes.max() if header_sizes.size else 0
    buf_a, buf_b, buf_m = np.empty(head + 4 * most, np.uint8), np.empty(head + 4 * most, np.uint8), \
        np.empty(head + most, np.uint8)
    for p in range(start, parts.shape[0]):
        k, rows, width, first, at = parts[p, 0], parts[p, 1], parts[p, 2], parts[p, 3], parts[p, 4]
        n = rows * width
        if at >= 0:
            a, b, m = pre_a[at:at + n], pre_b[at:at + n], pre_m[at:at + n]
        else:
            size = header_sizes[parts[p, 8]]
            header = headers[parts[p, 8], :size]
            if not (read_npy(folders[parts[p, 10]], flags, paths, parts[p, 5], parts[p, 13], header, float32,
                                       buf_a, 4 * n)
                    and read_npy(folders[parts[p, 11]], flags, paths, parts[p, 6], parts[p, 14], header,
                                           float32, buf_b, 4 * n)):
                return p, used
            m = buf_m[:n]
            if parts[p, 7] < 0:
                m[:] = 1
            else:
                mask_size = header_sizes[parts[p, 9]]
                if not read_npy(folders[parts[p, 12]], flags, paths, parts[p, 7], parts[p, 15],
                                          headers[parts[p, 9], :mask_size], mask_bytes, buf_m, n):
                    return p, used
                m = buf_m[mask_size:mask_size + n]
            a, b = buf_a[size:size + 4 * n].view(np.float32), buf_b[size:size + 4 * n].view(np.float32)
        reduce_rows(a.reshape((rows, width)), b.reshape((rows, width)), m.reshape((rows, width)), lo, hi, prob_of,
                    thr, part_sums[p], hist, touched, pos_count[k], pos_sum[k], pos_max[k], prob_count[k],
                    prob_sum[k], seq_sum[first:first + rows], seq_n[first:first + rows])
        for i in (0, 1, 2, 3, 5, 6):  # as reduce_pair adds a pair's sums to its PairFigures
            sums[k, i] += part_sums[p, i]
        sums[k, 4] = max(sums[k, 4], part_sums[p, 4])
        if p + 1 < parts.shape[0] and parts[p + 1, 0] == k:
            continue
        _quantile_bins(hist, touched, np.int64(sums[k, 0]), qs, quantile_bins[k])  # sums: the counted tokens
        for block in range(touched.size):  # the key's filled bins in bin order (Δ >= 0, then Δ < 0), zeroed
            if touched[block] == 0:
                continue
            touched[block] = 0
            for row in range((block << BLOCK_BITS) >> merge, ((block + 1) << BLOCK_BITS) >> merge):
                tokens = 0  # a table row's 2^merge bins lie in one block (merge <= BLOCK_BITS)
                for i in range(row << merge, (row + 1) << merge):
                    tokens += hist[i]
                    hist[i] = 0
                if tokens != 0:
                    counts[used], hist_lo[used], hist_hi[used] = tokens, table_lo[row], table_hi[row]
                    used += 1
        ends[k] = used
    return parts.shape[0], used


@numba.njit(cache=True, nogil=True)
def _quantile_bins(hist, touched, total, qs, found):  # pragma: no cover - compiled
    """The |Δ| bin of each quantile: the first whose cumulative count reaches max(1, ⌈q · total⌉),
    the |Δ| bins summed from the Δ >= 0 and Δ < 0 ones (as PairFigures.quantiles); total: the histogram's
    count (the key's counted tokens, each in one bin). Block by block of
    |Δ| (a Δ >= 0 block and its Δ < 0 twin), whole blocks added up, bin by bin only in the block that
    reaches a quantile, none after the last: a merge of the key's filled bins, ~1,500 a small pair,
    bin by bin with a compare per quantile, took ~6 % of `many`'s CPU."""
    width = 1 << BLOCK_BITS
    blocks = touched.size // 2  # block b holds the |Δ| of Δ >= 0 that block b + blocks holds for Δ < 0
    half = blocks * width
    need = np.empty(qs.size, np.int64)
    left = 0
    for q in range(qs.size):
        need[q] = max(1, math.ceil(qs[q] * total))
        left += found[q] < 0
    seen = 0
    for block in range(blocks):
        if left == 0:
            break
        if touched[block] == 0 and touched[block + blocks] == 0:
            continue
        inside = 0
        for i in range(block * width, (block + 1) * width):
            inside += hist[i] + hist[half + i]
        lowest = total + 1
        for q in range(qs.size):
            if found[q] < 0:
                lowest = min(lowest, need[q])
        if seen + inside < lowest:
            seen += inside
            continue
        for i in range(block * width, (block + 1) * width):
            seen += hist[i] + hist[half + i]
            for q in range(qs.size):
                if found[q] < 0 and seen >= need[q]:
                    found[q] = i
                    left -= 1

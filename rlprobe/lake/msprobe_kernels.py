"""The compiled half of rlprobe.lake.msprobe_scan (numba, ``nogil``): an msprobe SingleSave dump's
folders listed (lake/folder_kernel.py) and its statistics files read and parsed (lake/msprobe_json_kernel.py)
with no Python and no GIL per folder or file, so that two threads read two runs at once (docs/compare.md,
"Eighth session: the statistics reading off the GIL"). What it cannot read as Python reads it, it leaves
to Python: a whole run (FALLBACK) where a folder cannot be listed or Python's listing could differ (a name
that is not UTF-8, a link or an entry of unknown type, a step, rank or micro-step name Python's pattern
might read otherwise) and where a folder holds anything but the `micro_step<M>/` layout's (tensors saved
without micro_batch, files it does not read: Python reads the one and names the others); a statistics
file (SLOW) not written the way msprobe writes it.
"""

from __future__ import annotations

import numpy as np

from rlprobe.lake.folder_kernel import (DT_DIR, find_name, grow, is_utf8, list_folder,
                                        sorted_names)
from rlprobe.lake.msprobe_codes import FALLBACK, NO_FILE, PARSED, SLOW, STAT_NULL, STAT_NUMBER
from rlprobe.lake.msprobe_json_kernel import MAX_DIMS, READ_SIZE, at, parse_statistics, read_file
from rlprobe.numba_cache import import_numba, use_user_cache_dir

use_user_cache_dir()
import_numba()

import numba  # noqa: E402  (after the cache dir is set)

__all__ = ["scan_dump"]

_MAX_PATH = 4096

_DATA = np.frombuffer(b"/data", np.uint8)
_NPY = np.frombuffer(b".npy", np.uint8)
_JSON = np.frombuffer(b".json", np.uint8)
_STEP = np.frombuffer(b"step", np.uint8)
_RANK = np.frombuffer(b"rank", np.uint8)
_MICRO = np.frombuffer(b"micro_step", np.uint8)


@numba.njit(nogil=True, cache=True)
def _grow_rows(a, need):  # pragma: no cover - runs compiled
    """_grow for a table (rows of a fixed width)."""
    if need <= a.shape[0]:
        return a
    b = np.empty((max(2 * a.shape[0], need), a.shape[1]), a.dtype)
    b[:a.shape[0]] = a
    return b


@numba.njit(nogil=True, cache=True)
def _numbered(path, parent_len, parent_names, start, length, prefix, names):  # pragma: no cover - runs compiled
    """msprobe_scan.numbered of the folder path[:parent_len] + "/" + parent_names[start:start + length] (the
    path is left so): (its path's length, count (-1: not listed, -2: Python's to list, as is a folder holding
    anything but sub-folders named prefix + digits: Python names what it does not read), its sub-folders as
    names, starts, lengths, numbers, and their order: by number then name)."""
    plen = _append(path, parent_len, parent_names, start, length)
    numbers = np.zeros(0, np.int64)
    if plen < 0:
        return plen, -1, names, numbers, numbers, numbers, numbers
    path[plen] = 0
    count, names, starts, lengths, types = list_folder(path, names)
    numbers = np.zeros(max(count, 0), np.int64)
    if count < 0:
        return plen, count, names, starts, lengths, numbers, numbers
    picked = np.empty(count, np.int64)
    found = 0
    for e in range(count):
        s, n = starts[e], lengths[e]
        if not at(names, s, s + n, prefix):
            return plen, -2, names, starts, lengths, numbers, numbers  # not read: Python names it
        digits = 0
        value = np.int64(0)
        for k in range(s + prefix.size, s + n):
            c = names[k]
            if 48 <= c <= 57:
                digits += 1
                value = value * 10 + (c - 48)
            elif c >= 0x80 or c == 10:  # a Unicode digit or a newline before the end: Python's regex decides
                return plen, -2, names, starts, lengths, numbers, numbers
            else:
                digits = -1
                break
        if digits <= 0 or digits > 18 or types[e] != DT_DIR:  # a link, an unknown type, an entry not read
            return plen, -2, names, starts, lengths, numbers, numbers
        numbers[e] = value
        picked[found] = e
        found += 1
    return plen, found, names, starts, lengths, numbers, sorted_names(names, starts, lengths, numbers, picked[:found])


@numba.njit(nogil=True, cache=True)
def _all_read(names, starts, lengths, order, key, want):  # pragma: no cover - runs compiled
    """Whether every entry of a micro-step folder is one msprobe_scan reads: a tensor (`.npy`, not hidden) or a
    statistics file (`<stem>.json` beside `<stem>.npy`, or `<key>.json`: a list's or dict's)."""
    for e in order:
        s, n = starts[e], lengths[e]
        if n >= _NPY.size and names[s] != 46 and at(names, s + n - _NPY.size, s + n, _NPY):
            continue
        if n < _JSON.size or not at(names, s + n - _JSON.size, s + n, _JSON):
            return False
        stem = n - _JSON.size
        if stem == key.size and at(names, s, s + stem, key):
            continue
        want[:stem] = names[s:s + stem]
        want[stem:stem + _NPY.size] = _NPY
        if find_name(names, starts, lengths, order, want, stem + _NPY.size) < 0:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def _append(path, plen, names, start, length):  # pragma: no cover - runs compiled
    """path[:plen] + "/" + the name; its new length (-1: too long)."""
    if plen + 1 + length + 1 > path.size:
        return -1
    path[plen] = 47
    path[plen + 1:plen + 1 + length] = names[start:start + length]
    return plen + 1 + length


@numba.njit(nogil=True, cache=True)
def _result(status, n, ints, text, t_pos, text_ends, codes, numbers, num_pos, number_ends, dims, dim_pos,
            dim_ends):  # pragma: no cover - runs compiled
    return (status, n, ints[:n], text[:t_pos], text_ends[:n], codes[:n], numbers[:num_pos], number_ends[:n],
            dims[:dim_pos], dim_ends[:n])


@numba.njit(nogil=True, cache=True)
def scan_dump(root):  # pragma: no cover - runs compiled
    """The tensors and statistics of the msprobe dump at `root` (its path's bytes, without a NUL):
    (status (FALLBACK: Python's to read), n, ints[n, 5] = step, rank, micro_step, statistics file (NO_FILE,
    PARSED, SLOW), numel (-1: no shape parsed), text (each row's key, index and tensor_file one after
    another), text_ends[n, 3], codes[n, 4] (min, max, mean, norm: STAT_*), numbers (the texts of the
    STAT_NUMBER ones one after another), number_ends[n, 4], dims, dim_ends[n]: (a row's start: the previous
    row's end; a row without a shape has none)."""
    path = np.zeros(_MAX_PATH, np.uint8)
    plen = root.size
    ints = np.empty((64, 5), np.int64)
    text = np.empty(4096, np.uint8)
    text_ends = np.empty((64, 3), np.int64)
    codes = np.empty((64, 4), np.int8)
    numbers = np.empty(4096, np.uint8)
    number_ends = np.empty((64, 4), np.int64)
    dims = np.empty(256, np.int64)
    dim_ends = np.empty(64, np.int64)
    if plen + _DATA.size + 2 > _MAX_PATH:
        return _result(FALLBACK, 0, ints, text, 0, text_ends, codes, numbers, 0, number_ends, dims, 0, dim_ends)
    path[:plen] = root
    path[plen:plen + _DATA.size] = _DATA
    data_len = plen + _DATA.size
    stats = np.zeros((4, 3), np.int64)
    shape = np.zeros(MAX_DIMS, np.int64)
    want = np.empty(_MAX_PATH, np.uint8)
    buf = np.empty(READ_SIZE, np.uint8)
    n = 0
    t_pos = 0
    num_pos = 0
    dim_pos = 0
    status = 0
    key_names = np.empty(4096, np.uint8)
    step_names = np.empty(4096, np.uint8)
    rank_names = np.empty(4096, np.uint8)
    micro_names = np.empty(4096, np.uint8)
    file_names = np.empty(4096, np.uint8)

    path[data_len] = 0
    kcount, key_names, kstarts, klengths, ktypes = list_folder(path, key_names)
    picked = np.empty(max(kcount, 0), np.int64)
    found = 0
    if kcount < 0:
        status = FALLBACK
    for e in range(max(kcount, 0)):
        if ktypes[e] != DT_DIR:  # a link, an unknown type, or a file Python names as not read
            status = FALLBACK
        else:
            if not is_utf8(key_names, kstarts[e], kstarts[e] + klengths[e]):
                status = FALLBACK
            picked[found] = e
            found += 1
    keys = sorted_names(key_names, kstarts, klengths, np.zeros(max(kcount, 0), np.int64), picked[:found])
    for key in keys:
        if status == FALLBACK:
            break
        ks, kn = kstarts[key], klengths[key]
        key_len, scount, step_names, sstarts, slengths, snumbers, steps = _numbered(
            path, data_len, key_names, ks, kn, _STEP, step_names)
        if scount < 0:
            status = FALLBACK
        for step in steps:
            if status == FALLBACK:
                break
            step_len, rcount, rank_names, rstarts, rlengths, rnumbers, ranks = _numbered(
                path, key_len, step_names, sstarts[step], slengths[step], _RANK, rank_names)
            if rcount < 0:
                status = FALLBACK
            for rank in ranks:
                if status == FALLBACK:
                    break
                rank_len, mcount, micro_names, mstarts, mlengths, mnumbers, micros = _numbered(
                    path, step_len, rank_names, rstarts[rank], rlengths[rank], _MICRO, micro_names)
                if mcount < 0:
                    status = FALLBACK
                for micro in micros:
                    if status == FALLBACK:
                        break
                    micro_len = _append(path, rank_len, micro_names, mstarts[micro], mlengths[micro])
                    if micro_len < 0:
                        status = FALLBACK
                        break
                    path[micro_len] = 0
                    fcount, file_names, fstarts, flengths, ftypes = list_folder(path, file_names)
                    if fcount < 0:
                        status = FALLBACK
                        break
                    for e in range(fcount):  # every name: the tensors and the statistics files they look for
                        if not is_utf8(file_names, fstarts[e], fstarts[e] + flengths[e]):
                            status = FALLBACK
                    if status == FALLBACK:
                        break
                    everything = sorted_names(file_names, fstarts, flengths, np.zeros(fcount, np.int64),
                                         np.arange(fcount))
                    if not _all_read(file_names, fstarts, flengths, everything, key_names[ks:ks + kn], want):
                        status = FALLBACK
                        break
                    for e in everything:
                        fs, fn = fstarts[e], flengths[e]
                        if fn < _NPY.size or file_names[fs] == 46 or not at(file_names, fs + fn - _NPY.size,
                                                                             fs + fn, _NPY):
                            continue
                        stem = fn - _NPY.size
                        ints = _grow_rows(ints, n + 1)
                        text_ends = _grow_rows(text_ends, n + 1)
                        codes = _grow_rows(codes, n + 1)
                        number_ends = _grow_rows(number_ends, n + 1)
                        dim_ends = grow(dim_ends, n + 1)
                        ints[n, 0] = snumbers[step]
                        ints[n, 1] = rnumbers[rank]
                        ints[n, 2] = mnumbers[micro]
                        ints[n, 3] = NO_FILE
                        ints[n, 4] = -1
                        # key, index (msprobe_scan._index_of), tensor_file
                        text = grow(text, t_pos + kn + 2 * fn + micro_len + 8)
                        text[t_pos:t_pos + kn] = key_names[ks:ks + kn]
                        t_pos += kn
                        text_ends[n, 0] = t_pos
                        key_text = key_names[ks:ks + kn]
                        if stem == kn and at(file_names, fs, fs + stem, key_text):
                            pass
                        elif stem > kn and at(file_names, fs, fs + stem, key_text) and file_names[fs + kn] == 46:
                            text[t_pos:t_pos + stem - kn - 1] = file_names[fs + kn + 1:fs + stem]
                            t_pos += stem - kn - 1
                        else:
                            text[t_pos:t_pos + stem] = file_names[fs:fs + stem]
                            t_pos += stem
                        text_ends[n, 1] = t_pos
                        relative = micro_len - plen - 1
                        text[t_pos:t_pos + relative] = path[plen + 1:micro_len]
                        t_pos += relative
                        text[t_pos] = 47
                        text[t_pos + 1:t_pos + 1 + fn] = file_names[fs:fs + fn]
                        t_pos += 1 + fn
                        text_ends[n, 2] = t_pos
                        codes[n, :] = STAT_NULL
                        number_ends[n, :] = num_pos
                        dim_ends[n] = dim_pos
                        n += 1
                        # its statistics file, stem + ".json", where the folder lists one
                        want[:stem] = file_names[fs:fs + stem]
                        want[stem:stem + _JSON.size] = _JSON
                        meta = find_name(file_names, fstarts, flengths, everything, want, stem + _JSON.size)
                        if meta < 0:
                            continue
                        row = n - 1
                        ints[row, 3] = SLOW
                        meta_len = _append(path, micro_len, file_names, fstarts[meta], flengths[meta])
                        if meta_len < 0:
                            continue
                        path[meta_len] = 0
                        got = read_file(path, buf)
                        ndim = -2 if got < 0 or got >= READ_SIZE else parse_statistics(buf, got, stats, shape)
                        numel = np.int64(1)
                        for d in range(max(ndim, 0)):
                            if shape[d] != 0 and numel > (np.int64(1) << 62) // shape[d]:
                                ndim = -2  # Python's integer would not fit the table's int64
                                break
                            numel *= shape[d]
                        if ndim < -1:
                            continue
                        ints[row, 3] = PARSED
                        for f in range(4):
                            codes[row, f] = stats[f, 0]
                            if stats[f, 0] == STAT_NUMBER:
                                length = stats[f, 2] - stats[f, 1]
                                numbers = grow(numbers, num_pos + length)
                                numbers[num_pos:num_pos + length] = buf[stats[f, 1]:stats[f, 2]]
                                num_pos += length
                            number_ends[row, f] = num_pos
                        if ndim >= 0:
                            dims = grow(dims, dim_pos + ndim)
                            dims[dim_pos:dim_pos + ndim] = shape[:ndim]
                            dim_pos += ndim
                            dim_ends[row] = dim_pos
                            ints[row, 4] = numel
    if status == FALLBACK:
        n = t_pos = num_pos = dim_pos = 0
    return _result(status, n, ints, text, t_pos, text_ends, codes, numbers, num_pos, number_ends, dims, dim_pos,
                   dim_ends)

"""Flat (C-order) pieces of one tensor for the element-wise comparison: arrays and memory
maps read chunk by chunk, and the pages of a map dropped from memory once compared."""

from __future__ import annotations

import math
import mmap as _mmap_mod
from typing import Any, Protocol

import numpy as np

__all__ = ["ArraySource", "FlatSource", "MappedPages", "chunk_bounds", "flat_slice"]


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

    @classmethod
    def of_map(cls, mm: _mmap_mod.mmap, start: int, itemsize: int) -> "MappedPages":
        """The pages of a C-order array read straight from `mm` at byte `start` (npy_files.py)."""
        pages = cls(np.empty(0))
        if hasattr(mm, "madvise") and hasattr(_mmap_mod, "MADV_DONTNEED"):
            pages._mm, pages._start, pages._item, pages._c_order = mm, start, itemsize, True
        return pages

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


def flat_slice(arr: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Elements [start, stop) of ``arr`` in C order, copying at most ``stop - start`` elements."""
    if arr.ndim <= 1 or arr.flags.c_contiguous:
        return arr.reshape(-1)[start:stop]
    row = math.prod(arr.shape[1:])
    r0, o0 = divmod(start, row)
    r1, o1 = divmod(stop, row)
    if r0 == r1:
        return flat_slice(arr[r0], o0, o1)
    pieces = []
    if o0:
        pieces.append(flat_slice(arr[r0], o0, row))
        r0 += 1
    if r1 > r0:
        pieces.append(arr[r0:r1].reshape(-1))
    if o1:
        pieces.append(flat_slice(arr[r1], 0, o1))
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
        return flat_slice(self.arr, start, stop)

    def release(self, start: int, stop: int) -> None:
        self._pages.release(start, stop)


def chunk_bounds(start: int, stop: int, chunk: int):
    """[start, stop) cut at the multiples of ``chunk``."""
    s = start
    while s < stop:
        e = min(stop, (s // chunk + 1) * chunk)
        yield s, e
        s = e

"""One ``.npy`` file of a pair, read chunk by chunk for the executor (rlprobe.comparison.executor):
opened with ``np.load(mmap_mode='r')``, which validates the header and the file length, then read
from the memory map (``io="mmap"``, the pages of each chunk dropped once compared) or copied into a
reusable per-thread buffer with ``os.preadv`` (``io="pread"``). A file that cannot be read becomes
a PairError whose message names the file and the problem; one that is not a regular file (a FIFO, a device)
is never read (lake/regular_files.py)."""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import threading

import numpy as np

from rlprobe.comparison.flat_sources import MappedPages, flat_slice
from rlprobe.lake.npy_header import MAGIC, PARSE_ERRORS, plain_header, read_header
from rlprobe.lake.regular_files import NPY, READ_FLAGS, NotRegularFileError, check_regular, expected_tensor_file, \
    open_binary, open_fd
from rlprobe.lake.tensor_pack import Record, TensorRecordError, load_record


class PairError(Exception):
    """A pair that cannot be compared; the message becomes the result's ``error``."""


def _describe_bad_npy(path: str, exc: BaseException) -> str:
    try:
        with open_binary(path, NPY) as f:
            head = f.read(len(MAGIC))
            size = f.seek(0, os.SEEK_END)
    except NotRegularFileError as e:
        return f"cannot read {e}"
    except OSError:
        return f"cannot read {path}: {exc}"
    if size == 0:
        return f"cannot read {path}: empty file (0 bytes), not a .npy file"
    if head != MAGIC:
        return f"cannot read {path}: not a .npy file (bad magic bytes)"
    try:
        shape, _, dtype, header_len = _read_header(path)
    except Exception:  # noqa: BLE001
        return f"cannot read {path}: corrupt or truncated .npy header ({size} bytes; numpy: {exc})"
    if dtype.hasobject:
        return f"cannot read {path}: holds Python objects (dtype {dtype}), not numbers"
    expected = header_len + math.prod(shape) * dtype.itemsize
    if not dtype.hasobject and size < expected:
        return (f"cannot read {path}: truncated .npy file ({size} bytes, but its header describes "
                f"{dtype} {list(shape)} needing {expected} bytes)")
    return f"cannot read {path}: corrupt .npy file ({size} bytes; numpy: {exc})"


def _read_header(path: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    with open_binary(path, NPY) as f:
        shape, fortran, dtype = read_header(f)
        return shape, fortran, dtype, f.tell()


def _open_record(path: str, record: Record) -> np.ndarray:
    """A packed file's record, memory-mapped (lake/tensor_pack.py, which checks where it lies)."""
    try:
        return load_record(path, record, mmap=True)
    except FileNotFoundError:
        raise PairError(f"cannot read {path}: file not found") from None
    except (OSError, ValueError) as exc:
        named = isinstance(exc, (TensorRecordError, NotRegularFileError))  # the message names the file
        raise PairError(f"cannot read {exc if named else f'{path}: {exc}'}") from None


def _open_npy(path: str) -> np.ndarray:
    try:
        check_regular(path, NPY)
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except NotRegularFileError as exc:
        raise PairError(f"cannot read {exc}") from None
    except FileNotFoundError:
        raise PairError(f"cannot read {path}: file not found") from None
    except PermissionError as exc:
        raise PairError(f"cannot read {path}: permission denied ({exc.strerror})") from None
    except (OSError, ValueError, EOFError, *PARSE_ERRORS) as exc:
        # numpy versions that cannot memory-map an empty array: accept an empty .npy
        try:
            shape, _, dtype, _ = _read_header(path)
        except Exception:  # noqa: BLE001 - describe the original failure
            raise PairError(_describe_bad_npy(path, exc)) from None
        if math.prod(shape) == 0 and not dtype.hasobject:
            return np.empty(shape, dtype=dtype)
        raise PairError(_describe_bad_npy(path, exc)) from None
    if not isinstance(arr, np.ndarray):  # np.load returned an NpzFile
        getattr(arr, "close", lambda: None)()
        raise PairError(f"cannot read {path}: an .npz archive, not a .npy file")
    return arr


_HEAD_BYTES = 4096
_LITTLE = np.dtype("<f4").isnative
_local = threading.local()
_FADVISE = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_SEQUENTIAL")


def _scratch(slot: int, nbytes: int) -> np.ndarray:
    """A per-thread reusable byte buffer (slot 0 for side A, 1 for side B), 64-byte aligned."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = [None, None]
    buf = bufs[slot]
    if buf is None or buf.nbytes < nbytes:
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        start = (-raw.ctypes.data) % 64
        buf = bufs[slot] = raw[start:start + nbytes]
    return buf[:nbytes]


class NpyFile:
    """A :class:`~rlprobe.comparison.pair_metrics.FlatSource` over one ``.npy`` file."""

    def __init__(self, path: str, slot: int, io: str, record: Record | None = None):
        self.file = path
        self.record = record  # a .npy record in a packed file (lake/tensor_pack.py); None: the whole file
        self.path = path if record is None else f"{path} (record at offset {record.offset})"  # for messages
        self.slot = slot
        self._fd: int | None = None
        self._arr: np.ndarray | None = None
        self._pages: MappedPages | None = None
        if self._open_plain(io):
            return
        arr = _open_npy(path) if record is None else _open_record(path, record)
        self.shape = arr.shape
        self.dtype = arr.dtype
        self.size = int(arr.size)
        self.nbytes = self.size * self.dtype.itemsize
        c_order = arr.flags.c_contiguous
        if io == "pread" and c_order and isinstance(arr, np.memmap) and self.size and hasattr(os, "preadv"):
            self._offset = int(arr.offset)
            try:
                self._fd = os.open(self.file, READ_FLAGS)  # a regular file: checked where it was opened above
            except OSError as exc:
                raise PairError(f"cannot read {path}: {exc.strerror or exc}") from None
            del arr  # unmaps (the header and the length were checked by np.load)
            if _FADVISE:  # a larger read-ahead window for the sequential reads
                with contextlib.suppress(OSError):
                    os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        else:
            self._arr = arr.reshape(-1) if c_order else arr
            self._pages = MappedPages(arr)

    def _open_plain(self, io: str) -> bool:
        """Open a file whose header numpy wrote the plain way (C order, a little-endian or byte-sized
        bool, integer or float, data present) without np.load, whose header parsing and np.memmap
        cost ~150 us a file under the GIL; False (nothing open) for anything else: np.load then
        opens it and names what is wrong. PairError for a file that is not a regular file."""
        try:
            fd, file_size = open_fd(self.file, expected_tensor_file(self.file))
        except NotRegularFileError as exc:
            raise PairError(f"cannot read {exc}") from None
        except OSError:
            return False
        start = 0 if self.record is None else self.record.offset
        try:
            head = os.pread(fd, _HEAD_BYTES, start)
            header = plain_header(head)
            if header is None:
                return False
            shape, dtype, offset = header
            if self.record is not None and self.record.length is not None \
                    and offset + math.prod(shape) * dtype.itemsize > self.record.length:
                return False  # a record cut short: _open_record names it
            offset += start
            native = dtype.byteorder in "=|" or (dtype.byteorder == "<" and _LITTLE)
            if dtype.kind not in "biuf" or dtype.itemsize not in (1, 2, 4, 8) or not native:
                return False
            size = math.prod(shape)
            if size == 0 or offset % 16 or file_size < offset + size * dtype.itemsize:
                return False  # np.load handles empty arrays and names a truncated file
            if io == "pread" and hasattr(os, "preadv"):
                self._fd, self._offset, fd = fd, offset, None
                if _FADVISE:
                    with contextlib.suppress(OSError):
                        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            else:
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                self._arr = np.frombuffer(mm, dtype, size, offset)
                self._pages = MappedPages.of_map(mm, offset, dtype.itemsize)
        except (OSError, ValueError, TypeError, EOFError, *PARSE_ERRORS):
            return False
        finally:
            if fd is not None:
                os.close(fd)
        self.shape, self.dtype, self.size = shape, dtype, size
        self.nbytes = size * dtype.itemsize
        return True

    def read(self, start: int, stop: int) -> np.ndarray:
        if self._fd is None:
            return flat_slice(self._arr, start, stop)
        item = self.dtype.itemsize
        nbytes = (stop - start) * item
        buf = _scratch(self.slot, nbytes)
        pos = self._offset + start * item
        got = 0
        while got < nbytes:
            n = os.preadv(self._fd, [buf[got:]], pos + got)
            if n <= 0:
                raise PairError(f"cannot read {self.path}: unexpected end of file at byte {pos + got} "
                                "(the file was truncated while being compared)")
            got += n
        return buf.view(self.dtype)

    def release(self, start: int, stop: int) -> None:
        """Drop the mapped pages of [start, stop) (io="mmap"); not for a file read whole (closing unmaps
        them, and each madvise costs a TLB shootdown on the other cores)."""
        if self._pages is not None and not (start == 0 and stop >= self.size):
            self._pages.release(start, stop)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._arr = None
        self._pages = None

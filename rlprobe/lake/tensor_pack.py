"""Packed key-data tensor files: one file per rank for the save calls the writer takes together (a
file per call from the writer process), each tensor a complete `.npy` record (numpy's header, then the
data) at a byte offset, so that the steps of a commit create one file instead of one per tensor (file
creation was the unsteady part of the capture's cost, docs/trl.md "Overhead"). Records start at
multiples of 64 bytes and numpy pads its header to 64, so every record's data is 64-byte aligned. A key-data row names its record by `tensor_file`,
`tensor_offset` (bytes into the file) and `tensor_length` (the record's bytes, header and data);
a null offset means the file is one whole `.npy` (dumps written before packing, module tensors,
imported msprobe dumps). docs/dump-format.md, "Files".

Writing (here): `TensorPack` writes the records into a hidden temporary file beside the pack and renames
it into place once, complete (lake/atomic.py's temporary names). Reading (here): `record_layout`, `load_record` and
`read_tensor_file` are the one way every reader turns (file, offset, length) into a header or an array; they open
files through lake/regular_files.py (a FIFO or a device in place of a tensor file is named, never read).
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO, NamedTuple

import numpy as np

from rlprobe.lake.atomic import open_new_fd, tmp_name, write_all
from rlprobe.lake.layout import PACK_SUFFIX
from rlprobe.lake.npy_header import PARSE_ERRORS, header_bytes, plain_header, read_header
from rlprobe.lake.regular_files import check_regular, expected_tensor_file, load_npy, open_binary

__all__ = ["PACK_SUFFIX", "RECORD_ALIGN", "Record", "TensorPack", "TensorRecordError", "describe_row", "load_record",
           "pack_records", "read_tensor_file", "record_layout", "record_of", "split_address"]


RECORD_ALIGN = 64  # a packed file's records start at multiples of this (numpy pads its header to it too)
_ZEROS = bytes(RECORD_ALIGN)
# records smaller than this are copied into the pack's buffer and written with the others in one write
# (a key-data record is typically a few hundred bytes: two system calls each cost more than the copy);
# the buffer is written out when it reaches PACK_BUFFER_BYTES, before a larger record, and at commit()
PACK_BUFFERED_BELOW = 64 << 10
PACK_BUFFER_BYTES = 1 << 20


class TensorPack:
    """The records of the save calls the writer takes together, written in order into a temporary file
    that `commit()` renames to `path` (docs/dump-format.md, "Files"). AtomicFolder's interface (save_npy,
    commit, discard, files, nbytes), but `save_npy` returns where the record went: its offset and length.
    Small records are buffered and reach the file at the latest in `commit()`, which raises (and removes
    the file) if any write failed."""

    def __init__(self, path: str):
        self.path = path
        at = path.rfind(os.sep) + 1
        self._tmp = path[:at] + tmp_name(path[at:])
        self._fd = -1
        self._at = 0  # where the next record starts (a multiple of RECORD_ALIGN)
        self._buffer = bytearray()  # small records not yet written (they end at self._at)
        self.files = 0  # pack files written: 1 once a record is
        self.records = 0
        self.nbytes = 0
        self._failed: OSError | None = None  # a write failed: the file (and its offsets) is gone
        self.lost: OSError | None = None  # why commit() failed: no record of the file is on disk

    def save_npy(self, name: str, array: np.ndarray) -> tuple[int, int]:
        """Append `array` as one .npy record; returns (offset, length). `name` is unused (the row
        names its record); it keeps AtomicFolder's signature."""
        if self._failed is not None:  # the records before it went with the file: none can be written after it
            raise OSError(f"{self.path}: an earlier record could not be written ({self._failed})")
        array = np.asarray(array, order="C")
        header = header_bytes(array.dtype, array.shape)
        if header is None:  # an object dtype or a header too long for format 1.0: numpy's own bytes
            out = io.BytesIO()
            np.lib.format.write_array(out, array, allow_pickle=False)
            header, data = out.getvalue(), np.empty(0, np.uint8)
        else:
            data = array.reshape(-1).view(np.uint8)
        length = len(header) + data.nbytes
        pad = -length % RECORD_ALIGN
        try:
            if self._fd < 0:
                self._fd = open_new_fd(self._tmp)
                self.files = 1
            if length < PACK_BUFFERED_BELOW:
                self._buffer += header
                self._buffer += memoryview(data)  # not `+= data`: numpy's own + would take over
                self._buffer += _ZEROS[:pad]
                if len(self._buffer) >= PACK_BUFFER_BYTES:
                    self._write_buffer()
            else:
                self._write_buffer()
                write_all(self._fd, header, data)
                if pad:
                    os.write(self._fd, _ZEROS[:pad])
        except BaseException as e:
            self._fail(e)
            raise
        offset = self._at
        self._at += length + pad
        self.records += 1
        self.nbytes += length + pad
        return offset, length

    def _write_buffer(self) -> None:
        if self._buffer:
            with memoryview(self._buffer) as view:  # released before the buffer is cleared, also on an error
                done = 0
                while done < len(view):  # a short write (a signal): the rest
                    done += os.write(self._fd, view[done:])
            self._buffer.clear()

    def _fail(self, e: BaseException) -> None:
        self.discard()
        self._failed = e if isinstance(e, OSError) else OSError(repr(e))

    def commit(self) -> None:
        """Write what is buffered, close the file and rename it into place (nothing to do when no record
        was written); on failure the temporary file is removed and the error raised; a pack whose record
        failed raises too (its other records went with the temporary file)."""
        if self._failed is None and self._fd >= 0:
            try:
                self._write_buffer()
            except OSError as e:
                self._fail(e)
        if self._failed is not None:
            self.lost = OSError(f"{self.path}: a record could not be written ({self._failed}); the file is not written")
            raise self.lost
        if self._fd < 0:
            return
        try:
            os.close(self._fd)
            self._fd = -1
            os.rename(self._tmp, self.path)
        except OSError as e:
            self.discard()
            self.lost = e
            raise

    def discard(self) -> None:
        """Remove the temporary file and what was written into it."""
        self._buffer.clear()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            os.unlink(self._tmp)
        except OSError:
            pass


class TensorRecordError(ValueError):
    """A record that is not where its row says, or not a .npy record; the message names the file,
    the offset and what was found."""


class Record(NamedTuple):
    """Where a tensor's .npy bytes lie: `offset` into the file (0 for a whole file) and `length`
    (header and data; None: to the end of the file)."""

    offset: int
    length: int | None


class Layout(NamedTuple):
    """A record's array as its header describes it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    data_offset: int  # bytes into the file


def record_of(offset: int | None, length: int | None) -> Record:
    """The record of a row's `tensor_offset` and `tensor_length` (both null: the whole file)."""
    return Record(0, None) if offset is None else Record(int(offset), None if length is None else int(length))


def split_address(address: str) -> tuple[str, Record | None]:
    """(tensor_file, record) of a tensor's address as sql/pair_macros.sql's tensor_address writes it:
    `<file>#<offset>+<length>` for a record of a packed file (record None: the whole file)."""
    file, mark, place = address.rpartition("#")
    if mark and file.endswith(PACK_SUFFIX):
        offset, plus, length = place.partition("+")
        if plus and offset.isdigit() and length.isdigit():
            return file, Record(int(offset), int(length))
    return address, None


def _where(path: str, record: Record, what: str) -> str:
    at = f" at offset {record.offset}" if record.length is not None else ""
    return f"{path}{at}" + (f" ({what})" if what else "")


def record_layout(path: str, record: Record, what: str = "", size: int | None = None) -> Layout:
    """The shape, dtype, order and data offset of the .npy record at `record` in `path`; raises
    TensorRecordError naming the file, the offset and `what` (the row: its key and step) for an
    offset beyond the file, bytes that are not a .npy header or a record cut short, and
    NotRegularFileError (an OSError) for a FIFO or a device."""
    with open_binary(path, expected_tensor_file(path)) as f:
        return _layout_in(f, path, record, what, size)


def _layout_in(f: BinaryIO, path: str, record: Record, what: str, size: int | None) -> Layout:
    """record_layout, of the file open as `f`."""
    if size is None:
        size = f.seek(0, os.SEEK_END)
    where = _where(path, record, what)
    end = size if record.length is None else record.offset + record.length
    if record.offset < 0 or record.offset >= size or end > size:
        raise TensorRecordError(f"{where}: the record ({record.length} bytes) lies beyond the file's end "
                                f"({size} bytes): a truncated or replaced tensor file")
    f.seek(record.offset)
    head = f.read(min(4096, end - record.offset))
    found = plain_header(head)
    if found is not None:
        shape, dtype, data = found
        fortran = False
    else:
        f.seek(record.offset)
        try:
            shape, fortran, dtype = read_header(f)
        except (ValueError, EOFError, *PARSE_ERRORS) as e:
            raise TensorRecordError(f"{where}: not a .npy record ({e})") from None
        data = f.tell() - record.offset
    if dtype.hasobject:
        raise TensorRecordError(f"{where}: an object array, which rlprobe never writes")
    need = data + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if record.offset + need > end:
        raise TensorRecordError(f"{where}: truncated .npy record: its header describes {need} bytes, "
                                f"{end - record.offset} are there")
    return Layout(tuple(shape), dtype, bool(fortran), record.offset + data)


def load_record(path: str, record: Record, mmap: bool = False, what: str = "") -> np.ndarray:
    """The array of the record (read, or memory-mapped read-only with `mmap`), the file opened once."""
    with open_binary(path, expected_tensor_file(path)) as f:
        layout = _layout_in(f, path, record, what, None)
        count = int(np.prod(layout.shape, dtype=np.int64))
        order = "F" if layout.fortran else "C"
        if mmap and count:
            return np.memmap(f, layout.dtype, "r", layout.data_offset, layout.shape, order)
        f.seek(layout.data_offset)
        data = np.fromfile(f, layout.dtype, count)
    return data.reshape(layout.shape, order=order)


def pack_records(path: str) -> list[tuple[Record, Layout]]:
    """Every record of a packed file, in order, read from its headers (rows are not needed): for tools
    that look at files without the stats (`rlprobe compare`'s choice of kernels, tests)."""
    size = check_regular(path, expected_tensor_file(path))
    out: list[tuple[Record, Layout]] = []
    at = 0
    while at < size:
        layout = record_layout(path, Record(at, size - at), size=size)
        length = layout.data_offset - at + int(np.prod(layout.shape, dtype=np.int64)) * layout.dtype.itemsize
        out.append((Record(at, length), layout))
        at += length + (-length % RECORD_ALIGN)
    return out


def read_tensor_file(path: str, row: dict | None = None, mmap: bool = False) -> np.ndarray:
    """The stored array of a key-data row's tensor_file (`path`): a whole .npy where its tensor_offset is null
    (or without a row), else the record at tensor_offset, tensor_length bytes. A packed file without an offset
    is refused: read whole, it would give its first record (pass the row: Dump.load_row_tensor)."""
    offset = None if row is None else row.get("tensor_offset")
    if offset is not None:
        return load_record(path, record_of(offset, row.get("tensor_length")), mmap, describe_row(row))
    if path.endswith(PACK_SUFFIX):
        raise TensorRecordError(f"{path}: a packed file of several tensors, read without its row's tensor_offset"
                                " (Dump.load_row_tensor reads a key-data row's record)")
    return load_npy(path, expected_tensor_file(path), mmap)


def describe_row(row: dict) -> str:
    """A key-data row in errors: its key, step, rank, micro-step and index, where known."""
    return " ".join(f"{c} {row[c]!r}" for c in ("key", "canonical", "step", "rank", "micro_step", "index")
                    if row.get(c) not in (None, ""))

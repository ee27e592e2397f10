"""Packed key-data tensor files: one file per step and rank for the save calls the writer takes
together (a file per call from the writer process), each tensor a complete `.npy` record (numpy's
header, then the data) at a byte offset, so that a step creates one file instead of one per tensor
(file creation was the unsteady part of the capture's cost, docs/trl.md "Overhead"). Records start at multiples of 64 bytes and numpy pads its header to 64, so
every record's data is 64-byte aligned. A key-data row names its record by `tensor_file`,
`tensor_offset` (bytes into the file) and `tensor_length` (the record's bytes, header and data);
a null offset means the file is one whole `.npy` (dumps written before packing, module tensors,
imported msprobe dumps). docs/dump-format.md, "Files".

Writing: lake/atomic.py's `TensorPack` writes the records into a hidden temporary file beside the pack
and renames it into place once, complete. Reading (here): `record_layout`, `load_record` and
`read_tensor_file` are the one way every reader turns (file, offset, length) into a header or an array.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from rlprobe.lake.atomic import RECORD_ALIGN, TensorPack
from rlprobe.lake.layout import PACK_SUFFIX
from rlprobe.lake.npy_header import plain_header

__all__ = ["PACK_SUFFIX", "RECORD_ALIGN", "Record", "TensorPack", "TensorRecordError", "describe_row", "load_record",
           "pack_records", "read_tensor_file", "record_layout", "record_of", "split_address"]


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
    offset beyond the file, bytes that are not a .npy header or a record cut short."""
    if size is None:
        size = os.stat(path).st_size
    where = _where(path, record, what)
    end = size if record.length is None else record.offset + record.length
    if record.offset < 0 or record.offset >= size or end > size:
        raise TensorRecordError(f"{where}: the record ({record.length} bytes) lies beyond the file's end "
                                f"({size} bytes): a truncated or replaced tensor file")
    with open(path, "rb") as f:
        f.seek(record.offset)
        head = f.read(min(4096, end - record.offset))
        found = plain_header(head)
        if found is not None:
            shape, dtype, data = found
            fortran = False
        else:
            f.seek(record.offset)
            try:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(f)
            except (ValueError, EOFError, SyntaxError) as e:
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
    """The array of the record (read, or memory-mapped read-only with `mmap`)."""
    layout = record_layout(path, record, what)
    count = int(np.prod(layout.shape, dtype=np.int64))
    order = "F" if layout.fortran else "C"
    if mmap and count:
        return np.memmap(path, layout.dtype, "r", layout.data_offset, layout.shape, order)
    with open(path, "rb") as f:
        f.seek(layout.data_offset)
        data = np.fromfile(f, layout.dtype, count)
    return data.reshape(layout.shape, order=order)


def pack_records(path: str) -> list[tuple[Record, Layout]]:
    """Every record of a packed file, in order, read from its headers (rows are not needed): for tools
    that look at files without the stats (`rlprobe compare`'s choice of kernels, tests)."""
    size = os.stat(path).st_size
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
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)


def describe_row(row: dict) -> str:
    """A key-data row in errors: its key, step, rank, micro-step and index, where known."""
    return " ".join(f"{c} {row[c]!r}" for c in ("key", "canonical", "step", "rank", "micro_step", "index")
                    if row.get(c) not in (None, ""))

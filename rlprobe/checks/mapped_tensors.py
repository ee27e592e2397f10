"""Tensor files mapped for the token kernel with MAP_POPULATE: the kernel maps every page of the
file in one system call, where numpy's memory map (np.load(mmap_mode="r")) takes a page fault per
4 KiB page as the kernel reads on, and a read() copies the bytes (measured on a loaded 2-core
machine: ~2x faster to touch than np.load's map, ~1.5x faster than a read into a reused buffer);
files of at most 256 KiB are read whole (a pread: ~15 µs for 32 KiB, where a map costs ~40 µs).
The .npy header numpy writes is read by rlprobe.lake.npy_header (numpy's own reader evaluates it as
Python source: about half of the time spent here on 1 MB tensors); any other header goes to numpy."""

from __future__ import annotations

import math
import mmap
import os

import numpy as np

from rlprobe.errors import DumpReadError
from rlprobe.lake.encoding import restore
from rlprobe.lake.npy_header import MAGIC, PARSE_ERRORS, plain_header, read_header
from rlprobe.lake.reader import Dump
from rlprobe.lake.regular_files import expected_tensor_file, open_fd
from rlprobe.lake.tensor_pack import record_of

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux; elsewhere a plain map
_HEAD = 256  # bytes read first: numpy pads the header of a simple array to 128
READ_BELOW = 1 << 18  # a smaller file is read whole: one pread costs less than setting up a map


def map_tensor(dump: Dump, row: dict, rows: slice | None = None) -> np.ndarray:
    """The tensor of a tensor index row (tensor_file, dtype) as Dump.load_tensor returns it, read-only:
    mapped, or read where the file is at most READ_BELOW bytes (a map's set-up costs more there).
    `rows`: x[rows] only (a mapped file maps the pages of those rows only: a pair cut between threads
    does not map every page once per piece)."""
    path = os.path.join(dump.path, row["tensor_file"])
    record = record_of(row.get("tensor_offset"), row.get("tensor_length"))  # a packed file's record, or the file
    start = record.offset
    try:
        fd, file_length = open_fd(path, expected_tensor_file(path))  # a FIFO or a device: named, never read
        try:
            length = file_length - start if record.length is None else record.length
            head = os.pread(fd, length if length <= READ_BELOW else _HEAD, start)
            header = plain_header(head)
            if start + length > file_length or not head.startswith(MAGIC):
                shape, fortran_order, stored, offset = (), True, None, 0  # load_record names the problem
            elif header is None:
                with open(fd, "rb", closefd=False) as f:
                    f.seek(start)
                    shape, fortran_order, stored = read_header(f)
                    offset = f.tell() - start
            else:
                (shape, stored, offset), fortran_order = header, False
            size = math.prod(shape) * stored.itemsize if stored is not None else 0
            if fortran_order or stored.hasobject or size == 0 or length < offset + size:
                data = None  # not what rlprobe writes, empty or truncated: numpy reads it (or says why not)
            elif length <= READ_BELOW:
                data = head
            else:
                first_row, stop = _row_range(rows, shape)
                if stop > first_row:  # those rows' pages only, from a page boundary
                    first = start + offset + first_row * (size // shape[0])
                    base = first - first % mmap.ALLOCATIONGRANULARITY
                    shape, size, offset, rows = (stop - first_row, *shape[1:]), \
                        (stop - first_row) * (size // shape[0]), first - base, None
                else:  # the record from the page holding its start
                    base = start - start % mmap.ALLOCATIONGRANULARITY
                    offset += start - base
                data = mmap.mmap(fd, offset + size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ,
                                 offset=base)
        finally:
            os.close(fd)
    except (OSError, ValueError, EOFError, *PARSE_ERRORS) as e:  # an OSError's strerror: without the path again
        raise DumpReadError(f"{path}: cannot read tensor ({getattr(e, 'strerror', None) or e})") from None
    if data is None:
        x = dump.load_row_tensor(row, mmap=True)
    else:
        x = restore(np.frombuffer(data, stored, count=size // stored.itemsize, offset=offset).reshape(shape),
                    row["dtype"])
    return x if rows is None else x[rows]


def _row_range(rows: slice | None, shape: tuple[int, ...]) -> tuple[int, int]:
    """[start, stop) of a step-1 slice of the leading dimension of a tensor of 2+ dimensions; (0, 0) otherwise."""
    if rows is None or len(shape) < 2 or rows.step not in (None, 1):
        return 0, 0
    start, stop, _ = rows.indices(shape[0])
    return start, stop

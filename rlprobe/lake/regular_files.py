"""Every file rlprobe reads from a dump is opened here, or checked here before numpy, Arrow, polars or
DuckDB opens it: only a regular file is read.

A FIFO (named pipe) in place of a tensor file, a stats part or a manifest made every command hang, since
opening a FIFO for reading waits until a writer opens it; a character device (a link to /dev/zero) reads as
endless data. So files are opened with O_NONBLOCK (which never waits, and changes nothing for a regular file)
and checked with fstat before a byte is read (`open_fd`, `open_binary`, `read_bytes`, `read_text`); a path
another library opens itself is checked with stat first (`check_regular`, `load_npy`). The compiled readers
open with READ_FLAGS (O_NONBLOCK among them), so a FIFO reads there as an empty or short file and goes to the
Python path, which opens it here and names it.

NotRegularFileError is an OSError, so each reader reports it as it reports any file it cannot read (an error
row, a read error, DumpReadError); it reads "<path>: not a regular file (a FIFO); expected a .npy tensor
file" (its `strerror` is the part after the path, for messages that name the path already).
"""

from __future__ import annotations

import errno
import io
import os
import stat
from typing import Any, BinaryIO

from rlprobe.lake.layout import PACK_SUFFIX

__all__ = ["GRAD_SUMMARY", "JSON_FILE", "LOCK_FILE", "MSPROBE_STATS", "NPY", "PACK", "PARQUET", "READ_FLAGS", "SIGNS",
           "NotRegularFileError", "check_regular", "expected_tensor_file", "load_npy", "open_binary", "open_fd",
           "open_text", "read_bytes", "read_text", "regular_fd"]

#: the flags every reader of a dump opens a file with, compiled readers too (they read it at import)
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

# what a reader expected, for its message
NPY = "a .npy tensor file"
PACK = "a packed .npys tensor file"
SIGNS = "a .npy file of gradient signs"
PARQUET = "a Parquet stats part"
JSON_FILE = "a JSON file"
LOCK_FILE = "a rank's lock file"
MSPROBE_STATS = "msprobe's statistics .json file"
GRAD_SUMMARY = "msprobe's grad_summary .csv file"

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class NotRegularFileError(OSError):
    """A dump file that is not a regular file (a FIFO, a device, a socket, a directory): never read."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _refuse(path: Any, mode: int, expected: str) -> NotRegularFileError:
    kind = next((name for test, name in _KINDS if test(mode)), f"file type {stat.S_IFMT(mode):o}")
    return NotRegularFileError(None, f"not a regular file ({kind}); expected {expected}", os.fspath(path))


def expected_tensor_file(path: Any) -> str:
    """NPY, or PACK for a packed file (lake/tensor_pack.py), by the path's suffix."""
    return PACK if os.fsdecode(path).endswith(PACK_SUFFIX) else NPY


def check_regular(path: Any, expected: str) -> int:
    """The size of the regular file at `path` (links followed); NotRegularFileError for anything else,
    OSError (FileNotFoundError, ...) where it cannot be looked at. For paths another library opens."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, st.st_mode, expected)
    return st.st_size


def regular_fd(fd: int, path: Any, expected: str) -> int:
    """The size of the file open as `fd` (opened with O_NONBLOCK) where it is a regular file; else
    NotRegularFileError naming `path` (the descriptor is the caller's to close)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, st.st_mode, expected)
    return st.st_size


def open_fd(path: Any, expected: str) -> tuple[int, int]:
    """A descriptor of the regular file at `path`, opened with READ_FLAGS (O_NONBLOCK left set: it changes
    nothing for a regular file), and its size; NotRegularFileError (the descriptor closed) for anything else."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a socket (or a device without its driver): named as what it is
            check_regular(path, expected)
        raise
    try:
        return fd, regular_fd(fd, path, expected)
    except BaseException:
        os.close(fd)
        raise


def open_binary(path: Any, expected: str) -> BinaryIO:
    """The regular file at `path` as a binary file object (open_fd, then O_NONBLOCK cleared)."""
    fd, _ = open_fd(path, expected)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_text(path: Any, expected: str, encoding: str = "utf-8", newline: str | None = None) -> io.TextIOWrapper:
    """The regular file at `path` as a text file object (open_binary, decoded)."""
    return io.TextIOWrapper(open_binary(path, expected), encoding=encoding, newline=newline)


def read_bytes(path: Any, expected: str) -> bytes:
    """The whole regular file at `path`."""
    with open_binary(path, expected) as f:
        return f.read()


def read_text(path: Any, expected: str, encoding: str = "utf-8") -> str:
    """The whole regular file at `path` as text (UnicodeDecodeError, a ValueError, where it is not `encoding`)."""
    return read_bytes(path, expected).decode(encoding)


def load_npy(path: Any, expected: str = NPY, mmap: bool = False) -> Any:
    """np.load of the regular file at `path` (memory-mapped read-only with `mmap`; no pickled objects). A
    header numpy's parser cannot read is a ValueError naming the file, as numpy's own header errors are."""
    import numpy as np

    from rlprobe.lake.npy_header import PARSE_ERRORS

    check_regular(path, expected)
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except PARSE_ERRORS as e:
        raise ValueError(f"{path}: corrupt .npy header ({e})") from None

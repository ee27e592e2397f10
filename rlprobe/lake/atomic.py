"""Atomic file writes: write a hidden temporary file beside the target, then rename it.

A process killed at any instant leaves either the old file or the complete new one; the
temporaries (`.<name>.tmp-*`) match no reader's pattern and `rlprobe compact` removes them.
Many small files written together go into a hidden temporary folder renamed into place once
(`AtomicFolder`): one mkdir and one rename for the lot, none per file. A save call's key-data tensors
go into one file (`TensorPack`), each a .npy record at an offset (lake/tensor_pack.py reads them).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from rlprobe.lake.npy_header import header_bytes

TMP_MARK = ".tmp-"


def _tmp_path(path: Path) -> Path:
    return path.with_name(tmp_name(path.name))


def tmp_name(name: str) -> str:
    # unique within the process without a system call per file: a random start, then a count
    return f".{name}{TMP_MARK}{os.getpid()}-{next(_tmp_count):08x}"


_tmp_count = itertools.count(int.from_bytes(os.urandom(4), "little"))


# Directories this process has created or found: a dump writes many small files into few
# folders, and a mkdir per file was ~12 % of the writer thread's time. Folders are made top
# down from the deepest one known, so a new step's folders cost one mkdir each and no failed
# ones. A folder removed since (a dump deleted and rewritten) is made again when opening the
# temporary file fails.
_made_dirs: set[str] = set()
_MADE_DIRS_MAX = 1 << 16


def make_dirs(directory: str) -> None:
    """os.makedirs(directory, exist_ok=True), remembering what exists."""
    missing = []
    while directory and directory not in _made_dirs:
        missing.append(directory)
        parent = _parent(directory)
        if parent == directory:
            break
        directory = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
        if len(_made_dirs) >= _MADE_DIRS_MAX:
            _made_dirs.clear()
        _made_dirs.add(directory)


def _parent(path: str) -> str:
    # str.rfind, not os.path.dirname (a Python function, ~1 us a call, a few calls a file)
    at = path.rfind(os.sep)
    return path[:at] if at > 0 and not os.altsep else os.path.dirname(path)


def _forget_dirs(directory: str) -> None:
    while directory in _made_dirs:
        _made_dirs.discard(directory)
        directory = _parent(directory)


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def open_new_fd(tmp: str) -> int:
    directory = _parent(tmp)
    make_dirs(directory)
    try:
        return os.open(tmp, _NEW_FILE, 0o666)
    except FileNotFoundError:  # a remembered folder was removed meanwhile
        _forget_dirs(directory)
        make_dirs(directory)
        return os.open(tmp, _NEW_FILE, 0o666)


def _open_new(tmp: Path) -> BinaryIO:
    return os.fdopen(open_new_fd(str(tmp)), "wb")


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> int:
    """Write `path` through `write(fileobj)` atomically; return the bytes written."""
    tmp = _tmp_path(path)
    try:
        with _open_new(tmp) as f:
            write(f)
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return size


def atomic_write_json(path: Path, obj: Any, key_lines: bool = False) -> int:
    """`obj` as JSON, indented; with `key_lines`, a dict one key a line, each value compact on its line
    by json's C encoder (an indent makes json use its Python one, ~4-5 x slower: a rank manifest, written
    at every commit, of 100,000 committed steps took 31 ms holding the GIL the training thread needs)."""
    if not key_lines:
        text = json.dumps(obj, indent=2, sort_keys=False, default=str)
    elif isinstance(obj, dict) and obj and all(isinstance(k, str) for k in obj):
        lines = (f"  {json.dumps(k)}: {json.dumps(v, default=str)}" for k, v in obj.items())
        text = "{\n" + ",\n".join(lines) + "\n}"
    else:
        text = json.dumps(obj, default=str)
    data = text.encode("utf-8")
    return atomic_write(path, lambda f: f.write(data))


def atomic_save_npy(path: Path | str, array: np.ndarray) -> int:
    """np.save's bytes (format 1.0 header), written atomically with one open, one writev and one
    rename; returns the bytes written."""
    array = np.asarray(array, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
    header = header_bytes(array.dtype, array.shape)
    if header is None:  # a header too long for format 1.0, say: numpy picks the format
        return atomic_write(Path(path), lambda f: np.lib.format.write_array(f, array, allow_pickle=False))
    target = os.fspath(path)
    at = target.rfind(os.sep) + 1
    tmp = target[:at] + tmp_name(target[at:]) if not os.altsep else str(_tmp_path(Path(target)))
    try:
        size = _write_npy(open_new_fd(tmp), header, array)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return size


def _write_npy(fd: int, header: bytes, array: np.ndarray) -> int:
    """Write the .npy bytes of a C-ordered `array` to `fd` and close it; returns the bytes written."""
    data = array.reshape(-1).view(np.uint8)
    try:
        write_all(fd, header, data)
    finally:
        os.close(fd)
    return len(header) + data.nbytes


class AtomicFolder:
    """A folder of new files that appears complete or not at all: the files are written into a
    hidden temporary folder beside it (`.<name>.tmp-*`, made with the first file), which
    `commit()` renames into place. A process killed before that leaves only the hidden folder,
    which no reader's pattern matches. The folder must not exist yet."""

    def __init__(self, path: str):
        self.path = path
        at = path.rfind(os.sep) + 1
        self._tmp = path[:at] + tmp_name(path[at:]) if not os.altsep else str(_tmp_path(Path(path)))
        self._made = False
        self.files = 0
        self.nbytes = 0

    def save_npy(self, name: str, array: np.ndarray) -> int:
        """Write `array` as `<folder>/<name>` (np.save's bytes); returns the bytes written."""
        array = np.asarray(array, order="C")
        if not self._made:
            make_dirs(_parent(self._tmp))
            try:
                os.mkdir(self._tmp)
            except FileNotFoundError:  # a remembered parent folder was removed meanwhile
                _forget_dirs(_parent(self._tmp))
                make_dirs(_parent(self._tmp))
                os.mkdir(self._tmp)
            self._made = True
        target = f"{self._tmp}{os.sep}{name}"  # not os.path.join: ~1.5 us a file, a name is never absolute
        header = header_bytes(array.dtype, array.shape)
        try:
            if header is None:
                with open(target, "xb") as f:
                    np.lib.format.write_array(f, array, allow_pickle=False)
                    size = f.tell()
            else:
                size = _write_npy(os.open(target, _NEW_FILE, 0o666), header, array)
        except BaseException:  # a part-written file (a full disk) must not be renamed into place
            try:
                os.unlink(target)
            except OSError:
                pass
            raise
        self.files += 1
        self.nbytes += size
        return size

    def commit(self) -> None:
        """Rename the folder into place (nothing to do when no file was written); on failure the
        temporary folder is removed and the error raised."""
        if not self._made:
            return
        try:
            os.rename(self._tmp, self.path)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Remove the temporary folder and what was written into it."""
        if self._made:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._made = False


def write_all(fd: int, header: bytes, data: np.ndarray) -> None:
    done = os.writev(fd, [header, data]) if data.nbytes and hasattr(os, "writev") else 0
    while done < len(header):  # a short write (a signal, a huge array) or no writev: the rest
        done += os.write(fd, header[done:])
    view, at = memoryview(data), done - len(header)
    while at < data.nbytes:
        at += os.write(fd, view[at:])


# Below this size a Parquet file is written uncompressed: zstd's per-column set-up (~1 ms for a
# grad part of a few rows) costs more than it saves; the merged parts, which are what stays, are
# compressed.
COMPRESS_FROM_BYTES = 64 << 10
# Below this size (a commit's part, most merges) a Parquet file is made in memory and written at once
PARQUET_BUFFERED_BELOW = 32 << 20


def atomic_write_parquet(path: Path, table: "Any") -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # the buffers' total size, not Table.nbytes, which works out each chunk's share of its buffers: ~30 ms
    # for a commit of a few hundred save calls' rows (one chunk each); a slice's shared buffers may
    # count it as larger, which only compresses it
    compression = "zstd" if table.get_total_buffer_size() >= COMPRESS_FROM_BYTES else "none"
    if table.num_columns and table.column(0).num_chunks > 1:
        # one chunk per save call or part (the writer process's rows, a merge): Parquet writes each chunk
        # with its own set-up, ~0.2 ms each, where copying them into one costs a few microseconds a chunk
        table = table.combine_chunks()
    # an uncompressed part is a commit's few hundred rows, merged away later: dictionary encoding
    # (~30 % of its write time, ~0.4 ms a part of key data) only pays where zstd follows it, and the
    # columns' min/max statistics (~15 %, for readers' row-group pruning) only in the parts that stay
    kept = compression != "none"
    options = {"compression": compression, "use_dictionary": kept, "write_statistics": kept}
    if table.get_total_buffer_size() >= PARQUET_BUFFERED_BELOW:
        return atomic_write(path, lambda f: pq.write_table(table, f, **options))
    # Parquet writes a Python file object a page and a column chunk at a time, each write a Python call
    # holding the GIL: a commit's part made in memory and then written at once took 0.5-0.9 ms where it
    # took 0.7-1.8 ms (docs/trl.md, "Eleventh pass")
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    data = sink.getvalue()
    return atomic_write(path, lambda f: f.write(data))


def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and TMP_MARK in path.name

"""Atomic file writes: write a hidden temporary file beside the target, then rename it.

A process killed at any instant leaves either the old file or the complete new one; the
temporaries (`.<name>.tmp-*`) match no reader's pattern and `rlprobe compact` removes them.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

TMP_MARK = ".tmp-"


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


# Directories this process has created or found: a dump writes many small files into few
# folders, and a mkdir per file was ~12 % of the writer thread's time. A folder removed since
# (a dump deleted and rewritten) is made again when opening the temporary file fails.
_made_dirs: set[str] = set()
_MADE_DIRS_MAX = 1 << 16


def _open_new(tmp: Path) -> BinaryIO:
    parent = str(tmp.parent)
    if parent not in _made_dirs:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        if len(_made_dirs) >= _MADE_DIRS_MAX:
            _made_dirs.clear()
        _made_dirs.add(parent)
        return open(tmp, "wb")
    try:
        return open(tmp, "wb")
    except FileNotFoundError:
        _made_dirs.discard(parent)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        _made_dirs.add(parent)
        return open(tmp, "wb")


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


def atomic_write_json(path: Path, obj: Any) -> int:
    data = json.dumps(obj, indent=2, sort_keys=False, default=str).encode("utf-8")
    return atomic_write(path, lambda f: f.write(data))


def atomic_save_npy(path: Path, array: np.ndarray) -> int:
    return atomic_write(path, lambda f: np.lib.format.write_array(f, np.asarray(array, order="C"), allow_pickle=False))


# Below this size a Parquet file is written uncompressed: zstd's per-column set-up (~1 ms for a
# grad part of a few rows) costs more than it saves; the merged parts, which are what stays, are
# compressed.
COMPRESS_FROM_BYTES = 64 << 10


def atomic_write_parquet(path: Path, table: "Any") -> int:
    import pyarrow.parquet as pq

    compression = "zstd" if table.nbytes >= COMPRESS_FROM_BYTES else "none"
    return atomic_write(path, lambda f: pq.write_table(table, f, compression=compression))


def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and TMP_MARK in path.name

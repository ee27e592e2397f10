"""Every report file is written atomically beside its final path, and a failure says which file."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Callable

from rlprobe.errors import ProbeError
from rlprobe.lake.atomic import atomic_write


def write_report_file(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write `path` through `write(fileobj)` via a temporary file and a rename; return the path."""
    path = Path(path)
    if path.is_dir():
        raise ProbeError(f"cannot write report {path}: it is a directory; give a file path")
    try:
        atomic_write(path, write)
    except OSError as e:
        raise ProbeError(f"cannot write report {path}: {e.strerror or e}; choose a writable output path") from e
    return path

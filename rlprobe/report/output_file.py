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


def output_os_error(error: BaseException) -> OSError | None:
    """The file-system error behind a failed write of an output: `error` itself, or the OSError a
    report writer's ProbeError wraps; None for any other failure."""
    if isinstance(error, OSError):
        return error
    cause = error.__cause__
    return cause if isinstance(error, ProbeError) and isinstance(cause, OSError) else None

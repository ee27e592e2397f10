"""The one way `rlprobe compare -o OUT` and `rlprobe pipeline run` publish an output folder.

Every file (tables, reports, plots) is written into a fresh work folder beside OUT
(`.<OUT name>.tmp-<pid>-<random>`, a WorkDir), and only when all are written is that folder
swapped in for OUT whole: the previous OUT is renamed aside, the new one renamed into place, the
old one removed. Nothing is written into a live OUT, and a failure at any point leaves the
previous OUT as it was. A run killed between the two renames leaves the previous OUT aside as
`<work folder>.old`; the next run into OUT puts it back first.

OUT must be rlprobe's: missing, empty, or a folder rlprobe wrote. rlprobe recognises its own
folder by MANIFEST, a list of every file and folder it wrote there; a folder without one is
rlprobe's when it holds summary.json (written by rlprobe before the manifest existed). A folder
holding anything else is refused (OutputError, exit 3) and left untouched, so a swap never
deletes a user's files. A single report file is written atomically too (write_report_file), and a failure
names the file.

Work folders of killed runs are removed (remove_dead_work_dirs). A work folder is named
`<prefix><pid>-<random>`, and beside it lies `<folder>.lock`, a file its process holds locked (flock) from
before the folder exists until after it is removed. The kernel frees the lock when the process ends, however
it ends, so exactly the folders whose owner is gone are removed, also when the process id has been reused (a
container's next run) or the owner ran on another host sharing the folder, and never the folder of a run still
going. A pipeline's previous output, set aside as `<folder>.old` while the new one moves in, is put back when
its owner died before the new output took its place. Where no lock can be taken (a file system without flock,
Windows) nothing is removed; folders of older rlprobe versions (`<prefix><random>`, no lock) go once they are a
day old.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import BinaryIO, Callable

from rlprobe._version import __version__
from rlprobe.errors import ProbeError
from rlprobe.lake.atomic import TMP_MARK, atomic_write, is_temporary

MANIFEST = ".rlprobe-output.json"
LEGACY_MARK = "summary.json"  # an output of rlprobe before MANIFEST


class OutputError(ProbeError):
    """An output folder that cannot be written, or that holds files rlprobe did not write."""


def publish_output(out: Path, write: Callable[[Path], None], *, label: str = "output") -> None:
    """Write the output folder `out` through `write(folder)` into a work folder beside it, then
    swap it in whole. `label` names `out` in messages ('output directory' for rlprobe compare).
    Raises OutputError, naming `out` (and the file being written, where known); the previous
    `out` is kept in every case."""
    out = Path(out)
    prefix = _work_prefix(out)
    prepare_output(out, label)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = WorkDir(out.parent, prefix)
    except OSError as e:
        raise OutputError(f"{label} {out} cannot be written: {e.strerror or e}") from None
    try:
        try:
            write(work.path)
            _write_manifest(work.path)
        except (OSError, ProbeError) as e:  # a full disk, a quota, a read-only folder
            cause = output_os_error(e)
            if cause is None:
                raise
            reason = (cause.strerror or os.strerror(cause.errno)) if cause.errno else str(cause)
            raise OutputError(f"{label} {out} cannot be written: {reason}{_which_file(cause, work.path)}; "
                              "its earlier files are kept") from None
        _swap(work, out, label)
    finally:
        work.remove()


def prepare_output(out: Path, label: str = "output") -> None:
    """Before the work: put back an output that a killed run had set aside, remove the work
    folders of killed runs, and raise OutputError unless `out` may be replaced (check_output)."""
    out = Path(out)
    remove_dead_work_dirs(out.parent, _work_prefix(out), restore_to=out)
    check_output(out, label)


def check_output(out: Path, label: str = "output") -> None:
    """Raise OutputError unless `out` is missing, empty or a folder rlprobe wrote."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"{label} {out} is a file; give a directory")
    if not out.is_dir():
        return
    try:
        present = _entries(out)
    except OSError as e:
        raise OutputError(f"{label} {out} cannot be read: {e.strerror or e}") from None
    if not present:
        return
    manifest = out / MANIFEST
    if not manifest.is_file():
        if (out / LEGACY_MARK).is_file():
            return
        raise OutputError(f"{label} {out} holds other files (no summary.json of an earlier run); "
                          "give a new or empty directory")
    try:
        written = set(json.loads(manifest.read_text(encoding="utf-8"))["files"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OutputError(f"{label} {out}: its list of rlprobe's files {manifest} cannot be read ({e}); "
                          "give a new or empty directory") from None
    foreign = sorted(present - written - {MANIFEST})
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputError(f"{label} {out} holds other files (not written by rlprobe: {shown}); move them away "
                          "or give a new or empty directory")


def _work_prefix(out: Path) -> str:
    return f".{out.name}.tmp-"


def _entries(folder: Path) -> set[str]:
    """Every file and folder under `folder`, as relative POSIX paths."""
    found = set()
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        found.update((rel / name).as_posix() for name in dirs + files)
    return found


def _write_manifest(work: Path) -> None:
    entries = sorted(_entries(work))
    text = json.dumps({"rlprobe_version": __version__, "files": entries}, indent=1) + "\n"
    (work / MANIFEST).write_text(text, encoding="utf-8")


def _swap(work: WorkDir, out: Path, label: str) -> None:
    """Swap the finished folder into place; the previous output goes only after (a run killed in
    between leaves it as `work.old`, which the next run puts back)."""
    old = None
    try:
        if out.exists():
            old = work.old
            out.rename(old)
        work.path.rename(out)
    except OSError as e:
        if old is not None and not out.exists():
            old.rename(out)
        raise OutputError(f"{label} {out} cannot be written: {e.strerror or e}; its earlier files are kept") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _which_file(error: OSError, work: Path) -> str:
    """' (writing report.xlsx)' for an error that names a file of the work folder."""
    name = getattr(error, "filename", None)
    if not name:
        return ""
    try:
        relative = Path(name).relative_to(work)
    except ValueError:
        return ""
    if is_temporary(relative):  # an atomic write's temporary: name the file it was to become
        relative = relative.with_name(relative.name[1:relative.name.index(TMP_MARK)])
    return f" (writing {relative})"


# -- one report file, written atomically beside its final path; a failure names the file -----------
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


LOCK_SUFFIX = ".lock"
OLD_SUFFIX = ".old"
LEGACY_AGE_S = 24 * 3600  # a folder without a lock file is a day old before it counts as abandoned


class WorkDir:
    """A new, empty work folder `parent/<prefix><pid>-<random>` held by this process until `remove()`
    (also a context manager). Raises OSError when `parent` cannot be written."""

    def __init__(self, parent: Path, prefix: str) -> None:
        self.path = Path(parent) / f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._lock_path = _lock_path(self.path)
        # the lock exists before the folder, so another run never sees the folder without it
        self._fd: int | None = os.open(self._lock_path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
        try:
            _try_lock(self._fd)
            self.path.mkdir()
        except BaseException:
            self._release()
            raise

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.remove()

    @property
    def old(self) -> Path:
        """Where a pipeline sets the previous output aside while the new one moves in."""
        return self.path.with_name(self.path.name + OLD_SUFFIX)

    def remove(self) -> None:
        """Remove the folder, then its lock (what remains of a failed run goes with it)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self._release()

    def _release(self) -> None:
        if self._fd is None:
            return
        try:
            self._lock_path.unlink()
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def remove_dead_work_dirs(parent: Path, prefix: str, restore_to: Path | None = None) -> list[Path]:
    """Remove the work folders `parent/<prefix>*` of runs that have ended without removing them,
    with their lock files; return the folders removed. A `.old` folder (a previous output set
    aside) is renamed to `restore_to` when that does not exist, else removed. Best effort: a
    folder that cannot be removed stays, and nothing here raises."""
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    parent = Path(parent)
    owned = re.compile(re.escape(prefix) + r"(\d+-[0-9a-f]{8})(" + re.escape(OLD_SUFFIX) + "|"
                       + re.escape(LOCK_SUFFIX) + ")?")
    legacy = re.compile(re.escape(prefix) + r"[0-9a-f]{8}")
    tokens: dict[str, set[str]] = {}
    removed: list[Path] = []
    for name in names:
        m = owned.fullmatch(name)
        if m:
            tokens.setdefault(m.group(1), set()).add(m.group(2) or "")
        elif legacy.fullmatch(name) and _age_s(parent / name) > LEGACY_AGE_S:
            if _remove_tree(parent / name):
                removed.append(parent / name)
    for token, kinds in sorted(tokens.items()):
        folder = parent / f"{prefix}{token}"
        fd = None
        if LOCK_SUFFIX in kinds:
            fd = _take_abandoned_lock(_lock_path(folder))
            if fd is None:
                continue  # its run is still going (or nobody can tell)
        elif min(_age_s(parent / f"{prefix}{token}{k}") for k in kinds) <= LEGACY_AGE_S:
            continue  # no lock file: a run between creating it and locking it, or one that just ended
        try:
            old = folder.with_name(folder.name + OLD_SUFFIX)
            if OLD_SUFFIX in kinds:
                restored = False
                if restore_to is not None and not os.path.lexists(restore_to):
                    try:
                        old.rename(restore_to)
                        restored = True
                    except OSError:
                        pass
                if not restored:
                    _remove_tree(old)
            if "" in kinds and _remove_tree(folder):
                removed.append(folder)
            if fd is not None:
                try:
                    _lock_path(folder).unlink()
                except OSError:
                    pass
        finally:
            if fd is not None:
                os.close(fd)
    return removed


def _lock_path(folder: Path) -> Path:
    return folder.with_name(folder.name + LOCK_SUFFIX)


def _try_lock(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: no lock, so no other run removes this folder
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # a file system without flock: other runs cannot take it either, and keep the folder


def _take_abandoned_lock(path: Path) -> int | None:
    """An open descriptor holding the lock at `path` when its owner is gone; None while it lives
    or when that cannot be told."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by a live run, or no flock here
        os.close(fd)
        return None
    return fd


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except OSError:
        return float("inf")


def _remove_tree(path: Path) -> bool:
    if not os.path.lexists(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)

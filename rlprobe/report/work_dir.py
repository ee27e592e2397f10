"""Temporary work folders of `rlprobe compare` and `rlprobe pipeline run`, and the removal of
those that killed runs left behind.

A work folder is named `<prefix><pid>-<random>`, and beside it lies `<folder>.lock`, a file its
process holds locked (flock) from before the folder exists until after it is removed. The kernel
frees the lock when the process ends, however it ends, so `remove_dead_work_dirs` removes exactly
the folders whose owner is gone, also when the process id has been reused (a container's next
run) or the owner ran on another host sharing the folder, and never the folder of a run still
going. A pipeline's previous output, set aside as `<folder>.old` while the new one moves in, is
put back when its owner died before the new output took its place. Where no lock can be taken
(a file system without flock, Windows) nothing is removed; folders of older rlprobe versions
(`<prefix><random>`, no lock) go once they are a day old.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path

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

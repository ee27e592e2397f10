"""Who writes a rank: an exclusive lock on `<dump>/.rank<R>.lock` for as long as a process writes it.

A Probe holds its rank's lock from before it looks at the directory until `close()`;
`rlprobe compact` takes it for the moment it merges that rank. The lock is a `flock` on an
open file, so the kernel drops it when the holder dies however it dies (SIGKILL, OOM kill,
power loss of a client): a killed run never leaves a stale lock behind, unlike a PID file.
The file itself stays (it is hidden, empty of data, and matches no reader's pattern);
deleting a lock file while another process may be opening it would let two processes hold
"the" lock at once. What the file holds (pid, host, holder) is only for messages.

A process that forks (DataLoader workers) closes its copy in the child, so a child never
keeps the lock alive after the writer itself has died.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import weakref
from pathlib import Path

from rlprobe.errors import ProbeError
from rlprobe.lake.regular_files import LOCK_FILE, regular_fd

try:
    import fcntl
except ImportError:  # Windows: no flock; compact then relies on the user not racing a live writer
    fcntl = None  # type: ignore[assignment]


def lock_file_name(rank: int) -> str:
    return f".rank{rank}.lock"


class RankLocked(ProbeError):
    """Another live process writes this rank (a Probe, or `rlprobe compact`)."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


_held: "weakref.WeakSet[RankLock]" = weakref.WeakSet()
_held_guard = threading.Lock()


def _close_in_child() -> None:
    for lock in list(_held):
        lock._forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class RankLock:
    """An exclusive, non-blocking lock on one rank of one dump; `release()` (or process death) frees it."""

    def __init__(self, path: Path, rank: int, fd: int | None):
        self.path, self.rank, self._fd = path, rank, fd

    @classmethod
    def acquire(cls, root: Path, rank: int, holder: str) -> "RankLock":
        """Take rank `rank`'s lock in dump `root` or raise RankLocked naming who holds it."""
        path = Path(root) / lock_file_name(rank)
        if fcntl is None:
            return cls(path, rank, None)
        try:  # read-only: a descriptor open for writing would keep the file system from being remounted read-only
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o644)  # a FIFO: not waited on
        except OSError as e:
            raise ProbeError(f"cannot open the lock file {path} of rank {rank}: {e.strerror or e}") from None
        try:
            regular_fd(fd, path, LOCK_FILE)
        except OSError as e:
            os.close(fd)
            raise ProbeError(f"cannot open the lock file {path} of rank {rank}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = _read_owner(fd)
            os.close(fd)
            raise RankLocked(
                f"rank {rank} of {Path(root)} is being written by a live process ({owner}); "
                "wait until it has finished (or stop it), or use another directory", rank) from None
        lock = cls(path, rank, fd)
        # who holds it, for the message above (the lock itself is the flock, which another
        # descriptor of the file neither takes nor drops)
        _write_note(path, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "holder": holder,
                                      "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
        with _held_guard:
            _held.add(lock)
        return lock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _write_note(self.path, "")
        os.close(fd)  # closing the last descriptor drops the flock

    def _forget_in_child(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)  # the parent's descriptor still holds the lock
            except OSError:
                pass

    def __del__(self) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"RankLock({str(self.path)!r}, {'held' if self.held else 'released'})"


def _write_note(path: Path, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass


def _read_owner(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "pid unknown"
    holder, host, since = info.get("holder", "a writer"), info.get("host", "?"), info.get("since", "?")
    return f"{holder}, pid {info['pid']} on {host} since {since}"

"""FIFOs (named pipes) and links to /dev/zero in place of a dump's files, and a call that must finish, for the
tests of the readers of lake/regular_files.py. A reader that opens a FIFO the blocking way waits for a writer
forever: `finishes` runs the call on a thread and, where it has not returned in time, opens each FIFO for
writing and closes it again (a waiting reader then goes on and reads nothing) until the call returns, then
fails the test. A regression fails; it never hangs the suite."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest


def fifo_in_place_of(path: Path) -> Path:
    """`path` (a file) replaced by a FIFO."""
    path.unlink()
    os.mkfifo(path)
    return path


def zero_device_in_place_of(path: Path) -> Path:
    """`path` (a file) replaced by a link to the character device /dev/zero."""
    path.unlink()
    path.symlink_to("/dev/zero")
    return path


def finishes(call: Callable[[], Any], fifos: list[Path], seconds: float = 120) -> Any:
    """call()'s result (or its exception, raised here), where it returns within `seconds`; else the test fails
    (the FIFOs' waiting readers let go first, so that nothing is left blocked)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        _release(fifos, thread)
        pytest.fail(f"still reading after {seconds} s: a reader waited on a FIFO ({', '.join(map(str, fifos))})")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _release(fifos: list[Path], thread: threading.Thread, seconds: float = 30) -> None:
    """Open each FIFO for writing and close it while `thread` runs: a reader waiting in open() goes on."""
    end = time.monotonic() + seconds
    while thread.is_alive() and time.monotonic() < end:
        for fifo in fifos:
            if not fifo.is_fifo():
                continue
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: no reader has it open now
                    raise
        thread.join(0.01)

"""The interpreter's switch interval, shortened while a background writer works.

A thread that wants the GIL while another runs Python waits until the holder gives it up: at the
latest after `sys.getswitchinterval()`, 5 ms by default. The training thread gives up and retakes
the GIL at every torch op, so while the writer thread works out a commit in Python each op of a
step could be held back that long. While it works, the writer shortens the interval
(docs/trl.md, "Seventh pass").
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

WORKING_SWITCH_INTERVAL = 0.0005


_switch_lock = threading.Lock()
_switch_users = 0  # writers working now (every probe of the process has its own)
_switch_saved = 0.0  # the interval before the first of them started
_switch_ours: float | None = None  # the interval as set (read back: it is kept in microseconds)


@contextlib.contextmanager
def short_switch_interval() -> Iterator[None]:
    """sys.setswitchinterval(WORKING_SWITCH_INTERVAL) while any writer of this process works; the
    interval found before is put back when the last one is done, unless someone changed it meanwhile."""
    global _switch_users, _switch_saved, _switch_ours
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved, _switch_ours = sys.getswitchinterval(), None
            if _switch_saved > WORKING_SWITCH_INTERVAL:
                sys.setswitchinterval(WORKING_SWITCH_INTERVAL)
                _switch_ours = sys.getswitchinterval()
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0 and _switch_ours is not None and sys.getswitchinterval() == _switch_ours:
                sys.setswitchinterval(_switch_saved)

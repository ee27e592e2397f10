"""What the training thread hands the background writer, and what the writer's helpers read of it.

LeafJob (one leaf's snapshot) and SaveCall (one save() call) are made by Probe and taken by
writer.BackgroundWriter; key_data_rows and writer_process work on them with the writer's
state. The types live here, below all of those modules, so none of them imports another for its
annotations (tests/test_structure.py counts those imports too).

Last, short_switch_interval: the interpreter's switch interval, shortened while the background writer works.
A thread that wants the GIL while another runs Python waits until the holder gives it up: at the latest after
`sys.getswitchinterval()`, 5 ms by default. The training thread gives up and retakes the GIL at every torch
op, so while the writer thread works out a commit in Python each op of a step could be held back that long
(docs/trl.md, "Seventh pass").
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from rlprobe.frameworks.base import StagedLeaf
from rlprobe.lake.layout import DumpLayout
from rlprobe.lake.samples import CallIdentity

@dataclass
class LeafJob:
    key: str
    index: str
    micro_step: int
    framework: str | None
    leaf: StagedLeaf | None  # None: the value was None (absent)


@dataclass
class SaveCall:
    """One save() call as the writer takes it: the step's `call`-th, its staged leaves and identity."""

    layout: DumpLayout
    step: int
    jobs: list[LeafJob]
    save_tensors: bool
    identity: CallIdentity | None
    call: int


class WriterProcessHandle(Protocol):
    """What the writer asks of its writer process (capture/writer_process.WriterProcess)."""

    def session(self) -> int: ...


class WriterState(Protocol):
    """What the writer's helpers read of writer.BackgroundWriter: where rows go, the sample counts, the
    writer process (None: this thread works the calls out), and how errors are reported."""

    sink: Any  # lake.rank_writer.RankWriter
    samples: Any  # lake.samples.OccurrenceCounter
    samples_remote: bool
    process: Any  # writer_process.WriterProcess | None
    session: int

    def report(self, errors: list[str]) -> None: ...


class MonitoredProbe(Protocol):
    """What the monitors (grads.py, params.py, stages.py) use of capture.probe.Probe: its
    place in the run, its writer, and the few public methods that keep a step's bookkeeping."""

    layout: DumpLayout
    rank: int
    current_step: int
    framework: str | None
    writer: Any  # writer.BackgroundWriter

    @property
    def closed(self) -> bool: ...

    def wrote_rows(self) -> None: ...

    def usable(self, where: str) -> bool: ...

    def raise_background_errors(self) -> None: ...

    def fail(self, message: str) -> None: ...


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

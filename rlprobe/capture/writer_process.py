"""The writer process: key data's statistics, hashes, sample rows and .npy files, computed outside
the training process, so that this Python work never holds the GIL the training thread needs.

Why a process: the training thread of a CPU (or any Python-heavy) step runs many short torch
ops, each releasing and re-taking the GIL; whenever the probe's writer thread held it, the
training thread waited, so the writer's whole Python time was added to the step (issue 15,
docs/trl.md "Overhead"). Here the writer thread only forwards a save call's description (keys,
dtypes, shapes, where each snapshot lies in the host staging ring, which is shared memory)
and waits, without the GIL, for the rows and messages; it adds them to the rank's buffers as
before, so commits, parts, the manifest and their order are unchanged.

One helper per training process, started with the first probe (a fresh interpreter through
subprocess: no fork of a process with torch's threads, no re-import of the user's script),
shared by that process's probes. It reads requests until its pipe closes: when the training
process exits or is killed, it stops after at most the file it is writing (atomically, as
always), and it checks between files that its parent still lives. Where there is no memfd (not
Linux), the helper cannot start, a snapshot is not in the ring (a device tensor, one larger than
the ring) or RLPROBE_WRITER_PROCESS is not 1, the writer thread does the work itself. A
helper that dies is reported (the step in progress is marked incomplete) and the writer thread
takes over.
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
import struct
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rlprobe.capture.calls import LeafJob, SaveCall, WriterState
    from rlprobe.lake.layout import DumpLayout
    from rlprobe.lake.samples import CallIdentity

# "1": a helper process works out key data. Default (unset, "0"): the writer thread does everything;
# measured cheaper in all once the file work per tensor was cut (docs/trl.md, "Overhead", third pass)
ENV = "RLPROBE_WRITER_PROCESS"
HEADER = struct.Struct("<Q")


class WriterProcessDied(RuntimeError):
    """The writer process stopped answering; `started`: whether it had ever been ready (work may be lost)."""

    def __init__(self, message: str, started: bool = True):
        super().__init__(message)
        self.started = started


class WriterProcess:
    """The training process's end of the helper: `call(request)` returns its reply."""

    def __init__(self, ring: Any):
        self.ring = ring
        requests_r, self._requests = os.pipe()
        self._replies, replies_w = os.pipe()
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                                          if p))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rlprobe.capture.writer_helper", str(requests_r), str(replies_w),
                 str(ring.fd), str(ring.capacity), str(os.getpid())],
                pass_fds=(requests_r, replies_w, ring.fd), stdin=subprocess.DEVNULL, env=env, close_fds=True)
        finally:
            os.close(requests_r)
            os.close(replies_w)
        self.pid = os.getpid()
        self._fds: tuple[int, ...] = (self._requests, self._replies)
        self._lock = threading.Lock()
        self._sessions = itertools.count()
        self.dead: str | None = None  # why it can no longer be used
        self._ready = False  # it has said it is ready (its imports done): a failure now may lose work

    def session(self) -> int:
        return next(self._sessions)

    def call(self, request: Any) -> Any:
        """Send `request`, wait (without the GIL) for the reply; WriterProcessDied when it cannot answer."""
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self.dead is not None:
                raise WriterProcessDied(self.dead, self._ready)
            try:
                if not self._ready:
                    read_exactly(self._replies, 1)
                    self._ready = True
                write_all(self._requests, HEADER.pack(len(data)) + data)
                size = HEADER.unpack(read_exactly(self._replies, HEADER.size))[0]
                reply = read_exactly(self._replies, size)
            except (OSError, EOFError) as e:
                self.dead = f"the rlprobe writer process (pid {self.process.pid}) {self._exit_status()} ({e})"
                self._close_pipes()
                raise WriterProcessDied(self.dead, self._ready) from None
        return pickle.loads(reply)

    def _exit_status(self) -> str:
        try:
            code = self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        return f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"

    def _close_pipes(self) -> None:
        fds, self._fds = self._fds, ()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def stop(self) -> None:
        """Close its pipe (it exits when it has read to the end) and wait for it."""
        with self._lock:
            self.dead = self.dead or "the rlprobe writer process was stopped"
            self._close_pipes()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def forget_in_child(self) -> None:
        """After fork: the child must neither use nor keep open the parent's pipes."""
        self.dead = "a forked child does not use its parent's writer process"
        self._close_pipes()


def prepare_calls(writer: WriterState, calls: list[SaveCall]) -> list[Callable[[], None]]:
    """The writer thread's preparation of deferred save calls (capture/writer.py, _run_deferred):
    worked out together on the thread (capture/key_data_rows.py), or, with a writer process, each
    sent there when it is published, as before. Returns, per call, what publishes its rows."""
    from rlprobe.capture.key_data_rows import prepare_here

    if writer.process is None and not writer.samples_remote:
        return prepare_here(writer, calls)
    return [partial(write_call, writer, c.layout, c.step, c.jobs, c.save_tensors, c.identity, c.call)
            for c in calls]


def write_call(writer: WriterState, layout: DumpLayout, step: int, jobs: list[LeafJob], save_tensors: bool,
               identity: CallIdentity | None, call: int = 0) -> None:
    """Writer-thread job for the step's `call`-th save call: its sample rows (with an identity) and key
    data, worked out by the writer process when every snapshot lies in the host staging ring, else here."""
    process = writer.process
    if process is not None:
        described = _ring_jobs(process.ring, jobs)
        try:
            if described is not None:
                _write_in_process(writer, process, step, jobs, described, save_tensors, identity, call)
                return
            if writer.samples_remote:  # this call is done here: the counts come back first
                writer.samples = end_session(writer) or writer.samples
        except WriterProcessDied as e:
            writer.process = None
            if not e.started:  # it never ran (an interpreter that cannot start it): nothing was lost
                write_call(writer, layout, step, jobs, save_tensors, identity, call)
                return
            if writer.samples_remote:  # the step's occurrence counts went with the process
                from rlprobe.lake.samples import OccurrenceCounter

                writer.samples_remote = False
                writer.samples = OccurrenceCounter()
            message = f"rlprobe writer: {e}; step {step} is not committed, the writer thread does the rest"
            writer.sink.record_error(message, {"step": step, "what": "rows"}, incomplete_step=step)
            writer.report([message])
    from rlprobe.capture.key_data_rows import write_key_data, write_samples_and_key_data

    if identity is not None:
        write_samples_and_key_data(writer, layout, step, jobs, save_tensors, identity, call)
    else:
        write_key_data(writer, layout, step, jobs, save_tensors, call)


def end_session(writer: WriterState) -> Any:
    """Forget one probe's state in the writer process; returns its occurrence counts (None when
    it holds none or is gone). After the probe's last call, and before a call done on the thread."""
    process, remote, writer.samples_remote = writer.process, writer.samples_remote, False
    if process is None or not remote:
        return None
    try:
        return process.call({"what": "end", "session": writer.session})
    except WriterProcessDied:
        return None


def _release(jobs: list[LeafJob]) -> None:
    for job in jobs:
        if job.leaf is not None:
            job.leaf.raw = None
            if job.leaf.release is not None:
                job.leaf.release()


def _ring_jobs(ring: Any, jobs: list[LeafJob]) -> list[tuple[Any, ...]] | None:
    """The jobs as the writer process takes them (each snapshot by its place in the ring); None
    when one is elsewhere (a device tensor's pinned copy, a buffer of its own)."""
    out = []
    for job in jobs:
        leaf, where = job.leaf, None
        if leaf is not None:
            if leaf.finish is not None or leaf.raw is None:
                return None
            offset = ring.offset_of(leaf.raw)
            if offset is None:
                return None
            where = (leaf.dtype, leaf.shape, leaf.raw.dtype.str, offset, leaf.raw.nbytes)
        out.append((job.key, job.index, job.micro_step, job.framework, where))
    return out


def _write_in_process(writer: WriterState, process: WriterProcess, step: int, jobs: list[LeafJob],
                      described: list[tuple[Any, ...]], save_tensors: bool, identity: CallIdentity | None,
                      call: int) -> None:
    sink = writer.sink
    request = {"what": "key_data", "session": writer.session, "root": os.fspath(sink.layout.root),
               "rank": sink.rank, "step": step, "call": call, "jobs": described, "save_tensors": save_tensors,
               "identity": identity, "samples": None if writer.samples_remote else writer.samples}
    try:
        reply = process.call(request)
    except WriterProcessDied:
        raise  # the snapshots stay: the writer thread writes them instead
    except BaseException:
        _release(jobs)
        raise
    _release(jobs)  # read by the process: their ring slots go back
    writer.samples_remote = True
    for op in reply[1]:  # what the jobs did to the sink there, in order
        if op[0] == "table":
            sink.add_row(op[1], read_table(op[2]))
        elif op[0] == "row":
            sink.add_row(op[1], op[2])
        elif op[0] == "tensor":
            sink.count_tensor(op[1], op[2])
        elif op[0] == "error":
            sink.record_error(op[1], op[2], op[3])
        else:
            writer.report(op[1])
    if reply[0] == "failed":
        raise RuntimeError(reply[2])


_process: WriterProcess | None = None
_process_lock = threading.Lock()


def writer_process() -> WriterProcess | None:
    """This process's helper (started on first use) when RLPROBE_WRITER_PROCESS=1; None where it is
    not switched on or cannot run."""
    global _process
    if os.environ.get(ENV, "0") != "1":
        return None
    with _process_lock:
        if _process is not None and _process.pid == os.getpid() and _process.dead is None:
            return _process
        from rlprobe.frameworks.staging import host_ring

        ring = host_ring()
        if ring.fd is None or not sys.executable:
            return None
        try:
            _process = WriterProcess(ring)
        except OSError:
            return None
        if not getattr(writer_process, "_hooks", False):
            writer_process._hooks = True  # type: ignore[attr-defined]
            atexit.register(_stop_at_exit)
            os.register_at_fork(after_in_child=_forget_in_child)
        return _process


def _stop_at_exit() -> None:
    if _process is not None and _process.pid == os.getpid():
        _process.stop()


def _forget_in_child() -> None:
    if _process is not None:
        _process.forget_in_child()


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_exactly(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_table(data: bytes) -> Any:
    """A "table" op's rows."""
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all()

"""What runs in the writer process (capture/writer_process.py): requests in, rows and what was
done out, read and written through the pipes the training process gave it.

Each request is one save call whose snapshots lie in the host staging ring (mapped here read
only); the writer thread's own job functions (capture/writer.py) run on it, against a sink that
writes the tensor files for real and records the rest (rows, errors, counts) for the training
process to replay in order. Rows go back as one Arrow table per kind in IPC bytes.
"""

from __future__ import annotations

import mmap
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rlprobe.capture.writer_process import HEADER, read_exactly, write_all


class _RecordingSink:
    """What the writer's jobs call on a RankWriter, recorded for the training process to replay;
    tensor files are written here, for real."""

    def __init__(self, root: str, rank: int, parent: int):
        from rlprobe.lake.layout import DumpLayout

        self.layout, self.rank, self._root, self._parent = DumpLayout(Path(root)), rank, root, parent
        self.ops: list[tuple[Any, ...]] = []

    def write_tensor(self, path: str, array: np.ndarray) -> str:
        from rlprobe.lake.atomic import atomic_save_npy

        self._check_parent()
        self.ops.append(("tensor", atomic_save_npy(os.path.join(self._root, path), array), 1))
        return path

    def write_into(self, folder: Any, name: str, array: np.ndarray) -> Any:
        self._check_parent()
        return folder.save_npy(name, array)  # a packed file's record: (offset, length)

    def commit_folder(self, folder: Any) -> None:
        self._check_parent()
        folder.commit()
        self.ops.append(("tensor", folder.nbytes, folder.files))

    def _check_parent(self) -> None:
        if os.getppid() != self._parent:  # the training process is gone: write nothing more
            os._exit(0)

    def add_row(self, kind: str, row: Any) -> None:
        self.ops.append(("row", kind, row))

    def record_error(self, message: str, lost: Any = None, incomplete_step: int | None = None) -> None:
        self.ops.append(("error", message, lost, incomplete_step))


class _Session:
    """The writer-side object the jobs of one probe see (sink, samples, report)."""

    def __init__(self, sink: _RecordingSink, samples: Any):
        self.sink, self.samples = sink, samples

    def report(self, errors: list[str]) -> None:
        if errors:
            self.sink.ops.append(("report", errors))


def _columnar(ops: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The ops with each kind's rows as one Arrow table in IPC bytes ("table" ops): the training
    process reads them back in a few calls, where unpickling row dicts and tabulating them at
    the next commit held its GIL for milliseconds. Rows that do not fit the schema stay dicts, for
    the RankWriter to record as it does its own."""
    import pyarrow as pa

    from rlprobe.lake.schema import schema_for

    rows: dict[str, list[Any]] = {}
    rest = []
    for op in ops:
        if op[0] == "row":
            rows.setdefault(op[1], []).append(op[2])
        else:
            rest.append(op)
    out = []
    for kind, items in rows.items():
        tables = [r for r in items if isinstance(r, pa.Table)]
        dicts = [r for r in items if not isinstance(r, pa.Table)]
        if dicts:
            try:
                tables.append(pa.Table.from_pylist(dicts, schema=schema_for(kind)))
            except (pa.ArrowException, TypeError, ValueError, OverflowError, UnicodeError):
                out.extend(("row", kind, r) for r in dicts)
        for table in tables:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as stream:
                stream.write_table(table)
            out.append(("table", kind, sink.getvalue().to_pybytes()))
    return out + rest


def _serve(requests: int, replies: int, ring_fd: int, capacity: int, parent: int) -> None:
    from rlprobe.capture.key_data_rows import write_key_data, write_samples_and_key_data
    from rlprobe.capture.calls import LeafJob
    from rlprobe.frameworks.base import StagedLeaf
    from rlprobe.lake.samples import OccurrenceCounter

    ring = np.frombuffer(mmap.mmap(ring_fd, capacity, access=mmap.ACCESS_READ), np.uint8)
    counters: dict[int, Any] = {}
    write_all(replies, b"r")  # ready: a process that fails before this has lost no work
    while True:
        try:
            size = HEADER.unpack(read_exactly(requests, HEADER.size))[0]
            request = pickle.loads(read_exactly(requests, size))
        except EOFError:
            return
        if os.getppid() != parent:
            return
        what, session = request["what"], request["session"]
        if what == "end":
            reply: Any = counters.pop(session, None)
        else:  # "key_data"
            if request.get("samples") is not None:
                counters[session] = request["samples"]
            sink = _RecordingSink(request["root"], request["rank"], parent)
            state = _Session(sink, counters.setdefault(session, OccurrenceCounter()))
            jobs = []
            for key, index, micro_step, framework, leaf in request["jobs"]:
                if leaf is not None:
                    dtype, shape, raw_dtype, offset, nbytes = leaf
                    raw = ring[offset:offset + nbytes].view(raw_dtype).reshape(shape)
                    leaf = StagedLeaf(dtype, shape, raw, nbytes=nbytes)
                jobs.append(LeafJob(key, index, micro_step, framework, leaf))
            try:
                if request["identity"] is not None:
                    write_samples_and_key_data(state, None, request["step"], jobs, request["save_tensors"],
                                               request["identity"], request["call"])
                else:
                    write_key_data(state, None, request["step"], jobs, request["save_tensors"], request["call"])
                reply = ("ok", _columnar(sink.ops))
            except Exception as e:  # the training process handles it as the writer thread's own failure
                reply = ("failed", _columnar(sink.ops), f"{type(e).__name__}: {e}")
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            write_all(replies, HEADER.pack(len(data)) + data)
        except OSError:
            return


if __name__ == "__main__":
    _serve(*(int(a) for a in sys.argv[1:6]))

"""The writer's work for save() calls: sample rows, statistics, hashes and packed tensor files of key data.

The writer thread takes the calls of several steps at once (capture/writer.py, `defer`): their
sample rows are one table and their small tensors' statistics one pass, sliced per call, so a
step's fixed costs (the Python and numpy calls per table or stack, which hold the GIL the
training thread needs) are shared by the steps of a commit. What each call adds to the rank's
buffers is then published in the order the calls were made, between the ends of their steps,
so commits and parts hold what they held when each call was a job of its own.
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from rlprobe.capture.calls import LeafJob, SaveCall, WriterState
from rlprobe.capture.key_data_rows import key_data_tables, null_lost_files
from rlprobe.lake.tensor_pack import TensorPack
from rlprobe.lake.layout import DumpLayout, key_data_pack
from rlprobe.lake.samples import CallIdentity, sample_tables_of_calls

if TYPE_CHECKING:
    import pyarrow as pa




def prepare_here(writer: WriterState, calls: list[SaveCall]) -> list[Callable[[], None]]:
    """Work out `calls` together on this thread (or in the writer process, whose `writer` is its own
    session); returns, per call, what publishes its rows (to run in call order)."""
    for c in calls:
        for job in c.jobs:
            if job.leaf is not None and job.leaf.finish is not None:
                job.leaf.finish()
                job.leaf.finish = None
    samples: dict[int, pa.Table] = {}
    identified = [c for c in calls if c.identity is not None]
    if identified:
        try:  # while the host copies exist: the key data's pass below releases them
            tables = sample_tables_of_calls([(c.identity, c.jobs, c.step) for c in identified], writer.samples)
            samples = {id(c): t for c, t in zip(identified, tables)}
        except Exception as e:  # the key data is still written; the steps are marked incomplete
            for step in sorted({c.step for c in identified}):
                message = f"step {step}: sample rows not written: {type(e).__name__}: {e}"
                writer.sink.record_error(message, {"step": step, "what": "sample rows"}, incomplete_step=step)
                writer.report([message])
    key_data = _key_data_of_calls(writer, calls)
    return [partial(_publish, writer, samples.get(id(c)), *planned) for c, planned in zip(calls, key_data)]


def write_save_calls(writer: WriterState, calls: list[SaveCall]) -> None:
    """Writer-thread job for save calls: worked out together, published in order."""
    for publish in prepare_here(writer, calls):
        publish()


def write_samples_and_key_data(writer: WriterState, layout: DumpLayout | None, step: int, jobs: list[LeafJob],
                               save_tensors: bool, identity: CallIdentity, call: int = 0) -> None:
    """One save call's `sample` rows (lake/samples.py), then its key data (write_key_data)."""
    write_save_calls(writer, [SaveCall(layout, step, jobs, save_tensors, identity, call)])  # type: ignore[arg-type]


def write_key_data(writer: WriterState, layout: DumpLayout | None, step: int, jobs: list[LeafJob],
                   save_tensors: bool, call: int = 0) -> None:
    """Writer-thread job for one save call (the step's `call`-th). A None value becomes a row marked
    absent: its key, step, micro_step and index, and nothing else. The call's tensors go into one
    packed file, renamed into place when all are written (docs/dump-format.md, "Files")."""
    write_save_calls(writer, [SaveCall(layout, step, jobs, save_tensors, None, call)])  # type: ignore[arg-type]


def _key_data_of_calls(writer: WriterState, calls: list[SaveCall]) -> list[
        tuple[TensorPack | None, str | None, bool, pa.Table]]:
    """Per call: its packed file (records written into it) and path, whether the call renames it into place,
    and its rows (capture/key_data_rows.py). The calls taken together share one packed file, named after
    the first of them and the last step (docs/dump-format.md, change 14): the steps of a commit create one
    file, not a file and two folders each."""
    sink = writer.sink
    with_tensors = [c for c in calls if c.save_tensors]
    pack_path, pack = None, None
    if with_tensors:
        first = with_tensors[0]
        pack_path = key_data_pack(sink.rank, first.step, first.call, with_tensors[-1].step)
        pack = TensorPack(os.path.join(os.fspath(sink.layout.root), pack_path))
    tables = key_data_tables(writer, calls, pack, pack_path)
    return [(pack, pack_path, c is with_tensors[0], table) if c.save_tensors else (None, None, False, table)
            for c, table in zip(calls, tables)]


def _publish(writer: WriterState, samples: pa.Table | None, pack: TensorPack | None, pack_path: str | None,
             owner: bool, rows: pa.Table) -> None:
    """One call's rows into the rank's buffers (sample rows, then key data). The first call of its packed
    file (`owner`) renames it into place first, holding the records of the batch's later calls too (all
    written before any call is published); if that fails, every call's rows in it keep their statistics,
    without files."""
    sink = writer.sink
    if samples is not None:
        sink.add_row("sample", samples)
    if pack is not None:
        errors: list[str] = []
        try:
            if owner:
                sink.commit_folder(pack)
            elif pack.lost is not None:
                raise pack.lost
        except OSError as e:
            rows = null_lost_files(rows, pack, pack_path, sink, errors, e)  # type: ignore[arg-type]
        writer.report(errors)
    if rows.num_rows:
        sink.add_row("key_data", rows)

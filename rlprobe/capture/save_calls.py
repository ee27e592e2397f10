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
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from rlprobe.capture.writer import TensorRow, folder_lost, tensor_rows_of
from rlprobe.lake.tensor_pack import TensorPack
from rlprobe.lake.layout import DumpLayout, key_data_file_name, key_data_pack
from rlprobe.lake.samples import CallIdentity, sample_tables_of_calls

if TYPE_CHECKING:
    import pyarrow as pa

    from rlprobe.capture.writer import BackgroundWriter, LeafJob


@dataclass
class SaveCall:
    """One save() call as the writer takes it: the step's `call`-th, its staged leaves and identity."""

    layout: DumpLayout
    step: int
    jobs: list[LeafJob]
    save_tensors: bool
    identity: CallIdentity | None
    call: int


def prepare_here(writer: BackgroundWriter, calls: list[SaveCall]) -> list[Callable[[], None]]:
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


def write_save_calls(writer: BackgroundWriter, calls: list[SaveCall]) -> None:
    """Writer-thread job for save calls: worked out together, published in order."""
    for publish in prepare_here(writer, calls):
        publish()


def write_samples_and_key_data(writer: BackgroundWriter, layout: DumpLayout | None, step: int, jobs: list[LeafJob],
                               save_tensors: bool, identity: CallIdentity, call: int = 0) -> None:
    """One save call's `sample` rows (lake/samples.py), then its key data (write_key_data)."""
    write_save_calls(writer, [SaveCall(layout, step, jobs, save_tensors, identity, call)])  # type: ignore[arg-type]


def write_key_data(writer: BackgroundWriter, layout: DumpLayout | None, step: int, jobs: list[LeafJob],
                   save_tensors: bool, call: int = 0) -> None:
    """Writer-thread job for one save call (the step's `call`-th). A None value becomes a row marked
    absent: its key, step, micro_step and index, and nothing else. The call's tensors go into one
    packed file, renamed into place when all are written (docs/dump-format.md, "Files")."""
    write_save_calls(writer, [SaveCall(layout, step, jobs, save_tensors, None, call)])  # type: ignore[arg-type]


def _key_data_of_calls(writer: BackgroundWriter, calls: list[SaveCall]) -> list[
        tuple[TensorPack | None, bool, list[dict[str, Any]], list[dict[str, Any]], list[str]]]:
    """Per call: its packed file (records written into it), whether the call renames it into place, its
    absent rows, its tensor rows and errors. The calls taken together share one packed file, named after
    the first of them and the last step (docs/dump-format.md, change 14): the steps of a commit create one
    file, not a file and two folders each. The small tensors of all calls are reduced together
    (capture/writer.py, tensor_rows_of)."""
    sink = writer.sink
    planned: list[tuple[TensorPack | None, bool, list[dict[str, Any]], list[TensorRow]]] = []
    with_tensors = [c for c in calls if c.save_tensors]
    pack_path, pack = None, None
    if with_tensors:
        first = with_tensors[0]
        pack_path = key_data_pack(sink.rank, first.step, first.call, with_tensors[-1].step)
        pack = TensorPack(os.path.join(os.fspath(sink.layout.root), pack_path))
    for c in calls:
        folder, owner = (pack, c is with_tensors[0]) if c.save_tensors else (None, False)
        absent, items = [], []
        for job in c.jobs:
            keys = {"key": job.key, "step": c.step, "micro_step": job.micro_step, "index": job.index,
                    "framework": job.framework}
            if job.leaf is None:
                absent.append({**keys, "absent": True})
                continue
            name = key_data_file_name(job.key, job.index) if folder else None
            items.append(TensorRow(
                job.leaf, {**keys, "absent": False},
                f"key {job.key!r} step {c.step} micro_step {job.micro_step}"
                + (f" index {job.index!r}" if job.index else ""),
                pack_path if folder else None, name, folder))
        planned.append((folder, owner, absent, items))
    errors: list[str] = []
    done = dict(tensor_rows_of(writer, [item for *_, items in planned for item in items], "key_data", errors))
    writer.report(errors)
    return [(folder, owner, absent, [done[id(item)] for item in items if id(item) in done], [])
            for folder, owner, absent, items in planned]


def _publish(writer: BackgroundWriter, samples: pa.Table | None, folder: TensorPack | None, owner: bool,
             absent: list[dict[str, Any]], rows: list[dict[str, Any]], errors: list[str]) -> None:
    """One call's rows into the rank's buffers (sample rows, then key data: absent rows first). The
    first call of its packed file (`owner`) renames it into place first, holding the records of the
    step's later calls too (all written before any call is published); if that fails, every call's rows
    in it keep their statistics, without files."""
    sink = writer.sink
    if samples is not None:
        sink.add_row("sample", samples)
    if folder is not None:
        try:
            if owner:
                sink.commit_folder(folder)
            elif folder.lost is not None:
                raise folder.lost
        except OSError as e:
            folder_lost(folder, rows, "key_data", sink, errors, e)
    for row in absent + rows:
        sink.add_row("key_data", row)
    writer.report(errors)

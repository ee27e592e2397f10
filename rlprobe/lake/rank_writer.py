"""Everything one rank writes into a dump: tensors, stats parts and its manifest.

Used from a single thread (the probe's background writer, or an importer). Rows are
buffered per kind and written as one Parquet part per flush; a failed part write keeps its
rows buffered for the next flush, so a transient error (a full disk that is cleared) loses
nothing and a permanent one is recorded in the rank manifest. Ended steps wait in
`pending_steps` until the flush that writes their rows commits them, so `committed_steps`
never names a step whose rows are not on disk; a step that lost a row for good (a job that
failed, a row no part can hold) is never committed: it is listed in `incomplete_steps`, and
readers, which show committed steps only, leave its other rows out too.

`rlprobe compact` (compact) merges every rank's stats parts into one and removes leftovers. A rank is
compacted only while this process holds its lock (lake/rank_lock.py): a rank whose writer is alive is left
exactly as it is and named in `refused`, so compact can never merge parts a live writer is still adding to or
merging, nor delete its temporary files. A killed or finished run's ranks are free and are compacted. With the
lock of every free rank held, every part of those ranks is read whole before anything is merged
(lake/parts.py, conform): a damaged or foreign part stops compact with DumpReadError and no file changed, since
merging it would fail half-way or mix foreign rows into the rank's own part. The locks are held from that check
until each rank's merge, so the parts checked are the parts merged.
"""

from __future__ import annotations

import bisect
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rlprobe._version import __version__
from rlprobe.errors import DumpReadError
from rlprobe.lake.atomic import AtomicFolder, atomic_save_npy, atomic_write_json, is_temporary
from rlprobe.lake.layout import FORMAT_VERSION, KINDS, PACK_SUFFIX, DumpLayout, live_parts_in, pack_steps
from rlprobe.lake.parts import PartStore
from rlprobe.lake.rank_lock import RankLock, RankLocked
from rlprobe.lake.schema import schema_for, step_column
from rlprobe.lake.tensor_pack import TensorPack

class RankWriter:
    def __init__(self, layout: DumpLayout, rank: int, world_size: int, run_id: str, info: dict[str, Any],
                 previous: dict[str, Any] | None = None, lock: RankLock | None = None):
        self.layout = layout
        self._root = os.fspath(layout.root)
        self.lock = lock  # held for as long as this writer lives (its owner releases it)
        self.rank = rank
        self.world_size = world_size
        self.run_id = run_id
        self.buffers: dict[str, list[dict[str, Any]]] = {}
        self.stores: dict[str, PartStore] = {}
        self.pending_steps: list[int] = []  # ended, not yet committed
        self.written_steps: set[int] = set()  # steps with rows in a part this writer wrote
        self.last_flush = time.monotonic()
        prev = previous or {}
        self.manifest: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "run_id": run_id,
            "rank": rank,
            "world_size": world_size,
            "rlprobe_version": __version__,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": prev.get("started_at", time.time()),
            "updated_at": time.time(),
            "closed": False,
            "committed_steps": list(prev.get("committed_steps", [])),
            "incomplete_steps": list(prev.get("incomplete_steps", [])),
            "rows": dict(prev.get("rows", {})),
            "tensor_files": prev.get("tensor_files", 0),
            "tensor_bytes": prev.get("tensor_bytes", 0),
            "errors": list(prev.get("errors", [])),
            "lost": list(prev.get("lost", [])),
            **info,
        }

    # -- tensors -------------------------------------------------------------------------
    def write_tensor(self, path: Path | str, array: np.ndarray) -> str:
        """Write one .npy atomically; returns its path relative to the dump root. `path`: a Path,
        or a str relative to the dump root with POSIX separators (no pathlib work per file)."""
        if isinstance(path, str):
            size = atomic_save_npy(os.path.join(self._root, path), array)
            relative = path
        else:
            size = atomic_save_npy(path, array)
            relative = path.relative_to(self.layout.root).as_posix()
        self.count_tensor(size)
        return relative

    def write_into(self, folder: AtomicFolder | TensorPack, name: str, array: np.ndarray) -> int | tuple[int, int]:
        """Write one .npy into a save call's folder, or one record into its packed file (then its
        offset and length are returned); counted when the folder or file is committed."""
        return folder.save_npy(name, array)

    def commit_folder(self, folder: AtomicFolder | TensorPack) -> None:
        """Rename a save call's folder (or packed file) into place and count its files."""
        folder.commit()
        self.count_tensor(folder.nbytes, folder.files)

    def count_tensor(self, nbytes: int, files: int = 1) -> None:
        """Count tensor files of `nbytes` in all in the manifest (ones the writer process wrote, say)."""
        self.manifest["tensor_files"] += files
        self.manifest["tensor_bytes"] += nbytes

    # -- stats rows ----------------------------------------------------------------------
    def add_row(self, kind: str, row: dict[str, Any] | pa.Table) -> None:
        self.buffers.setdefault(kind, []).append(row)

    def has_rows(self) -> bool:
        return any(self.buffers.values())

    def _store(self, kind: str) -> PartStore:
        if kind not in self.stores:
            self.stores[kind] = PartStore(self.layout.stats_dir(kind, self.rank))
        return self.stores[kind]

    def end_step(self, step: int) -> None:
        """Mark `step` ended: the next successful flush commits it."""
        self.pending_steps.append(step)

    def flush(self, committed_step: int | None = None) -> list[str]:
        """Write buffered rows as one part per kind, commit the ended steps (and `committed_step`)
        when every part was written, and update the manifest; returns errors."""
        if committed_step is not None:
            self.end_step(committed_step)
        self.last_flush = time.monotonic()
        errors: list[str] = []
        unwritten = False  # a part failed: its rows wait in the buffer, so its steps cannot be committed
        for kind, rows in self.buffers.items():
            if not rows:
                continue
            store = self._store(kind)
            table = self._table(kind, rows, errors)
            try:
                if table.num_rows:
                    store.append(table)
            except OSError as e:
                errors.append(f"writing {kind} stats part in {store.directory}: {e}; rows kept for the next flush")
                unwritten = True
                continue
            self.manifest["rows"][kind] = self.manifest["rows"].get(kind, 0) + table.num_rows
            self.written_steps.update(s for s in table[step_column(kind)].unique().to_pylist() if s is not None)
            self.buffers[kind] = []
            try:
                store.merge_tiered()
            except (OSError, DumpReadError) as e:  # the unmerged parts stay readable
                errors.append(f"merging {kind} parts in {store.directory}: {e}")
        if not unwritten:  # every row is on disk (a failed merge leaves the parts readable)
            self._commit(self.pending_steps)
            self.pending_steps.clear()
        errors.extend(self.write_manifest())
        return errors

    def _commit(self, steps: Any) -> None:
        committed, incomplete = self.manifest["committed_steps"], set(self.manifest["incomplete_steps"])
        known = set(committed)
        for s in steps:
            if s not in known and s not in incomplete:
                committed.append(s)
                known.add(s)

    def _table(self, kind: str, rows: list[dict[str, Any]], errors: list[str]) -> pa.Table:
        """The rows as one Arrow table. A row no part can hold (which validation in `save` should
        have refused) is recorded as lost, and its step as incomplete, instead of blocking the
        rows of every later commit."""
        schema = schema_for(kind)
        tables = [r for r in rows if isinstance(r, pa.Table)]  # columnar rows (the sample kind's)
        if tables:
            rest = [r for r in rows if not isinstance(r, pa.Table)]
            return pa.concat_tables([*tables, self._table(kind, rest, errors)] if rest else tables)
        try:
            return pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError, UnicodeError):
            pass
        good = []
        column = step_column(kind)
        for row in rows:
            try:
                pa.Table.from_pylist([row], schema=schema)
            except (pa.ArrowException, TypeError, ValueError, OverflowError, UnicodeError) as e:
                what = {k: row.get(k) for k in ("key", "name", "stage", "module", "monitor", "param") if k in row}
                message = f"{kind} row {_describe(what)} of step {row.get(column)}: cannot be stored ({e})"
                self.record_error(message, {"kind": kind, **what, "step": row.get(column), "what": "row"},
                                  incomplete_step=row.get(column))
                errors.append(message)
                continue
            good.append(row)
        return pa.Table.from_pylist(good, schema=schema)

    def drop_uncommitted(self) -> list[str]:
        """Before resuming a run: remove this rank's rows and tensors of steps that are not
        committed (a killed writer's last steps, an incomplete step), so the resumed steps
        neither duplicate nor contradict them (their tensor files would be overwritten under the
        old rows). Returns errors."""
        committed = set(self.manifest["committed_steps"])
        errors: list[str] = []
        stale_files: list[str] = []
        for kind in self.layout.rank_dirs_for(self.rank):
            try:
                dropped, files = self._store(kind).drop_rows_outside(committed, step_column(kind))
            except (OSError, pa.ArrowException, DumpReadError) as e:
                errors.append(f"removing uncommitted {kind} rows in {self.layout.stats_dir(kind, self.rank)}: {e}")
                continue
            stale_files.extend(files)
            if dropped and kind in self.manifest["rows"]:
                self.manifest["rows"][kind] = max(0, self.manifest["rows"][kind] - dropped)
        # a packed file of key data can hold committed steps beside dropped ones: it goes below, by its steps
        for f in stale_files:
            if not f.endswith(PACK_SUFFIX):
                (self.layout.root / f).unlink(missing_ok=True)
        tensors = self.layout.root / "tensors"
        packs = tensors / "key_data" / f"rank={self.rank}"
        done = sorted(committed)
        for f in packs.glob(f"steps=*{PACK_SUFFIX}") if packs.is_dir() else ():
            steps = pack_steps(f.name)
            if steps is None:
                continue
            at = bisect.bisect_left(done, steps[0])
            if at == len(done) or done[at] > steps[1]:  # none of its steps committed
                f.unlink(missing_ok=True)
        for kind in ("key_data", "module"):  # their step= directories count probe steps
            # key data: step=<S>/rank=<R>; module (and key data written before issue 15): <name>/step=<S>/rank=<R>
            for d in [*(tensors / kind).glob(f"step=*/rank={self.rank}"),
                      *(tensors / kind).glob(f"*/step=*/rank={self.rank}")]:
                try:
                    stale = int(d.parent.name[5:]) not in committed
                except ValueError:
                    continue
                if stale:
                    shutil.rmtree(d, ignore_errors=True)
        self.manifest["incomplete_steps"] = []
        return errors

    def record_error(self, message: str, lost: dict[str, Any] | None = None,
                     incomplete_step: int | None = None) -> None:
        """Record an error (and what was lost); `incomplete_step`: a step that lost a row for good
        and so is never committed."""
        self.manifest["errors"].append(message)
        if lost is not None:
            self.manifest["lost"].append(lost)
        if incomplete_step is not None:
            self._mark_incomplete(incomplete_step)

    def _mark_incomplete(self, step: int) -> None:
        incomplete = self.manifest["incomplete_steps"]
        if step not in incomplete and step not in self.manifest["committed_steps"]:  # a committed step stays so
            incomplete.append(step)

    def write_manifest(self) -> list[str]:
        self.manifest["updated_at"] = time.time()
        try:
            atomic_write_json(self.layout.rank_manifest(self.rank), self.manifest, key_lines=True)
        except OSError as e:
            return [f"writing {self.layout.rank_manifest(self.rank)}: {e}"]
        return []

    def close(self) -> list[str]:
        """Flush what is left, merge every kind into one part, mark the rank closed. Closing is
        final: every step with rows on disk is committed (a scalar logged for a step that never
        ended, say) except the incomplete ones, and steps with rows that could not be written
        become incomplete. So a closed rank without incomplete steps has no uncommitted rows,
        and readers need not filter it."""
        errors = self.flush(None)
        for kind, rows in self.buffers.items():
            if rows:
                column = step_column(kind)  # rows are dicts, or tables (the sample kind's, the writer process's)
                steps = sorted({s for r in rows for s in (r[column].to_pylist() if isinstance(r, pa.Table)
                                                          else [r.get(column)])} - {None})
                count = sum(r.num_rows if isinstance(r, pa.Table) else 1 for r in rows)
                self.record_error(f"{count} {kind} stats rows of steps {steps} could not be written",
                                  {"kind": kind, "rows": count, "steps": steps})
                for step in steps:
                    self._mark_incomplete(step)
        self._commit([*self.pending_steps, *sorted(self.written_steps)])
        self.pending_steps.clear()
        for kind in list(self.layout.rank_dirs_for(self.rank)):
            try:
                self._store(kind).merge_all()
            except (OSError, DumpReadError) as e:
                errors.append(f"merging {kind} parts: {e}")
        self.manifest["closed"] = True
        self.manifest["closed_at"] = time.time()
        errors.extend(self.write_manifest())
        return errors


def _describe(what: dict[str, Any]) -> str:
    return " ".join(f"{k} {v!r}" for k, v in what.items()) or "(no name)"


def compact(root: str | Path) -> dict[str, object]:
    """Merge parts per (kind, rank) of every rank no live process writes; returns the number
    of files before and after, how many hidden leftovers of killed writers were deleted among the
    tensor files (`tensor_leftovers`), and `refused`: one message per rank (or rank directory) left as
    it was. Raises DumpReadError, before merging anything, naming a part that cannot be read whole
    or is not of its kind."""
    layout = DumpLayout(root)
    before = after = leftovers = 0
    refused: list[str] = []
    base = layout.root / "stats"
    kinds = sorted({*KINDS, *(d.name for d in base.iterdir() if d.is_dir())}) if base.is_dir() else []
    by_rank: dict[int, list[tuple[str, Path]]] = {}
    for kind in kinds:
        for rank, directory in layout.rank_dirs(kind).items():
            by_rank.setdefault(rank, []).append((kind, directory))
    locks: dict[int, RankLock] = {}
    try:
        for rank in sorted(by_rank):
            try:
                locks[rank] = RankLock.acquire(layout.root, rank, "rlprobe compact")
            except RankLocked as e:
                refused.append(f"{e}; rank {rank} was not compacted")
        to_merge = {rank: _checked_dirs(by_rank[rank], refused) for rank in locks}
        for rank, directories in to_merge.items():
            for directory in directories:
                before += sum(1 for _ in directory.iterdir())
                PartStore(directory).merge_all()
                after += sum(1 for _ in directory.iterdir())
            leftovers += _remove_tensor_leftovers(layout.root, rank)
            locks.pop(rank).release()
    finally:
        for lock in locks.values():
            lock.release()
    return {"files_before": before, "files_after": after, "tensor_leftovers": leftovers, "refused": refused}


def _remove_tensor_leftovers(root: Path, rank: int) -> int:
    """Delete what a killed writer of `rank` left half-written among its tensor files: hidden temporary
    files and save-call folders (lake/atomic.py), which no reader sees. Returns how many."""
    removed = 0
    for directory in (root / "tensors").glob(f"*/**/rank={rank}"):
        for leftover in [p for p in directory.rglob(".*") if is_temporary(p)]:
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
            removed += 1
    return removed


def _checked_dirs(directories: list[tuple[str, Path]], refused: list[str]) -> list[Path]:
    """The rank directories whose live parts can be merged. Parts that overlap in part (two
    merges at once) leave their directory as it was, named in `refused`; a part that cannot be
    read whole or is not of its kind raises DumpReadError."""
    from rlprobe.lake.parts import part_problem

    checked = []
    for kind, directory in directories:
        try:
            live = live_parts_in(directory)[0]
        except DumpReadError as e:
            refused.append(f"{e}; {directory} was left as it was")
            continue
        for part in live:
            problem = part_problem(part.path, kind, deep=True)
            if problem is not None:
                raise DumpReadError(f"{problem}; nothing was compacted")
        checked.append(directory)
    return checked

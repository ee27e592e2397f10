"""Everything one rank writes into a dump: tensors, stats parts and its manifest.

Used from a single thread (the probe's background writer, or an importer). Rows are
buffered per kind and written as one Parquet part per flush; a failed part write keeps its
rows buffered for the next flush, so a transient error (a full disk that is cleared) loses
nothing and a permanent one is recorded in the rank manifest. Ended steps wait in
`pending_steps` until the flush that writes their rows commits them, so `committed_steps`
never names a step whose rows are not on disk.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rlprobe._version import __version__
from rlprobe.lake.atomic import atomic_save_npy, atomic_write_json
from rlprobe.lake.layout import FORMAT_VERSION, DumpLayout
from rlprobe.lake.parts import PartStore
from rlprobe.lake.schema import schema_for


class RankWriter:
    def __init__(self, layout: DumpLayout, rank: int, world_size: int, run_id: str, info: dict[str, Any],
                 previous: dict[str, Any] | None = None):
        self.layout = layout
        self.rank = rank
        self.world_size = world_size
        self.run_id = run_id
        self.buffers: dict[str, list[dict[str, Any]]] = {}
        self.stores: dict[str, PartStore] = {}
        self.pending_steps: list[int] = []  # ended, not yet committed
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
            "rows": dict(prev.get("rows", {})),
            "tensor_files": prev.get("tensor_files", 0),
            "tensor_bytes": prev.get("tensor_bytes", 0),
            "errors": list(prev.get("errors", [])),
            "lost": list(prev.get("lost", [])),
            **info,
        }

    # -- tensors -------------------------------------------------------------------------
    def write_tensor(self, path: Path, array: np.ndarray) -> str:
        """Write one .npy atomically; returns its path relative to the dump root."""
        size = atomic_save_npy(path, array)
        self.manifest["tensor_files"] += 1
        self.manifest["tensor_bytes"] += size
        return path.relative_to(self.layout.root).as_posix()

    # -- stats rows ----------------------------------------------------------------------
    def add_row(self, kind: str, row: dict[str, Any]) -> None:
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
            try:
                store.append(pa.Table.from_pylist(rows, schema=schema_for(kind)))
            except OSError as e:
                errors.append(f"writing {kind} stats part in {store.directory}: {e}; rows kept for the next flush")
                unwritten = True
                continue
            self.manifest["rows"][kind] = self.manifest["rows"].get(kind, 0) + len(rows)
            self.buffers[kind] = []
            try:
                store.merge_tiered()
            except OSError as e:  # the unmerged parts stay readable
                errors.append(f"merging {kind} parts in {store.directory}: {e}")
        if not unwritten:  # every row is on disk (a failed merge leaves the parts readable)
            committed = self.manifest["committed_steps"]
            committed.extend(s for s in self.pending_steps if s not in committed)
            self.pending_steps.clear()
        errors.extend(self.write_manifest())
        return errors

    def drop_uncommitted(self) -> list[str]:
        """Before resuming a run whose writer was killed: remove this rank's rows and tensors of
        steps after the last committed one, so the resumed steps neither duplicate nor contradict
        them (their tensor files would be overwritten under the old rows). Returns errors."""
        steps = self.manifest["committed_steps"]
        last = max(steps) if steps else -1
        errors: list[str] = []
        for kind in self.layout.rank_dirs_for(self.rank):
            try:
                dropped = self._store(kind).drop_steps_after(last)
            except (OSError, pa.ArrowException) as e:
                errors.append(f"removing uncommitted {kind} rows in {self.layout.stats_dir(kind, self.rank)}: {e}")
                continue
            if dropped and kind in self.manifest["rows"]:
                self.manifest["rows"][kind] = max(0, self.manifest["rows"][kind] - dropped)
        tensors = self.layout.root / "tensors"
        if tensors.is_dir():
            for d in tensors.glob(f"*/*/step=*/rank={self.rank}"):
                try:
                    stale = int(d.parent.name[5:]) > last
                except ValueError:
                    continue
                if stale:
                    shutil.rmtree(d, ignore_errors=True)
        return errors

    def record_error(self, message: str, lost: dict[str, Any] | None = None) -> None:
        self.manifest["errors"].append(message)
        if lost is not None:
            self.manifest["lost"].append(lost)

    def write_manifest(self) -> list[str]:
        self.manifest["updated_at"] = time.time()
        try:
            atomic_write_json(self.layout.rank_manifest(self.rank), self.manifest)
        except OSError as e:
            return [f"writing {self.layout.rank_manifest(self.rank)}: {e}"]
        return []

    def close(self) -> list[str]:
        """Flush what is left, merge every kind into one part, mark the rank closed."""
        errors = self.flush(None)
        for kind in list(self.layout.rank_dirs_for(self.rank)):
            try:
                self._store(kind).merge_all()
            except OSError as e:
                errors.append(f"merging {kind} parts: {e}")
        for kind, rows in self.buffers.items():
            if rows:
                lost = {"kind": kind, "rows": len(rows), "steps": sorted({r.get("step") for r in rows})}
                self.record_error(f"{len(rows)} {kind} stats rows could not be written", lost)
        self.manifest["closed"] = True
        self.manifest["closed_at"] = time.time()
        errors.extend(self.write_manifest())
        return errors

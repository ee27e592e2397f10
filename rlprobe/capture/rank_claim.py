"""Which files of a dump directory belong to this rank, and what `mode` does with an earlier run's:
"new" refuses them, "overwrite" deletes exactly them, "append" continues from their manifest."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from rlprobe.errors import ProbeError
from rlprobe._version import __version__
from rlprobe.lake.atomic import atomic_write_json
from rlprobe.lake.layout import FORMAT_VERSION, DumpLayout
from rlprobe.lake.regular_files import JSON_FILE, read_text


class RankClaim:
    """Rank `rank` of `world_size` taking its place in the dump directory of `layout`."""

    def __init__(self, layout: DumpLayout, rank: int, world_size: int):
        self.layout, self.path, self.rank, self.world_size = layout, layout.root, rank, world_size

    def prepare_directory(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise ProbeError(f"dump path {self.path} is a file; give a directory (it is created if missing)")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe_file = self.path / f".rlprobe-write-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            probe_file.write_bytes(b"")
            probe_file.unlink()
        except OSError as e:
            raise ProbeError(f"dump directory {self.path} is not writable: {e.strerror or e}") from None

    def claim(self, mode: str) -> dict[str, Any] | None:
        """Check for an earlier run of this rank in this directory (its manifest, or its stats
        and tensors without one); returns this rank's old manifest for append."""
        mine = self.layout.rank_manifest(self.rank)
        old = read_json(mine)
        data = [] if mine.exists() else self.rank_data(self.rank)
        holds_run = mine.exists() or bool(data) or (self.rank == 0 and self.layout.run_manifest.exists())
        if not holds_run:
            return None
        if mode == "append":
            version = (old or {}).get("format_version", FORMAT_VERSION)
            if version != FORMAT_VERSION or isinstance(version, bool):  # its rows would mix two formats
                raise ProbeError(f"cannot append to rank {self.rank} of {self.path}: {mine.name} is of format_version "
                                 f"{version!r} and this rlprobe writes format {FORMAT_VERSION} (a newer rlprobe's "
                                 "dump): append with that version, or write to another directory")
            if old is not None:
                return old
            if not mine.exists() and not data:  # rank 0 of a run whose rank manifest was never written
                return None
            why = f"{mine} cannot be read" if mine.exists() else \
                f"its data ({', '.join(data)}) is there but {mine.name} is missing"
            raise ProbeError(f"cannot append to rank {self.rank} of {self.path}: {why}, so which steps were "
                             "committed is unknown; restore it, or pass mode='overwrite' to delete this rank's data")
        if mode == "new":
            if old is None and data:
                raise ProbeError(
                    f"{self.path} already holds data of rank {self.rank} ({', '.join(data)}) but no {mine.name} "
                    "(deleted?); pass mode='overwrite' to delete that data, or choose another directory")
            state = "a finished run" if old and old.get("closed") else "an unfinished run (killed or still running)"
            steps = (old or {}).get("committed_steps") or []
            span = f", steps {min(steps)}-{max(steps)}" if steps else ""
            raise ProbeError(
                f"{self.path} already holds {state} (rank {self.rank}, run_id {(old or {}).get('run_id', '?')}{span}); "
                "pass mode='overwrite' to replace it, mode='append' to add steps to it, or choose another directory"
            )
        self.remove_rank_files(self.rank)
        if self.rank == 0:
            self.layout.run_manifest.unlink(missing_ok=True)
            for r in _ranks_in(self.path) | self.layout.ranks_with_stats():
                if r >= self.world_size:
                    self.remove_rank_files(r)
        return None

    def rank_data(self, rank: int) -> list[str]:
        """Where rank `rank` has stats parts or tensors (relative paths, the first few), without
        walking more of the tensor tree than it must."""
        found = [f"stats/{kind}/rank={rank}" for kind in self.layout.rank_dirs_for(rank)
                 if any(self.layout.stats_dir(kind, rank).iterdir())]
        tensor = self.layout.first_tensor_dir(rank)
        if tensor is not None:
            found.append(tensor.relative_to(self.path).as_posix())
        return found

    def remove_rank_files(self, rank: int) -> None:
        """Delete exactly what rank `rank` of an earlier run wrote, and nothing else."""
        self.layout.rank_manifest(rank).unlink(missing_ok=True)
        self.layout.config_file(rank).unlink(missing_ok=True)
        stats = self.path / "stats"
        if stats.is_dir():
            for kind in stats.iterdir():
                shutil.rmtree(kind / f"rank={rank}", ignore_errors=True)
        tensors = self.path / "tensors"
        if tensors.is_dir():
            for d in list(tensors.rglob(f"rank={rank}")):
                shutil.rmtree(d, ignore_errors=True)


def read_json(path: Path) -> dict[str, Any] | None:
    """A rank's manifest or claim as a JSON object; None where it is missing, unreadable, not an object or not a
    regular file (a FIFO there is never opened for a blocking read: lake/regular_files.py)."""
    try:
        value = json.loads(read_text(path, JSON_FILE))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None  # a list or a number is no manifest


def _ranks_in(root: Path) -> set[int]:
    ranks = set()
    for f in root.glob("rank*.json"):
        try:
            ranks.add(int(f.stem[4:]))
        except ValueError:
            continue
    return ranks


def write_run_manifest(layout: DumpLayout, run_id: str, framework: str | None, world_size: int, stats_only: bool,
                       tags: dict[str, Any], summed_keys: Any, replay_record: dict[str, Any] | None) -> None:
    """Rank 0's run manifest (docs/dump-format.md): the run's identity, its tags and the keys whose step value
    is their micro-batches' sum."""
    atomic_write_json(layout.run_manifest, {
        "format_version": FORMAT_VERSION,
        "run_id": run_id,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "framework": framework or "auto",
        "rlprobe_version": __version__, "world_size": world_size,
        "host": socket.gethostname(), "stats_only": stats_only,
        "tags": tags, "summed_keys": summed_keys,
        **({"replay_from": replay_record} if replay_record else {}),
    })

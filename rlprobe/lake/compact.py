"""`rlprobe compact`: merge every rank's stats parts into one and remove leftovers.

A rank is compacted only while this process holds its lock (lake/rank_lock.py): a rank whose
writer is alive is left exactly as it is and named in `refused`, so compact can never merge
parts a live writer is still adding to or merging, nor delete its temporary files. A killed
or finished run's ranks are free and are compacted.

With the lock of every free rank held, every part of those ranks is read whole before anything
is merged (lake/part_check.py): a damaged or foreign part stops compact with DumpReadError and
no file changed, since merging it would fail half-way or mix foreign rows into the rank's own
part. The locks are held from that check until each rank's merge, so the parts checked are the
parts merged.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlprobe.errors import DumpReadError
from rlprobe.lake.atomic import is_temporary
from rlprobe.lake.layout import KINDS, DumpLayout, live_parts_in
from rlprobe.lake.parts import PartStore
from rlprobe.lake.rank_lock import RankLock, RankLocked


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
    from rlprobe.lake.part_check import part_problem

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

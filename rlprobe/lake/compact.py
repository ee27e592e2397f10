"""`rlprobe compact`: merge every rank's stats parts into one and remove leftovers.

A rank is compacted only while this process holds its lock (lake/rank_lock.py): a rank whose
writer is alive is left exactly as it is and named in `refused`, so compact can never merge
parts a live writer is still adding to or merging, nor delete its temporary files. A killed
or finished run's ranks are free and are compacted.
"""

from __future__ import annotations

from pathlib import Path

from rlprobe.errors import DumpReadError
from rlprobe.lake.layout import KINDS, DumpLayout
from rlprobe.lake.parts import PartStore
from rlprobe.lake.rank_lock import RankLock, RankLocked


def compact(root: str | Path) -> dict[str, object]:
    """Merge parts per (kind, rank) of every rank no live process writes; returns the number
    of files before and after, and `refused`: one message per rank left as it was."""
    layout = DumpLayout(root)
    before = after = 0
    refused: list[str] = []
    base = layout.root / "stats"
    kinds = sorted({*KINDS, *(d.name for d in base.iterdir() if d.is_dir())}) if base.is_dir() else []
    by_rank: dict[int, list[Path]] = {}
    for kind in kinds:
        for rank, directory in layout.rank_dirs(kind).items():
            by_rank.setdefault(rank, []).append(directory)
    for rank, directories in sorted(by_rank.items()):
        try:
            lock = RankLock.acquire(layout.root, rank, "rlprobe compact")
        except RankLocked as e:
            refused.append(f"{e}; rank {rank} was not compacted")
            continue
        try:
            for directory in directories:
                before += sum(1 for _ in directory.iterdir())
                try:
                    PartStore(directory).merge_all()
                except DumpReadError as e:
                    refused.append(f"{e}; {directory} was left as it was")
                after += sum(1 for _ in directory.iterdir())
        finally:
            lock.release()
    return {"files_before": before, "files_after": after, "refused": refused}

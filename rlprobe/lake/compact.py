"""`rlprobe compact`: merge every rank's stats parts into one and remove leftovers."""

from __future__ import annotations

from pathlib import Path

from rlprobe.lake.layout import KINDS, DumpLayout
from rlprobe.lake.parts import PartStore


def compact(root: str | Path) -> dict[str, int]:
    """Merge parts per (kind, rank); returns the number of files before and after."""
    layout = DumpLayout(root)
    before = after = 0
    base = layout.root / "stats"
    kinds = sorted({*KINDS, *(d.name for d in base.iterdir() if d.is_dir())}) if base.is_dir() else []
    for kind in kinds:
        for rank, directory in sorted(layout.rank_dirs(kind).items()):
            before += sum(1 for _ in directory.iterdir())
            store = PartStore(directory)
            store.merge_all()
            after += sum(1 for _ in directory.iterdir())
    return {"files_before": before, "files_after": after}

"""`rlprobe compact`: merge every rank's stats parts into one and remove leftovers."""

from __future__ import annotations

from pathlib import Path

from rlprobe.errors import DumpReadError
from rlprobe.lake.layout import KINDS, DumpLayout, live_parts_in
from rlprobe.lake.parts import PartStore


def compact(root: str | Path) -> dict[str, int]:
    """Merge parts per (kind, rank); returns the number of files before and after."""
    layout = DumpLayout(root)
    before = after = 0
    base = layout.root / "stats"
    kinds = sorted({*KINDS, *(d.name for d in base.iterdir() if d.is_dir())}) if base.is_dir() else []
    _check_parts(layout, kinds)
    for kind in kinds:
        for rank, directory in sorted(layout.rank_dirs(kind).items()):
            before += sum(1 for _ in directory.iterdir())
            store = PartStore(directory)
            store.merge_all()
            after += sum(1 for _ in directory.iterdir())
    return {"files_before": before, "files_after": after}


def _check_parts(layout: DumpLayout, kinds: list[str]) -> None:
    """Refuse, before anything is merged, a part that cannot be read whole or is not of its kind:
    merging it would fail half-way or mix foreign rows into the dump's own part."""
    from rlprobe.lake.part_check import part_problem

    for kind in kinds:
        for directory in layout.rank_dirs(kind).values():
            for part in live_parts_in(directory)[0]:
                problem = part_problem(part.path, kind, deep=True)
                if problem is not None:
                    raise DumpReadError(f"{problem}; nothing was compacted")

"""Stats parts of one (kind, rank): append a part per flush, merge them so few files remain.

Merging is size-tiered: whenever the newest FANOUT parts are of one tier (tier = log base
FANOUT of the number of flushes a part covers), they become one part. A rank therefore keeps
at most FANOUT-1 parts per tier, a handful for any run length, and `merge_all` leaves one.
The merged part is renamed into place before the parts it replaces are removed; readers
ignore parts covered by a wider one, so a kill between the two steps double-counts nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.lake.atomic import atomic_write_parquet, is_temporary
from rlprobe.lake.layout import Part, live_parts_in, part_name

FANOUT = 4


def _tier(part: Part) -> int:
    return int(math.log(part.size, FANOUT) + 1e-9)


class PartStore:
    def __init__(self, directory: Path):
        self.directory = directory
        live, covered = live_parts_in(directory)
        self.next_seq = max((p.last for p in live + covered), default=-1) + 1

    def live(self) -> list[Part]:
        return live_parts_in(self.directory)[0]

    def append(self, table: pa.Table) -> Part:
        """Write `table` as the next part; returns it. Raises OSError on I/O failure."""
        seq = self.next_seq
        path = self.directory / part_name(seq, seq)
        atomic_write_parquet(path, table)
        self.next_seq = seq + 1
        return Part(path, seq, seq)

    def merge_tiered(self) -> None:
        while True:
            live = self.live()
            if len(live) < FANOUT:
                return
            tail = live[-FANOUT:]
            if len({_tier(p) for p in tail}) != 1:
                return
            self._merge(tail)

    def merge_all(self) -> None:
        live = self.live()
        if len(live) > 1:
            self._merge(live)
        self.remove_leftovers()

    def remove_leftovers(self) -> None:
        """Delete parts already covered by a merged part and temporaries of killed writers."""
        if not self.directory.is_dir():
            return
        for p in live_parts_in(self.directory)[1]:
            p.path.unlink(missing_ok=True)
        for f in self.directory.iterdir():
            if is_temporary(f):
                f.unlink(missing_ok=True)

    def drop_steps_after(self, last_step: int) -> int:
        """Remove rows whose step is past `last_step` (a killed writer's uncommitted tail),
        rewriting each affected part atomically; returns the number of rows removed."""
        import pyarrow.compute as pc

        self.remove_leftovers()
        dropped = 0
        for part in self.live():
            table = pq.read_table(part.path, partitioning=None)
            if "step" not in table.column_names:
                continue
            keep = pc.fill_null(pc.less_equal(table["step"], last_step), True)
            kept = table.filter(keep)
            if kept.num_rows == table.num_rows:
                continue
            dropped += table.num_rows - kept.num_rows
            if kept.num_rows:
                atomic_write_parquet(part.path, kept)
            else:
                part.path.unlink(missing_ok=True)
        return dropped

    def _merge(self, parts: list[Part]) -> None:
        tables = [pq.read_table(p.path, partitioning=None) for p in parts]
        merged = pa.concat_tables(tables, promote_options="default")
        if "step" in merged.column_names:
            merged = merged.sort_by([("step", "ascending")])  # stable: keeps flush order within a step
        atomic_write_parquet(self.directory / part_name(parts[0].first, parts[-1].last), merged)
        for p in parts:
            p.path.unlink(missing_ok=True)

"""The executor's tasks: PairTask, one pair, and PairColumns, many pairs held column by column (pair i's
paths and records in arrays, its PairTask made only where it is asked for). The 25,600 pairs of an rlprobe dump as PairTask and Record tuples took
~0.12-0.14 s of the main thread before any pair was compared (issue 18); a batch of small pairs
(rlprobe.comparison.small_pairs) reads its paths and records straight from these columns instead."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Hashable, NamedTuple, overload

import numpy as np

from rlprobe.lake.tensor_pack import Record


class PairTask(NamedTuple):
    """One pair to compare: two absolute paths of ``.npy`` files, or of packed files with the records
    to compare in them (lake/tensor_pack.py; None: the whole file)."""

    task_id: Hashable
    path_a: str
    path_b: str
    record_a: Record | None = None
    record_b: Record | None = None


class Side:
    """One side's columns: absolute paths, and each pair's record (`offsets`, `lengths`: byte offset and
    length of a record of a packed file) or, with `offsets` None, whole files."""

    __slots__ = ("paths", "offsets", "lengths")

    def __init__(self, paths: list[str], offsets: np.ndarray | None = None, lengths: np.ndarray | None = None):
        if (offsets is None) != (lengths is None):
            raise ValueError("a side's offsets and lengths go together")
        if offsets is not None and not (len(offsets) == len(lengths) == len(paths)):
            raise ValueError(f"a side of {len(paths)} paths needs as many offsets and lengths, "
                             f"got {len(offsets)} and {len(lengths)}")
        self.paths = paths
        self.offsets = offsets
        self.lengths = lengths

    def __getitem__(self, rows: slice) -> "Side":
        if self.offsets is None:
            return Side(self.paths[rows])
        return Side(self.paths[rows], self.offsets[rows], self.lengths[rows])

    def records(self) -> list[Record | None]:
        if self.offsets is None:
            return [None] * len(self.paths)
        return list(map(Record, self.offsets.tolist(), self.lengths.tolist()))

    def record(self, i: int) -> Record | None:
        return None if self.offsets is None else Record(int(self.offsets[i]), int(self.lengths[i]))

    def record_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """As small_pairs.record_arrays gives them: offset 0 and length -1 for a whole file."""
        if self.offsets is None:
            return np.zeros(len(self.paths), np.int64), np.full(len(self.paths), -1, np.int64)
        return self.offsets, self.lengths


class PairColumns(Sequence):
    """Pairs as columns; item i is PairTask(first_id + i, path_a, path_b, record_a, record_b), a slice is
    PairColumns again (task ids kept), so run_pairs, its batches and any executor see PairTasks."""

    def __init__(self, a: Side, b: Side, first_id: int = 0):
        if len(a.paths) != len(b.paths):
            raise ValueError(f"both sides need as many pairs: {len(a.paths)} and {len(b.paths)}")
        self.a, self.b, self.first_id = a, b, first_id

    def __len__(self) -> int:
        return len(self.a.paths)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> "PairColumns": ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, _, step = i.indices(len(self))
            if step != 1:
                raise ValueError("PairColumns slices are contiguous")
            return PairColumns(self.a[i], self.b[i], self.first_id + start)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"pair {i} of {n}")
        i %= n
        return PairTask(self.first_id + i, self.a.paths[i], self.b.paths[i], self.a.record(i), self.b.record(i))

    def __iter__(self) -> Iterator[Any]:
        """Every pair's PairTask, made at once (an executor that takes them all: ray_executor, pairs_ahead)."""
        return map(PairTask, self.task_ids, self.a.paths, self.b.paths, self.a.records(), self.b.records())

    @property
    def task_ids(self) -> range:
        return range(self.first_id, self.first_id + len(self))

    def paths(self) -> list[str]:
        """Every pair's path a, then every pair's path b (as small_pairs.compare_small_pairs reads them)."""
        return self.a.paths + self.b.paths

    def record_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """small_pairs.record_arrays of these pairs, from the columns."""
        (offsets_a, lengths_a), (offsets_b, lengths_b) = self.a.record_arrays(), self.b.record_arrays()
        return np.concatenate([offsets_a, offsets_b]), np.concatenate([lengths_a, lengths_b])

    def __repr__(self) -> str:
        return f"PairColumns({len(self)} pairs from task {self.first_id})"

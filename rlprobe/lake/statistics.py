"""The per-tensor statistics, registered in one place.

Each statistic is one small function of the numeric values (numpy) of a stack of tensors of
one layout, `(tensors, elements)`, giving one value per tensor: the writer computes the
statistics of a save call's small tensors with one numpy call per statistic, not one per
tensor (numpy reduces each row of a stack exactly as it reduces that tensor alone). Capture,
the Arrow schema and readers all take the list from here. Framework adapters that compute on a
device return a dict with the same names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Statistic:
    name: str
    arrow_type: str  # "float64" | "int64"
    compute: Callable[[np.ndarray], np.ndarray]  # (tensors, elements) -> one value per tensor


STATISTICS: list[Statistic] = []


def statistic(name: str, arrow_type: str = "float64"):
    def register(fn: Callable[[np.ndarray], np.ndarray]):
        STATISTICS.append(Statistic(name, arrow_type, fn))
        return fn

    return register


def _nonempty(fn):
    """None (null) for empty tensors."""
    def wrapped(v: np.ndarray):
        return np.full(v.shape[0], None) if v.shape[1] == 0 else fn(v)

    return wrapped


def _is_float(v: np.ndarray) -> bool:
    return v.dtype.kind == "f"


@statistic("min")
@_nonempty
def _min(v):
    return np.min(v, axis=1).astype(np.float64)


@statistic("max")
@_nonempty
def _max(v):
    return np.max(v, axis=1).astype(np.float64)


@statistic("mean")
@_nonempty
def _mean(v):
    return np.mean(v, axis=1, dtype=np.float64)  # under host_statistics_of_stack's errstate


@statistic("norm")
def _norm(v):
    # sum of squares in float64 without BLAS: BLAS threads would fight the training thread for cores
    return np.sqrt(np.sum(np.square(v, dtype=np.float64), axis=1))


@statistic("nan_count", "int64")
def _nan_count(v):
    return np.count_nonzero(np.isnan(v), axis=1) if _is_float(v) else np.zeros(v.shape[0], np.int64)


@statistic("inf_count", "int64")
def _inf_count(v):
    return np.count_nonzero(np.isinf(v), axis=1) if _is_float(v) else np.zeros(v.shape[0], np.int64)


@statistic("zero_count", "int64")
def _zero_count(v):
    return v.shape[1] - np.count_nonzero(v, axis=1)


def host_statistics(values: np.ndarray) -> dict[str, float | int | None]:
    """Every registered statistic of a numeric array (bool counts as 0/1)."""
    return host_statistics_of_stack(values.reshape(1, -1))[0]


def host_statistics_of_stack(stack: np.ndarray) -> list[dict[str, float | int | None]]:
    """Every registered statistic of each row of `stack` (tensors, elements), one dict per tensor."""
    if stack.dtype == np.bool_:
        stack = stack.view(np.uint8)
    # NaN and inf are counted, not warned about; one errstate for all statistics (entering one costs
    # several microseconds: two a stack were ~5 % of the writer's CPU in a TRL-like run)
    with np.errstate(invalid="ignore", over="ignore"):
        columns = [(s.name, s.compute(stack).tolist()) for s in STATISTICS]
    return [{name: values[i] for name, values in columns} for i in range(stack.shape[0])]


# tensors of one layout are stacked up to this size in all (larger ones are reduced in place)
STACK_BYTES = 1 << 20


def host_statistics_many(arrays: Sequence[np.ndarray]) -> list[dict[str, float | int | None]]:
    """host_statistics of each array, small arrays of one dtype and size stacked first."""
    out: list[dict[str, float | int | None] | None] = [None] * len(arrays)
    for members in stack_groups([(a.dtype, a.size) for a in arrays], [a.nbytes for a in arrays], STACK_BYTES):
        if len(members) == 1:
            out[members[0]] = host_statistics(arrays[members[0]])
            continue
        stack = np.stack([arrays[i].reshape(-1) for i in members])
        for i, stats in zip(members, host_statistics_of_stack(stack)):
            out[i] = stats
    return out  # type: ignore[return-value]


def host_statistics_columns(arrays: Sequence[np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """host_statistics_many as columns: each statistic's values (float64 or int64, by its arrow_type) and
    where each is null (min, max and mean of an empty array), without a Python object a value: the
    writer's key-data rows are built as columns (capture/key_data_rows.py). The same numpy calls on the
    same stacks as host_statistics_many, so the values are the same to the bit."""
    n = len(arrays)
    values = {s.name: np.zeros(n, np.int64 if s.arrow_type == "int64" else np.float64) for s in STATISTICS}
    null = {s.name: np.zeros(n, np.bool_) for s in STATISTICS}
    for members in stack_groups([(a.dtype, a.size) for a in arrays], [a.nbytes for a in arrays], STACK_BYTES):
        # one concatenation of the flat arrays: np.stack's per-array expansion cost ~2 us an array
        stack = (arrays[members[0]].reshape(1, -1) if len(members) == 1
                 else np.concatenate([arrays[i].reshape(-1) for i in members]).reshape(len(members), -1))
        if stack.dtype == np.bool_:
            stack = stack.view(np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf are counted, not warned about
            for s in STATISTICS:
                column = s.compute(stack)
                if column.dtype == object:  # None: the statistic of an empty array
                    null[s.name][members] = True
                else:
                    values[s.name][members] = column
    return values, null


def consecutive_chunks(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Positions cut into runs of consecutive items of at most `limit` bytes in all (a larger item alone):
    the writer's batches of host copies, released a run at a time."""
    chunks: list[list[int]] = []
    size = limit + 1
    for i, nbytes in enumerate(sizes):
        if size + nbytes > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(i)
        size += nbytes
    return chunks


def stack_groups(layouts: Sequence[object], sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Positions grouped by equal layout, each group at most `limit` bytes; a larger item is a
    group of its own. Groups keep the items' order."""
    groups: dict[object, list[int]] = {}
    total: dict[object, int] = {}
    out: list[list[int]] = []
    for i, (layout, size) in enumerate(zip(layouts, sizes)):
        if size > limit:
            out.append([i])
            continue
        if layout in groups and total[layout] + size > limit:
            out.append(groups.pop(layout))
        if layout not in groups:
            groups[layout], total[layout] = [], 0
        groups[layout].append(i)
        total[layout] += size
    return out + list(groups.values())


def bitwise_hash(raw: np.ndarray) -> str:
    """blake2b-128 of the raw bytes in the original dtype, C order (a C-contiguous array is hashed
    through its buffer as it is: three numpy calls fewer a tensor, the same bytes)."""
    return hashlib.blake2b(raw if raw.flags.c_contiguous else np.ascontiguousarray(raw), digest_size=16).hexdigest()

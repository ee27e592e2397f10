"""The per-tensor statistics, registered in one place.

Each statistic is one small function of the numeric values (numpy); capture, the Arrow
schema and readers all take the list from here. Framework adapters that compute on a device
return a dict with the same names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Statistic:
    name: str
    arrow_type: str  # "float64" | "int64"
    compute: Callable[[np.ndarray], float | int | None]


STATISTICS: list[Statistic] = []


def statistic(name: str, arrow_type: str = "float64"):
    def register(fn: Callable[[np.ndarray], float | int | None]):
        STATISTICS.append(Statistic(name, arrow_type, fn))
        return fn

    return register


def _nonempty(fn):
    def wrapped(v: np.ndarray):
        return None if v.size == 0 else fn(v)

    return wrapped


def _is_float(v: np.ndarray) -> bool:
    return v.dtype.kind == "f"


@statistic("min")
@_nonempty
def _min(v):
    return float(np.min(v))


@statistic("max")
@_nonempty
def _max(v):
    return float(np.max(v))


@statistic("mean")
@_nonempty
def _mean(v):
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.mean(v, dtype=np.float64))


@statistic("norm")
def _norm(v):
    # sum of squares in float64 without BLAS: BLAS threads would fight the training thread for cores
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.sqrt(np.sum(np.square(v, dtype=np.float64))))


@statistic("nan_count", "int64")
def _nan_count(v):
    return int(np.count_nonzero(np.isnan(v))) if _is_float(v) else 0


@statistic("inf_count", "int64")
def _inf_count(v):
    return int(np.count_nonzero(np.isinf(v))) if _is_float(v) else 0


@statistic("zero_count", "int64")
def _zero_count(v):
    return int(v.size - np.count_nonzero(v))


def host_statistics(values: np.ndarray) -> dict[str, float | int | None]:
    """Every registered statistic of a numeric array (bool counts as 0/1)."""
    if values.dtype == np.bool_:
        values = values.view(np.uint8)
    return {s.name: s.compute(values) for s in STATISTICS}


def bitwise_hash(raw: np.ndarray) -> str:
    """blake2b-128 of the raw bytes in the original dtype, C order."""
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    return hashlib.blake2b(flat, digest_size=16).hexdigest()

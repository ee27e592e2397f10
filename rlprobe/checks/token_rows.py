"""What token_tables.py and token_batch.py share: the token tables' schemas, the quantiles read,
a part's token count, the tensor loader and the edges of the bins and buckets (table_edges)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from rlprobe.checks.mapped_tensors import map_tensor
from rlprobe.checks.pair_part import Part
from rlprobe.checks.token_figures import (N_POSITIONS, N_PROBABILITY, TABLE_BITS, bin_lower_edges, bin_upper_edges,
                                         position_bounds, quantile_edges)
from rlprobe.lake.reader import Dump

QUANTILES = (("p50_abs", 0.5), ("p95_abs", 0.95), ("p99_abs", 0.99))


def part_tokens(part: Part) -> int:
    shape = part.a["shape"] or [1]
    rows = len(range(shape[0])[part.a_rows]) if isinstance(part.a_rows, slice) else (
        len(part.a_rows) if part.a_rows is not None else shape[0])
    return rows * math.prod(shape[1:])


def loader(dump: Dump) -> Callable[[dict, np.ndarray | slice | None], np.ndarray]:
    """load(tensor index row, rows picked): each file mapped (or read) once."""
    loaded: dict[tuple[str, int | None], np.ndarray] = {}  # by file and record (a packed file holds several)

    def load(row: dict, picks: np.ndarray | slice | None) -> np.ndarray:
        if isinstance(picks, slice):  # a row range of a pair cut between threads: those rows' pages only
            return map_tensor(dump, row, picks)
        where = (row["tensor_file"], row.get("tensor_offset"))
        if where not in loaded:
            loaded[where] = map_tensor(dump, row)
        x = loaded[where]
        return x if picks is None else np.asarray(x)[picks]
    return load


SEQUENCES = pa.schema([("pair", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("micro_step", pa.int64()),
                       ("sequence", pa.int64()), ("tokens", pa.int64()), ("log_ratio", pa.float64())])
STEPS = pa.schema([("pair", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("dtype_a", pa.string()),
                   ("dtype_b", pa.string()), ("masked", pa.bool_()), ("tokens", pa.int64()),
                   ("nonfinite", pa.int64()), ("mean_delta", pa.float64()), ("sd_delta", pa.float64()),
                   ("mean_abs", pa.float64()), ("p50_abs", pa.float64()), ("p95_abs", pa.float64()),
                   ("p99_abs", pa.float64()), ("max_abs", pa.float64()), ("eps", pa.float64()),
                   ("outside_share", pa.float64())])
HIST = pa.schema([("pair", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("lo", pa.float64()),
                  ("hi", pa.float64()), ("tokens", pa.int64())])
BUCKETS = pa.schema([("pair", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("lo", pa.float64()),
                     ("hi", pa.float64()), ("tokens", pa.int64()), ("mean_abs", pa.float64()),
                     ("max_abs", pa.float64())])


@functools.cache
def table_edges() -> Edges:
    return Edges()


class Edges:
    """The bins' and buckets' edges, computed once a process (~1 ms: their arrays are 256 KiB each)."""

    def __init__(self) -> None:
        self.lower, self.upper = bin_lower_edges(), bin_upper_edges()
        self.quantile = quantile_edges()  # what a quantile in each |Δ| bin reads: the upper edge, 0 for the zeros
        self.pos_lo = np.array([position_bounds(p)[0] for p in range(N_POSITIONS)], np.float64)
        self.pos_hi = np.array([position_bounds(p)[1] for p in range(N_POSITIONS)], np.float64)
        self.pos_hi[-1] = np.inf
        self.prob_lo = np.arange(N_PROBABILITY) / N_PROBABILITY
        self.signed_lo = np.concatenate([self.lower, -self.upper])  # by histogram bin: Δ >= 0, then Δ < 0
        self.signed_hi = np.concatenate([self.upper, -self.lower])
        first, last = slice(None, None, 1 << TABLE_BITS), slice((1 << TABLE_BITS) - 1, None, 1 << TABLE_BITS)
        self.table_lo = np.concatenate([self.lower[first], -self.upper[last]])  # token_hist's bins: 2^TABLE_BITS
        self.table_hi = np.concatenate([self.upper[last], -self.lower[first]])  # of the kernel's merged

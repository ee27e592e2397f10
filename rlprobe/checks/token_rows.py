"""What token_tables.py, token_batch.py and the pairings (pair_index.py, by position and by sample) share: what one
token-kernel call reads (Part: a pair of tensor rows and the mask's), the token tables' schemas, the quantiles
read, a part's token count, the edges of the bins and buckets (table_edges), the tensor loader, and which pairs
`check_dump(only=...)` reduces (selection_for).

Tensor files are mapped for the token kernel with MAP_POPULATE (map_tensor): the kernel maps every page of the
file in one system call, where numpy's memory map (np.load(mmap_mode="r")) takes a page fault per 4 KiB page
as the kernel reads on, and a read() copies the bytes (measured on a loaded 2-core machine: ~2x faster to
touch than np.load's map, ~1.5x faster than a read into a reused buffer); files of at most 256 KiB are read
whole (a pread: ~15 µs for 32 KiB, where a map costs ~40 µs). The .npy header numpy writes is read by
rlprobe.lake.npy_header (numpy's own reader evaluates it as Python source: about half of the time spent here
on 1 MB tensors); any other header goes to numpy.

`check_dump(only=...)` reduces the token pairs the requested checks read, no more. Each token-level check reads
token_steps rows of some pair kinds (token_tables.pairs names them), and on_policy only those of the (step,
rank) its query judges, so a check run for a few rules (compare's single-run rules:
rlprobe/comparison/single_run.py) never reads a tensor only other checks would. The full check (`only` None)
reduces every pair: its reports show them all."""

from __future__ import annotations

import functools
import math
import mmap
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.checks.token_figures import (N_POSITIONS, N_PROBABILITY, TABLE_BITS, bin_lower_edges, bin_upper_edges,
                                         position_bounds, quantile_edges)
from rlprobe.errors import DumpReadError
from rlprobe.lake.encoding import restore
from rlprobe.lake.npy_header import MAGIC, PARSE_ERRORS, plain_header, read_header
from rlprobe.lake.reader import Dump
from rlprobe.lake.regular_files import expected_tensor_file, open_fd
from rlprobe.lake.tensor_pack import record_of

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


class Part(NamedTuple):
    """One kernel call: tensor rows a, b and the mask's (None: every token), and which of their
    leading-dimension rows pair up (None: all, in order; a slice: those, split_rows())."""

    pair: str
    a: dict
    b: dict
    mask: dict | None
    a_rows: np.ndarray | slice | None = None
    b_rows: np.ndarray | slice | None = None
    mask_rows: np.ndarray | slice | None = None


def is_float(row: dict[str, Any]) -> bool:
    """A stats row whose dtype is a floating-point one (bf16 and half included)."""
    return float_dtype(row.get("dtype"))


@functools.lru_cache(maxsize=256)
def float_dtype(dtype: str | None) -> bool:
    """A floating-point dtype name (None, a dump that saves no dtype: taken as one)."""
    dtype = (dtype or "float").lower()
    return "float" in dtype or "bf16" in dtype or "half" in dtype or "double" in dtype


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux; elsewhere a plain map
_HEAD = 256  # bytes read first: numpy pads the header of a simple array to 128
READ_BELOW = 1 << 18  # a smaller file is read whole: one pread costs less than setting up a map


def map_tensor(dump: Dump, row: dict, rows: slice | None = None) -> np.ndarray:
    """The tensor of a tensor index row (tensor_file, dtype) as Dump.load_tensor returns it, read-only:
    mapped, or read where the file is at most READ_BELOW bytes (a map's set-up costs more there).
    `rows`: x[rows] only (a mapped file maps the pages of those rows only: a pair cut between threads
    does not map every page once per piece)."""
    path = os.path.join(dump.path, row["tensor_file"])
    record = record_of(row.get("tensor_offset"), row.get("tensor_length"))  # a packed file's record, or the file
    start = record.offset
    try:
        fd, file_length = open_fd(path, expected_tensor_file(path))  # a FIFO or a device: named, never read
        try:
            length = file_length - start if record.length is None else record.length
            head = os.pread(fd, length if length <= READ_BELOW else _HEAD, start)
            header = plain_header(head)
            if start + length > file_length or not head.startswith(MAGIC):
                shape, fortran_order, stored, offset = (), True, None, 0  # load_record names the problem
            elif header is None:
                with open(fd, "rb", closefd=False) as f:
                    f.seek(start)
                    shape, fortran_order, stored = read_header(f)
                    offset = f.tell() - start
            else:
                (shape, stored, offset), fortran_order = header, False
            size = math.prod(shape) * stored.itemsize if stored is not None else 0
            if fortran_order or stored.hasobject or size == 0 or length < offset + size:
                data = None  # not what rlprobe writes, empty or truncated: numpy reads it (or says why not)
            elif length <= READ_BELOW:
                data = head
            else:
                first_row, stop = _row_range(rows, shape)
                if stop > first_row:  # those rows' pages only, from a page boundary
                    first = start + offset + first_row * (size // shape[0])
                    base = first - first % mmap.ALLOCATIONGRANULARITY
                    shape, size, offset, rows = (stop - first_row, *shape[1:]), \
                        (stop - first_row) * (size // shape[0]), first - base, None
                else:  # the record from the page holding its start
                    base = start - start % mmap.ALLOCATIONGRANULARITY
                    offset += start - base
                data = mmap.mmap(fd, offset + size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ,
                                 offset=base)
        finally:
            os.close(fd)
    except (OSError, ValueError, EOFError, *PARSE_ERRORS) as e:  # an OSError's strerror: without the path again
        raise DumpReadError(f"{path}: cannot read tensor ({getattr(e, 'strerror', None) or e})") from None
    if data is None:
        x = dump.load_row_tensor(row, mmap=True)
    else:
        x = restore(np.frombuffer(data, stored, count=size // stored.itemsize, offset=offset).reshape(shape),
                    row["dtype"])
    return x if rows is None else x[rows]


def _row_range(rows: slice | None, shape: tuple[int, ...]) -> tuple[int, int]:
    """[start, stop) of a step-1 slice of the leading dimension of a tensor of 2+ dimensions; (0, 0) otherwise."""
    if rows is None or len(shape) < 2 or rows.step not in (None, 1):
        return 0, 0
    start, stop, _ = rows.indices(shape[0])
    return start, stop


# token_steps' `pair` kinds each check's query reads (sql/check/<name>.sql); a check not named reads none
PAIRS_READ = {"on_policy": ("on_policy",), "rollout_vs_recompute": ("rollout_vs_old", "rollout_vs_log_prob")}
ROLLOUT_KINDS = frozenset(PAIRS_READ["rollout_vs_recompute"])


class PairSelection(NamedTuple):
    """The pair kinds to reduce, and the (step, rank) whose on_policy pairs are reduced (None: every one)."""

    kinds: frozenset[str]
    on_policy: frozenset[tuple[int, int]] | None = None

    def keeps(self, kind: str, step: int, rank: int) -> bool:
        if kind not in self.kinds:
            return False
        return kind != "on_policy" or self.on_policy is None or (step, rank) in self.on_policy


def selection_for(checks: tuple[str, ...], stats: pa.Table, info: dict[str, Any]) -> PairSelection:
    """The pairs that `checks` read, for a dump's statistics (`stats`: inputs.stats_table) and run_info."""
    kinds = frozenset(kind for name in checks for kind in PAIRS_READ.get(name, ()))
    if "on_policy" not in kinds:
        return PairSelection(kinds)
    return PairSelection(kinds, on_policy_judged(stats, info["first_step"], info["generation_every"]))


def on_policy_judged(stats: pa.Table, first_step: int | None, generation_every: int) -> frozenset[tuple[int, int]]:
    """The (step, rank) whose token figures sql/check/on_policy.sql reads (its `pairs` and WHERE, in
    Python): a log_prob and an old_log_prob saved at micro-step 0 of one call with one shape, at a
    generating step ((step - first_step) % generation_every == 0), not at a later epoch (an `epoch`
    saved at micro-step 0 with a value other than 0), and not bitwise equal by their hashes (the rule
    reports no such pair, whatever its tokens). tests/check/test_token_selection.py checks it against
    the query itself."""
    if first_step is None or stats.num_rows == 0:
        return frozenset()
    mask = pc.and_(pc.is_in(stats["canonical"], pa.array(["log_prob", "old_log_prob", "epoch"])),
                   pc.equal(stats["micro_step"], 0))
    table = stats.filter(pc.fill_null(mask, False))
    columns = [table[c].to_pylist() for c in ("canonical", "step", "rank", "index", "shape", "hash", "max", "absent")]
    later: set[tuple[int, int]] = set()
    saved: dict[tuple, list[tuple[Any, Any]]] = {}  # a canonical name may be saved under two keys: every pairing
    for canonical, step, rank, index, shape, digest, largest, absent in zip(*columns):
        if canonical == "epoch":
            if (largest or 0) != 0:  # coalesce(max, 0) <> 0; NaN too
                later.add((step, rank))
        elif not absent:
            saved.setdefault((canonical, step, rank, index), []).append((shape, digest))
    found = set()
    for (canonical, step, rank, index), rows in saved.items():
        if canonical != "log_prob" or (step - first_step) % generation_every or (step, rank) in later:
            continue
        for shape, digest in rows:
            for other_shape, other_digest in saved.get(("old_log_prob", step, rank, index), ()):
                # `n.hash IS NOT NULL AND n.hash = o.hash` is true or null (o.hash null) for a row the rule drops
                if other_shape == shape and (digest is None or (other_digest is not None and other_digest != digest)):
                    found.add((step, rank))
    return frozenset(found)

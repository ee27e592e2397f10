"""Read dumps written by msprobe 8.x and 26.x as if they were rlprobe dumps.

Key data (SingleSave): data/<key>/step<S>/rank<R>/[micro_step<M>/]<key>[.<index>].npy + .json
(max/min/mean/norm/shape, no dtype; micro-step 0 where the folder has none, and <key>_<N>.npy directly in
rank<R>/ is index N, as msprobe's comparators read them); what is in no such layout is named
(unread_entries, one UnreadEntriesWarning). grad_probe: rank<R>/grad_summary_<S>.csv and
rank<R>/step<S>/<param>.npy sign maps (bool, grad > 0). docs/dump-format.md, "msprobe dumps".
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from rlprobe.errors import DumpReadError
from rlprobe.lake import msprobe_scan
from rlprobe.lake.regular_files import GRAD_SUMMARY, NPY, NotRegularFileError, load_npy, open_text
from rlprobe.lake.schema import GRAD, KEY_DATA, with_rank
from rlprobe.lake.unread import is_own_temporary, printable, warn_unread

_RANK = re.compile(r"^rank(\d+)$")
_GRAD_SUMMARY = re.compile(r"^grad_summary_(\d+)\.csv$")


def is_msprobe_key_data(root: Path) -> bool:
    return (root / "data").is_dir() and not (root / "rlprobe.json").exists()


def is_msprobe_grad(root: Path) -> bool:
    return any(_RANK.match(d.name) and any(d.glob("grad_summary_*.csv")) for d in root.iterdir() if d.is_dir())


def key_data_table(root: Path, listing: msprobe_scan.TensorListing | None = None, *,
                   scanner: Callable[[np.ndarray], tuple] | None = None) -> pa.Table:
    """One row per .npy file of a SingleSave dump, in the rlprobe key_data schema (+ rank): the
    folders and statistics files as msprobe_scan.scan_key_data reads them (each file read and
    parsed once), the folders from `listing` (msprobe_scan.list_tensors of `root`) where given, else
    by the compiled reader (`scanner`: msprobe_kernels.scan_dump; by default its ahead-of-time copy,
    where built) with no GIL held, which leaves to Python what it does not read the same way."""
    values: dict[str, Any] | None = None
    scanner = scanner if scanner is not None or listing is not None else compiled_scanner()
    try:
        if scanner is not None and listing is None:
            values = _compiled_columns(os.fspath(root), scanner)
        if values is None:
            listing = listing or msprobe_scan.list_tensors(os.fspath(root))
            values = msprobe_scan.read_statistics(listing)
    except msprobe_scan.StatsFileError as e:
        raise DumpReadError(str(e)) from None
    warn_unread(root, unread_entries(root, listing.unread if listing is not None else ()), "msprobe")
    shapes = values["shape"]
    if isinstance(shapes, pa.Array) and shapes.null_count:
        shapes = shapes.to_pylist()
    if isinstance(shapes, list):
        missing = [i for i, shape in enumerate(shapes) if shape is None]
        if missing:  # no statistics file (or no shape in it): the npy header still tells the shape
            npys = values.get("npy") or [os.fspath(root) + os.sep + f for f in values["tensor_file"].to_pylist()]
            for i in missing:
                shapes[i] = _npy_shape(npys[i])
        values["shape"] = shapes
        values["numel"] = [None if shape is None else math.prod(shape) if all(type(d) is int for d in shape)
                           else int(np.prod(shape, dtype=np.int64)) for shape in shapes]
    n = len(shapes)
    values["framework"] = pa.repeat(pa.scalar("msprobe"), n)
    schema = with_rank(KEY_DATA)
    return pa.table([(values[f.name] if isinstance(values[f.name], pa.Array) else pa.array(values[f.name], f.type))
                     if f.name in values else pa.nulls(n, f.type) for f in schema], schema=schema)


def unread_entries(root: Path, listed: Sequence[str]) -> list[str]:
    """What of the msprobe dump at `root` rlprobe does not read, relative to it (`/` separators): `listed`
    (msprobe_scan's TensorListing.unread: under data/; none where the compiled reader read the run, since it
    leaves every run holding such an entry to Python) and the entries beside data/ but configurations*.json
    (lake/configs.py reads or names those), less rlprobe's own temporary files (lake/atomic.py)."""
    with os.scandir(root) as entries:
        beside = [d.name for d in entries if not (d.name == "data" and d.is_dir())
                  and not (d.name.startswith("configurations") and d.name.endswith(".json"))]
    found = sorted(beside) + list(listed)
    return [printable(p) for p in found if not is_own_temporary(p.rpartition("/")[2])]


def compiled_scanner() -> Callable[[np.ndarray], tuple] | None:
    """The compiled reader's ahead-of-time copy (rlprobe.numba_cache; None: not built, or not a 64-bit
    little-endian Linux, whose `struct dirent` it reads). Never numba's JIT: loading numba for it would
    cost more than the reading (~0.35 s of CPU)."""
    if not (sys.platform.startswith("linux") and sys.maxsize > 2**32 and sys.byteorder == "little"):
        return None
    from rlprobe.numba_cache import compiled_module

    module = compiled_module("compare")
    return None if module is None else module.scan_msprobe


def _compiled_columns(root: str, scanner: Callable[[np.ndarray], tuple]) -> dict[str, Any] | None:
    """msprobe_scan.scan_key_data's columns (but npy) as Arrow arrays, from the compiled reader (the GIL
    left while it lists and reads); None where it leaves the whole run to Python."""
    import pyarrow.compute as pc

    from rlprobe.lake import msprobe_codes as codes

    status, n, ints, text, text_ends, stat_codes, numbers, number_ends, dims, dim_ends = scanner(
        np.frombuffer(os.fsencode(root), np.uint8))
    if status == codes.FALLBACK or text.size >= 2**31 or numbers.size >= 2**31:
        return None
    texts = pa.StringArray.from_buffers(3 * n, pa.py_buffer(_offsets(text_ends)), pa.py_buffer(text))
    values: dict[str, Any] = {name: texts.take(pa.array(np.arange(k, 3 * n, 3)))
                              for k, name in enumerate(("key", "index", "tensor_file"))}
    for k, name in enumerate(("step", "rank", "micro_step")):
        values[name] = pa.array(np.ascontiguousarray(ints[:, k]))
    # every number text at once, correctly rounded as Python's float() (Arrow's parser): the same values
    is_number = (stat_codes == codes.STAT_NUMBER).reshape(-1)
    texts = pa.StringArray.from_buffers(4 * n, pa.py_buffer(_offsets(number_ends)), pa.py_buffer(numbers),
                                        pa.py_buffer(np.packbits(is_number, bitorder="little")))
    floats = np.array(pc.cast(texts, pa.float64()).to_numpy(zero_copy_only=False)).reshape(n, 4)
    for code, value in ((codes.STAT_NAN, math.nan), (codes.STAT_INF, math.inf), (codes.STAT_NEG_INF, -math.inf)):
        floats[stat_codes == code] = value
    for k, name in enumerate(("min", "max", "mean", "norm")):
        values[name] = pa.array(np.ascontiguousarray(floats[:, k]), mask=stat_codes[:, k] == codes.STAT_NULL)
    numel = np.ascontiguousarray(ints[:, 4])
    values["shape"] = pa.ListArray.from_arrays(pa.array(_offsets(dim_ends[:, None])), pa.array(dims),
                                               type=pa.list_(pa.int64()), mask=pa.array(numel < 0))
    values["numel"] = pa.array(numel, mask=numel < 0)
    slow = np.flatnonzero(ints[:, 3] == codes.SLOW).tolist()
    if slow:  # statistics files not written the way msprobe writes them: read by Python, as before
        files = values["tensor_file"].to_pylist()
        read = msprobe_scan.read_statistics(msprobe_scan.TensorListing(  # the paths as msprobe_scan makes them
            {}, [root + os.sep + files[i][:-len(".npy")] + ".json" for i in slow]))
        for name in ("shape", "min", "max", "mean", "norm"):
            column = values[name].to_pylist()
            for i, value in zip(slow, read[name]):
                column[i] = value
            values[name] = column
    return values


def _offsets(ends: np.ndarray) -> np.ndarray:
    """Arrow's int32 offsets of values whose ends (row by row) are `ends`."""
    offsets = np.zeros(ends.size + 1, np.int32)
    offsets[1:] = ends.reshape(-1)
    return offsets


def _npy_shape(npy: str) -> list[int] | None:
    try:
        return list(load_npy(npy, NPY, mmap=True).shape)
    except (OSError, ValueError, EOFError):  # the comparison of its tensor names the problem (EOFError: empty)
        return None


_float = msprobe_scan.as_float


def grad_table(root: Path) -> pa.Table:
    """grad_probe summaries in the rlprobe `grad` schema (+ rank): one row per (rank, step, param).
    Sign maps are msprobe's bool .npy per parameter, so sign_offset is null (docs/grads.md)."""
    rows: list[dict[str, Any]] = []
    for rank, rank_path in msprobe_scan.numbered(os.fspath(root), _RANK):
        rank_dir = Path(rank_path)
        for f in sorted(rank_dir.iterdir()):
            m = _GRAD_SUMMARY.match(f.name)
            if not m:
                continue
            step = int(m.group(1))
            try:  # one listing per step, not an exists() per parameter
                maps = set(os.listdir(rank_dir / f"step{step}"))
            except OSError:
                maps = set()
            try:
                fh = open_text(f, GRAD_SUMMARY, encoding="utf-8-sig", newline="")
            except NotRegularFileError as e:  # a FIFO or a device: never read (lake/regular_files.py)
                raise DumpReadError(str(e)) from None
            with fh:
                for rec in csv.DictReader(fh):
                    rows.append(_grad_row(f"{rank_dir.name}/step{step}", maps, rank, step, rec))
    return pa.Table.from_pylist(rows, schema=with_rank(GRAD))


def _grad_row(step_dir: str, maps: set[str], rank: int, step: int, rec: dict[str, str]) -> dict[str, Any]:
    """One summary CSV row; `step_dir` is the step's folder relative to the dump, `maps` its files."""
    param = rec.pop("param_name")
    has_signs = f"{param}.npy" in maps
    shape_text = rec.pop("shape", None)
    shape = json.loads(shape_text) if shape_text else None
    numel = int(np.prod(shape, dtype=np.int64)) if shape is not None else None
    digest = rec.pop("MD5", None)
    zero = _float(rec.pop("=0", None))
    row = {
        "monitor": "default", "param": param, "step": step, "probe_step": None, "rank": rank,
        "level": "L0" if digest is not None else ("L2" if zero is not None else "L1"),
        "framework": "msprobe", "dtype": None, "shape": shape, "numel": numel,
        "max": _float(rec.pop("max", None)), "min": _float(rec.pop("min", None)),
        "norm": _float(rec.pop("norm", None)),
        "digest": digest, "digest_algo": "msprobe-MD5-column" if digest is not None else None,
        "bounds": None, "bucket_fractions": None, "zero_fraction": zero,
        "sign_file": f"{step_dir}/{param}.npy" if has_signs else None,
        "sign_offset": None, "sign_numel": numel if has_signs else None,
    }
    intervals = [(k, v) for k, v in rec.items() if k and k.startswith("(")]
    if intervals:
        row["bucket_fractions"] = [_float(v) for _, v in intervals]
        row["bounds"] = [_float(k.split(",")[1].strip(" ])")) for k, _ in intervals[:-1]]
    return row

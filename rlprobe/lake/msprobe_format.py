"""Read dumps written by msprobe 8.x and 26.x as if they were rlprobe dumps, and name what of any dump is not read.

Key data (SingleSave): data/<key>/step<S>/rank<R>/[micro_step<M>/]<key>[.<index>].npy + .json
(max/min/mean/norm/shape, no dtype; micro-step 0 where the folder has none, and <key>_<N>.npy directly in
rank<R>/ is index N, as msprobe's comparators read them); what is in no such layout is named
(unread_entries, one UnreadEntriesWarning). grad_probe: rank<R>/grad_summary_<S>.csv and
rank<R>/step<S>/<param>.npy sign maps (bool, grad > 0). docs/dump-format.md, "msprobe dumps".

What a dump holds that rlprobe does not read is named, never an error (warn_unread): msprobe itself ignores
folders it does not know, and a file or folder that vanished from every table without a word hid a dump's key
data. For an rlprobe dump, the entries where its readers list names (the rank manifests and
`stats/<kind>/rank=<R>/`); for an msprobe dump, unread_entries. rlprobe's own temporary files (lake/atomic.py)
are never named.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from rlprobe.errors import DumpReadError, UnreadEntriesWarning
from rlprobe.lake import msprobe_scan
from rlprobe.lake.atomic import is_temporary
from rlprobe.lake.layout import KINDS, parse_part
from rlprobe.lake.regular_files import GRAD_SUMMARY, NPY, NotRegularFileError, load_npy, open_text
from rlprobe.lake.schema import GRAD, KEY_DATA, with_rank

_RANK = re.compile(r"^rank(\d+)$")
_GRAD_SUMMARY = re.compile(r"^grad_summary_(\d+)\.csv$")


def is_msprobe_key_data(root: Path) -> bool:
    return (root / "data").is_dir() and not (root / "rlprobe.json").exists()


def is_msprobe_grad(root: Path) -> bool:
    return any(_RANK.match(d.name) and any(d.glob("grad_summary_*.csv")) for d in root.iterdir() if d.is_dir())


def key_data_table(root: Path, listing: msprobe_scan.TensorListing | None = None,
                   read: msprobe_scan.Columns | None = None) -> pa.Table:
    """One row per .npy file of a SingleSave dump, in the rlprobe key_data schema (+ rank): the
    folders and statistics files as msprobe_scan.scan_key_data reads them (each file read and
    parsed once), the folders from `listing` (msprobe_scan.list_tensors of `root`) where given, or
    what a second process read (`read`: msprobe_scan.ChildRead.result, the columns and unread entries)."""
    try:
        if read is None:
            listing = listing or msprobe_scan.list_tensors(os.fspath(root))
            read = msprobe_scan.read_statistics(listing), listing.unread
    except msprobe_scan.StatsFileError as e:
        raise DumpReadError(str(e)) from None
    values, unread = read
    warn_unread(root, unread_entries(root, unread), "msprobe")
    shapes = values["shape"]
    missing = [i for i, shape in enumerate(shapes) if shape is None]
    if missing:  # no statistics file (or no shape in it): the npy header still tells the shape
        npys = values["npy"]
        for i in missing:
            shapes[i] = _npy_shape(npys[i])
    values["numel"] = [None if shape is None else math.prod(shape) if all(type(d) is int for d in shape)
                       else int(np.prod(shape, dtype=np.int64)) for shape in shapes]
    n = len(shapes)
    values["framework"] = pa.repeat(pa.scalar("msprobe"), n)
    schema = with_rank(KEY_DATA)
    return pa.table([(values[f.name] if isinstance(values[f.name], pa.Array) else pa.array(values[f.name], f.type))
                     if f.name in values else pa.nulls(n, f.type) for f in schema], schema=schema)


def unread_entries(root: Path, listed: Sequence[str]) -> list[str]:
    """What of the msprobe dump at `root` rlprobe does not read, relative to it (`/` separators): `listed`
    (msprobe_scan's TensorListing.unread: under data/) and the entries beside data/ but configurations*.json
    (lake/configs.py reads or names those), less rlprobe's own temporary files (lake/atomic.py)."""
    with os.scandir(root) as entries:
        beside = [d.name for d in entries if not (d.name == "data" and d.is_dir())
                  and not (d.name.startswith("configurations") and d.name.endswith(".json"))]
    found = sorted(beside) + list(listed)
    return [printable(p) for p in found if not is_own_temporary(p.rpartition("/")[2])]


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


_RANK_DIR = re.compile(r"rank=\d+")
_RANK_MANIFEST = re.compile(r"rank\d+\.json")


def printable(name: str) -> str:
    """`name` as text every writer takes: a byte that is no UTF-8 (os.listdir's surrogate escape) as `\\xff`.
    A surrogate in a warning, an Arrow column or JSON fails where the text is encoded (a pytest-xdist
    worker sending the warning died of it)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_own_temporary(name: str) -> bool:
    """Whether `name` is one of rlprobe's atomic writes' temporaries (`.<name>.tmp-<pid>-<random>`)."""
    return is_temporary(Path(name))


def rlprobe_unread(root: Path) -> list[str]:
    """The entries of the rlprobe dump at `root` that its readers list and leave out, relative to it (`/`
    separators): a `rank*.json` that is no `rank<R>.json`; in `stats/`, what is no folder of a kind
    (lake/layout.py's KINDS); in `stats/<kind>/`, what is no `rank=<R>` folder; in a rank's folder, what is no
    stats part (`part-<first>[-<last>].parquet`)."""
    found = [os.fspath(f) for f in root.glob("rank*.json") if not _RANK_MANIFEST.fullmatch(f.name)]
    for _, kind_path in _entries(root / "stats", found, lambda e: e.name in KINDS and e.is_dir()):
        for _, rank_path in _entries(kind_path, found, lambda e: bool(_RANK_DIR.fullmatch(e.name)) and e.is_dir()):
            _entries(rank_path, found, lambda e: parse_part(Path(e.path)) is not None)
    prefix = len(os.fspath(root)) + 1
    return sorted(printable(path[prefix:].replace(os.sep, "/")) for path in found)


def _entries(folder: Path, unread: list[str], read) -> list[tuple[str, Path]]:
    """(name, path) of `folder`'s entries that `read` (an os.DirEntry predicate) takes; the paths of the others,
    but rlprobe's temporaries, appended to `unread`. None where the folder is missing."""
    taken = []
    try:
        with os.scandir(folder) as entries:
            for e in entries:
                if read(e):
                    taken.append((e.name, Path(e.path)))
                elif not is_own_temporary(e.name):
                    unread.append(e.path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    return sorted(taken)


def warn_unread(root: Path, unread: list[str], writer: str, shown: int = 10) -> None:
    """One UnreadEntriesWarning naming `unread` (the first `shown`, then a count) of `writer`'s ("msprobe",
    "rlprobe") dump at `root`; none where it is empty."""
    if not unread:
        return
    more = f" and {len(unread) - shown} more" if len(unread) > shown else ""
    entries = "1 entry" if len(unread) == 1 else f"{len(unread)} entries"
    warnings.warn(f"rlprobe: {entries} of the {writer} dump {root} not read (in no layout {writer} writes; "
                  f"`rlprobe info` lists them all): {', '.join(unread[:shown])}{more}",
                  UnreadEntriesWarning, stacklevel=3)

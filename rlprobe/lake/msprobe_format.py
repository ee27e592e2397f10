"""Read dumps written by msprobe 8.x as if they were rlprobe dumps.

Key data (SingleSave): data/<key>/step<S>/rank<R>/micro_step<M>/<key>[.<index>].npy + .json
(max/min/mean/norm/shape, no dtype). grad_probe: rank<R>/grad_summary_<S>.csv and
rank<R>/step<S>/<param>.npy sign maps (bool, grad > 0).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rlprobe.errors import DumpReadError
from rlprobe.lake.schema import GRAD, KEY_DATA, with_rank

_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^rank(\d+)$")
_MICRO = re.compile(r"^micro_step(\d+)$")
_GRAD_SUMMARY = re.compile(r"^grad_summary_(\d+)\.csv$")


def is_msprobe_key_data(root: Path) -> bool:
    return (root / "data").is_dir() and not (root / "rlprobe.json").exists()


def is_msprobe_grad(root: Path) -> bool:
    return any(_RANK.match(d.name) and any(d.glob("grad_summary_*.csv")) for d in root.iterdir() if d.is_dir())


def _numbered(parent: Path | str, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    """The sub-folders of `parent` whose names match `pattern` (its group: a number), by number."""
    found = []
    with os.scandir(parent) as entries:
        for d in entries:
            m = pattern.match(d.name)
            if m and d.is_dir():
                found.append((int(m.group(1)), d.path))
    return sorted(found)


def key_data_table(root: Path) -> pa.Table:
    """One row per .npy file of a SingleSave dump, in the rlprobe key_data schema (+ rank).

    Built column by column with os.scandir (a dump has a folder per key, step, rank and micro-step
    and two files per tensor: pathlib and a dict per row cost ~1 ms a tensor); each statistics file
    is read and parsed once."""
    cols: dict[str, list[Any]] = {c: [] for c in ("key", "step", "rank", "micro_step", "index", "tensor_file")}
    keys, steps, ranks, micros, indexes, tensor_files = cols.values()
    metas: list[str | None] = []
    npys: list[str] = []
    root_s = os.fspath(root)
    sep = os.sep
    data = root_s + sep + "data"
    with os.scandir(data) as entries:
        key_names = sorted(d.name for d in entries if d.is_dir())
    for key in key_names:
        for step, step_dir in _numbered(data + sep + key, _STEP):
            for rank, rank_dir in _numbered(step_dir, _RANK):
                for micro, micro_dir in _numbered(rank_dir, _MICRO):
                    names = os.listdir(micro_dir)
                    tensors = sorted(n for n in names if n.endswith(".npy") and not n.startswith("."))
                    if not tensors:
                        continue
                    present = set(names)
                    prefix = micro_dir[len(root_s) + 1:].replace(sep, "/") + "/"
                    base = micro_dir + sep
                    for name in tensors:
                        stem = name[:-4]
                        keys.append(key)
                        steps.append(step)
                        ranks.append(rank)
                        micros.append(micro)
                        indexes.append(_index_of(key, stem))
                        tensor_files.append(prefix + name)
                        npys.append(base + name)
                        meta = stem + ".json"
                        metas.append(base + meta if meta in present else None)
    stats = {c: [] for c in ("shape", "min", "max", "mean", "norm")}
    for npy, meta_file in zip(npys, metas):
        meta = _read_meta(meta_file) if meta_file is not None else {}
        shape = meta.get("shape")
        if shape is None:  # no statistics file: the npy header still tells the shape
            shape = _npy_shape(npy)
        stats["shape"].append(shape)
        for c in ("min", "max", "mean", "norm"):
            stats[c].append(_float(meta.get(c)))
    n = len(npys)
    numel = [None if shape is None else math.prod(shape) if all(type(d) is int for d in shape)
             else int(np.prod(shape, dtype=np.int64)) for shape in stats["shape"]]
    values = {**cols, **stats, "numel": numel, "framework": ["msprobe"] * n}
    schema = with_rank(KEY_DATA)
    return pa.table([pa.array(values[f.name], f.type) if f.name in values else pa.nulls(n, f.type)
                     for f in schema], schema=schema)


_decode = json.JSONDecoder().decode


def _read_meta(meta_file: str) -> dict[str, Any]:
    text = _read_text(meta_file)
    try:
        meta = _decode(text)
    except ValueError as e:
        raise DumpReadError(f"{meta_file}: not valid JSON ({e}); expected msprobe's statistics file") from None
    data = meta.get("data", {}) if isinstance(meta, dict) else {}
    return data if isinstance(data, dict) else {}


def _read_text(path: str) -> str:
    """The file's UTF-8 text, read with os.open/os.read: a dump holds one statistics file per tensor,
    and a text file object costs more than reading them (issue 18)."""
    fd = os.open(path, _O_READ)
    try:
        data = os.read(fd, _READ_SIZE)
        if len(data) == _READ_SIZE:  # a regular file reads short only at its end: the rest, if any
            parts = [data]
            while part := os.read(fd, _READ_SIZE):
                parts.append(part)
            data = b"".join(parts)
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DumpReadError(f"{path}: not valid JSON ({e}); expected msprobe's statistics file") from None


_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_READ_SIZE = 1 << 16


def _npy_shape(npy: str) -> list[int] | None:
    try:
        return list(np.load(npy, mmap_mode="r").shape)
    except (OSError, ValueError):
        return None


def _index_of(key: str, stem: str) -> str:
    if stem == key:
        return ""
    if stem.startswith(key + "."):
        return stem[len(key) + 1:]
    return stem


def _float(value: Any) -> float | None:
    if type(value) is float:  # what msprobe writes
        return value
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def grad_table(root: Path) -> pa.Table:
    """grad_probe summaries in the rlprobe `grad` schema (+ rank): one row per (rank, step, param).
    Sign maps are msprobe's bool .npy per parameter, so sign_offset is null (docs/grads.md)."""
    rows: list[dict[str, Any]] = []
    for rank, rank_path in _numbered(root, _RANK):
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
            with open(f, newline="", encoding="utf-8-sig") as fh:
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

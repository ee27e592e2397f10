"""The folders and statistics files of an msprobe SingleSave dump, read with the standard library
only: rlprobe.lake.msprobe_format builds the key_data table from what `scan_key_data` returns, in
this process or, for a second run read at once, in a child Python that runs this file
(`python -I -S msprobe_scan.py ROOT`: no site-packages, nothing of rlprobe's imported).

Why a child: the reading is Python (a folder listing per micro-step, a JSON file per tensor) and
holds the GIL, so two threads reading both runs take their sum; two processes take the longer one
(docs/compare.md, "sixth session: two workers on small dumps").
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^rank(\d+)$")
_MICRO = re.compile(r"^micro_step(\d+)$")
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_READ_SIZE = 1 << 16
_decode = json.JSONDecoder().decode
# the columns scan_key_data returns, in this order (a child writes them as one JSON list)
COLUMNS = ("key", "step", "rank", "micro_step", "index", "tensor_file", "npy", "shape", "min", "max", "mean", "norm")


class StatsFileError(ValueError):
    """A statistics file that is not msprobe's JSON (msprobe_format raises it as DumpReadError)."""


def numbered(parent: str, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    """The sub-folders of `parent` whose names match `pattern` (its group: a number), by number."""
    found = []
    with os.scandir(parent) as entries:
        for d in entries:
            m = pattern.match(d.name)
            if m and d.is_dir():
                found.append((int(m.group(1)), d.path))
    return sorted(found)


def scan_key_data(root: str) -> dict[str, list[Any]]:
    """One entry per .npy file of the dump under `root`, by key, step, rank, micro-step and name:
    where it is (`tensor_file` relative to the dump, `npy` absolute) and its statistics file's
    shape, min, max, mean and norm (None where the file or the value is missing: `shape` is then
    read from the .npy header by the caller). Raises StatsFileError for a statistics file that is
    not JSON, OSError where a folder or file cannot be read."""
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    keys, steps, ranks, micros, indexes, tensor_files, npys = (cols[c] for c in COLUMNS[:7])
    metas: list[str | None] = []
    sep = os.sep
    data = root + sep + "data"
    with os.scandir(data) as entries:
        key_names = sorted(d.name for d in entries if d.is_dir())
    for key in key_names:
        for step, step_dir in numbered(data + sep + key, _STEP):
            for rank, rank_dir in numbered(step_dir, _RANK):
                for micro, micro_dir in numbered(rank_dir, _MICRO):
                    names = os.listdir(micro_dir)
                    tensors = sorted(n for n in names if n.endswith(".npy") and not n.startswith("."))
                    if not tensors:
                        continue
                    present = set(names)
                    prefix = micro_dir[len(root) + 1:].replace(sep, "/") + "/"
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
    shapes, stats = cols["shape"], [cols[c] for c in ("min", "max", "mean", "norm")]
    for meta_file in metas:
        meta = _read_meta(meta_file) if meta_file is not None else {}
        shapes.append(meta.get("shape"))
        for column, name in zip(stats, ("min", "max", "mean", "norm")):
            column.append(as_float(meta.get(name)))
    return cols


def tensors_estimate(root: str) -> int:
    """About how many tensors the dump under `root` holds, from one listing a level: its keys x the
    first key's steps x that step's ranks x that rank's micro-steps x the first micro-step's .npy
    files (0 where a folder cannot be read)."""
    try:
        data = root + os.sep + "data"
        with os.scandir(data) as entries:
            keys = sorted(d.path for d in entries if d.is_dir())
        count, folder = len(keys), keys[0] if keys else None
        for pattern in (_STEP, _RANK, _MICRO):
            found = numbered(folder, pattern) if folder is not None else []
            count *= len(found)
            folder = found[0][1] if found else None
        return count * sum(1 for n in os.listdir(folder) if n.endswith(".npy")) if folder is not None else 0
    except OSError:
        return 0


def _read_meta(meta_file: str) -> dict[str, Any]:
    text = _read_text(meta_file)
    try:
        meta = _decode(text)
    except ValueError as e:
        raise StatsFileError(f"{meta_file}: not valid JSON ({e}); expected msprobe's statistics file") from None
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
        raise StatsFileError(f"{path}: not valid JSON ({e}); expected msprobe's statistics file") from None


def _index_of(key: str, stem: str) -> str:
    if stem == key:
        return ""
    if stem.startswith(key + "."):
        return stem[len(key) + 1:]
    return stem


def as_float(value: Any) -> float | None:
    """A statistic as a float (None: missing or not a number)."""
    if type(value) is float:  # what msprobe writes
        return value
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def main(argv: list[str]) -> int:
    """The child: scan_key_data(argv[1]) as one JSON list of the columns on stdout (floats as repr,
    NaN and infinities as JSON's NaN/Infinity: they read back to the same values); exit 1 on any
    error, for the parent to read the run itself and report the error as it does."""
    try:
        cols = scan_key_data(argv[1])
        out = json.dumps([cols[c] for c in COLUMNS], separators=(",", ":")).encode()
    except Exception:  # noqa: BLE001 - the parent reads the run again and raises the precise error
        return 1
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

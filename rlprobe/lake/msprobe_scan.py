"""The folders and statistics files of an msprobe SingleSave dump, read with the standard library
only: rlprobe.lake.msprobe_format builds the key_data table from what `scan_key_data` returns.

The reading is two steps, `list_tensors` (a folder listing per micro-step) and `read_statistics`
(a JSON file per tensor); a Dump can list first (Dump.msprobe_tensor_files) and read from that listing.
`ChildRead` runs both in a second interpreter (this module and the standard library only), so that a
comparison reads run B's statistics there while it reads run A's here (one GIL each).
"""

from __future__ import annotations

import json
import marshal
import os
import re
import subprocess
import sys
from typing import Any, NamedTuple, Tuple

from rlprobe.lake.regular_files import MSPROBE_STATS, NotRegularFileError, open_fd

_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^rank(\d+)$")
_MICRO = re.compile(r"^micro_step(\d+)$")
_NUMBERED = re.compile(r"^.+_(\d+)$")  # <name>_<N>.npy in rank<R>/: id N to msprobe 26.x's comparator
_READ_SIZE = 1 << 16
_PIPE_SIZE = 1 << 20
_decode = json.JSONDecoder().decode
# the columns scan_key_data returns, in this order
COLUMNS = ("key", "step", "rank", "micro_step", "index", "tensor_file", "npy", "shape", "min", "max", "mean", "norm")


#: what a reading returns: scan_key_data's columns and TensorListing.unread
Columns = Tuple[dict[str, list[Any]], tuple[str, ...]]


class StatsFileError(ValueError):
    """A statistics file that is not msprobe's JSON, or not a regular file (a FIFO, a device: never read,
    lake/regular_files.py); msprobe_format raises it as DumpReadError."""


def numbered(parent: str, pattern: re.Pattern[str], unread: list[str] | None = None) -> list[tuple[int, str]]:
    """The sub-folders of `parent` whose names match `pattern` (its group: a number), by number; the paths of
    the other entries appended to `unread` where given."""
    found = []
    with os.scandir(parent) as entries:
        for d in entries:
            m = pattern.match(d.name)
            if m and d.is_dir():
                found.append((int(m.group(1)), d.path))
            elif unread is not None:
                unread.append(d.path)
    return sorted(found)


class TensorListing(NamedTuple):
    """What list_tensors found: the columns key to npy of COLUMNS (one entry per .npy file), each
    file's statistics file (absolute; None where there is none) and the entries under data/ that are neither
    (relative to the dump, `/` separators: msprobe_format.unread_entries names them)."""

    columns: dict[str, list[Any]]
    metas: list[str | None]
    unread: tuple[str, ...] = ()


def scan_key_data(root: str) -> dict[str, list[Any]]:
    """One entry per .npy file of the dump under `root`, by key, step, rank, micro-step and name:
    where it is (`tensor_file` relative to the dump, `npy` absolute) and its statistics file's
    shape, min, max, mean and norm (None where the file or the value is missing: `shape` is then
    read from the .npy header by the caller). Raises StatsFileError for a statistics file that is
    not JSON or not a regular file, OSError where a folder or file cannot be read."""
    return read_statistics(list_tensors(root))


def list_tensors(root: str) -> TensorListing:
    """The .npy files of the dump under `root` (scan_key_data's first step: the folders only), in every
    layout msprobe's SingleSave writes (docs/dump-format.md, "msprobe dumps"): in a `micro_step<M>/` folder,
    or directly in `rank<R>/` (micro-step 0, as msprobe's comparator reads them; `<key>_<N>.npy` there is
    index N; one of an index micro_step0/ also holds is not read). Everything else under `data/` is listed in
    `unread`. Raises OSError where a folder cannot be read."""
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS[:7]}
    metas: list[str | None] = []
    unread: list[str] = []
    sep = os.sep
    data = root + sep + "data"
    key_names = []
    with os.scandir(data) as entries:
        for d in entries:
            if d.is_dir():
                key_names.append(d.name)
            else:
                unread.append(d.path)
    for key in sorted(key_names):
        for step, step_dir in numbered(data + sep + key, _STEP, unread):
            for rank, rank_dir in numbered(step_dir, _RANK, unread):
                micro_dirs = []
                with os.scandir(rank_dir) as entries:
                    names = []
                    for d in entries:
                        m = _MICRO.match(d.name)
                        if m and d.is_dir():
                            micro_dirs.append((int(m.group(1)), d.path))
                        else:
                            names.append(d.name)
                taken = len(cols["key"])
                for micro, micro_dir in sorted(micro_dirs):
                    _add_folder(root, micro_dir, os.listdir(micro_dir), key, (step, rank, micro), cols, metas, unread)
                if names:  # tensors saved without micro_batch (msprobe's save_ex): micro-step 0, unless
                    # micro_step0/ holds the same index (save() too in that step: it wins, the other is named)
                    zero = {i for i, m in zip(cols["index"][taken:], cols["micro_step"][taken:]) if m == 0}
                    _add_folder(root, rank_dir, names, key, (step, rank, 0), cols, metas, unread, taken=zero)
    return TensorListing(cols, metas, tuple(sorted(p[len(root) + 1:].replace(sep, "/") for p in unread)))


def _add_folder(root: str, folder: str, names: list[str], key: str, where: tuple[int, int, int],
                cols: dict[str, list[Any]], metas: list[str | None], unread: list[str],
                taken: set[str] | None = None) -> None:
    """The tensors of one folder of names `names` (a micro-step's, or a rank's where `taken`: the indexes its
    micro_step0/ holds, grown by the rank's own) into `cols` and `metas`; what is neither a tensor nor a statistics
    file, and a rank's tensor of an index already taken, into `unread` (absolute paths)."""
    keys, steps, ranks, micros, indexes, tensor_files, npys = cols.values()
    present = set(names)
    base = folder + os.sep
    for name in names:
        if not ((name.endswith(".npy") and not name.startswith("."))
                or (name.endswith(".json") and (name[:-5] + ".npy" in present or name[:-5] == key))):
            unread.append(base + name)
    prefix = folder[len(root) + 1:].replace(os.sep, "/") + "/"
    step, rank, micro = where
    for name in sorted(n for n in names if n.endswith(".npy") and not n.startswith(".")):
        stem = name[:-4]
        numbered_id = _NUMBERED.match(stem) if taken is not None else None
        index = (numbered_id.group(1) if numbered_id and stem[:numbered_id.start(1) - 1] == key
                 else _index_of(key, stem))
        if taken is not None:
            if index in taken:  # <key>.1.npy beside <key>_1.npy, or in micro_step0/ too: the first is read
                unread.append(base + name)
                continue
            taken.add(index)
        keys.append(key)
        steps.append(step)
        ranks.append(rank)
        micros.append(micro)
        indexes.append(index)
        tensor_files.append(prefix + name)
        npys.append(base + name)
        meta = stem + ".json"
        metas.append(base + meta if meta in present else None)


def read_statistics(listing: TensorListing) -> dict[str, list[Any]]:
    """scan_key_data's columns from a listing (its second step: each statistics file read once).
    Raises StatsFileError for a statistics file that is not JSON or not a regular file, OSError where one
    cannot be read."""
    cols: dict[str, list[Any]] = {**listing.columns, **{c: [] for c in COLUMNS[7:]}}
    shapes, mins, maxes, means, norms = (cols[c] for c in ("shape", "min", "max", "mean", "norm"))
    read_head, decode, empty = _read_head, _decode, {}
    for meta_file in listing.metas:  # a loop of few calls: it runs once a tensor, holding the GIL
        data = empty
        if meta_file is not None:
            head = read_head(meta_file)
            try:
                meta = decode(head.decode()) if len(head) < _READ_SIZE else None
            except ValueError:  # not UTF-8 or not JSON: _read_meta names the file and the problem
                meta = None
            if meta is None:
                data = _read_meta(meta_file)
            elif type(meta) is dict:
                data = meta.get("data", empty)
                if type(data) is not dict:
                    data = empty
        shapes.append(data.get("shape"))
        value = data.get("min")
        mins.append(value if type(value) is float else as_float(value))
        value = data.get("max")
        maxes.append(value if type(value) is float else as_float(value))
        value = data.get("mean")
        means.append(value if type(value) is float else as_float(value))
        value = data.get("norm")
        norms.append(value if type(value) is float else as_float(value))
    return cols


def _read_head(path: str, whole: bool = False) -> bytes:
    """Up to _READ_SIZE bytes of the statistics file (a few hundred: all of it), or `whole` of it, read with
    os.open/os.read (a text file object costs more than reading one, issue 18); StatsFileError where it is
    not a regular file."""
    try:
        fd = open_fd(path, MSPROBE_STATS)[0]
    except NotRegularFileError as e:
        raise StatsFileError(str(e)) from None
    try:
        parts = [os.read(fd, _READ_SIZE)]
        while whole and len(parts[-1]) and (len(parts) > 1 or len(parts[0]) == _READ_SIZE):
            parts.append(os.read(fd, _READ_SIZE))  # a regular file reads short only at its end
    finally:
        os.close(fd)
    return b"".join(parts)


def _read_meta(meta_file: str) -> dict[str, Any]:
    try:
        meta = _decode(_read_head(meta_file, whole=True).decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError among them
        raise StatsFileError(f"{meta_file}: not valid JSON ({e}); expected msprobe's statistics file") from None
    data = meta.get("data", {}) if isinstance(meta, dict) else {}
    return data if isinstance(data, dict) else {}


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


class ChildRead:
    """The columns of the dump under `root` (scan_key_data's and its listing's unread entries), read by a
    second interpreter started now (`python -S`: this module and the standard library only, no thread of this
    process copied: started by exec) and handed back marshalled through a pipe."""

    _CODE = ("import sys; sys.path.insert(0, sys.argv[1]); "
             "from rlprobe.lake.msprobe_scan import write_columns; write_columns(sys.argv[2])")

    def __init__(self, root: str) -> None:
        self._root = root
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self._process = subprocess.Popen([sys.executable, "-S", "-c", self._CODE, package_parent, root],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL)
        try:  # room in the pipe for all of it (~0.3 MB for 3,200 tensors): the child writes it and ends
            import fcntl

            fcntl.fcntl(self._process.stdout.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_SIZE)  # type: ignore[union-attr]
        except (ImportError, AttributeError, OSError):  # not Linux, or over the system's limit: the pipe as it is
            pass

    def result(self) -> Columns | None:
        """The columns; None where the reading failed (this process reads the dump again and names the problem)."""
        try:
            out, _ = self._process.communicate()
        except OSError:
            return None
        if self._process.returncode != 0:
            return None
        try:
            values, unread = marshal.loads(out)
        except (ValueError, EOFError, TypeError):
            return None
        base = self._root + os.sep  # `npy` is the dump's folder and `tensor_file`: not sent
        values["npy"] = [base + f.replace("/", os.sep) for f in values["tensor_file"]]
        return values, tuple(unread)

    def close(self) -> None:
        """Stop the reading (its result no longer wanted)."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.communicate()


#: tensors (estimated: start_reading) from which a dump is read in a second interpreter. Its start (~80 ms of
#: CPU) costs more than reading a few hundred tensors' statistics here (~40 µs a tensor: 10 ms for 256), and a
#: one-step or large-tensor comparison's child took CPU from its imports on a two-core machine
CHILD_MIN_TENSORS = 1024


def start_reading(root: Any, least: int = CHILD_MIN_TENSORS) -> ChildRead | None:
    """A ChildRead of the dump at `root` where it looks like an msprobe SingleSave dump (a data/ folder, no
    rlprobe.json) of about `least` tensors or more; None for another, a smaller one (read where it is asked
    for), or where the process cannot start. The tensors are estimated from four folders, not counted: its
    keys x the first key's steps x that step's ranks x that rank's entries (micro-step folders, or files)."""
    try:
        root = os.fspath(root)
        folder = os.path.join(root, "data")
        if not os.path.isdir(folder) or os.path.exists(os.path.join(root, "rlprobe.json")):
            return None
        estimate = 1
        for _ in range(4):
            with os.scandir(folder) as entries:
                names = [(not e.is_dir(), e.name) for e in entries if not e.name.startswith(".")]
            estimate *= max(len(names), 1)
            if not names or min(names)[0]:  # no folder below: the count is the estimate
                break
            folder = os.path.join(folder, min(names)[1])
        return ChildRead(root) if estimate >= least else None
    except (TypeError, OSError):
        return None


class ReadAhead:
    """A dump's reading in a second process (Dump.reading_ahead): `start` it (or hand it one), `take` its columns
    (None: none started, or it failed), `stop` it (its result not wanted)."""

    def __init__(self, root: Any) -> None:
        self._root = root
        self._reading: ChildRead | None = None

    def start(self, reading: ChildRead | None = None) -> None:
        if self._reading is None:
            self._reading = reading or start_reading(self._root)
        elif reading is not None:
            reading.close()

    def take(self) -> Columns | None:
        reading, self._reading = self._reading, None
        return None if reading is None else reading.result()

    def stop(self) -> None:
        reading, self._reading = self._reading, None
        if reading is not None:
            reading.close()


class ReadingsAhead:
    """ChildReads of the dumps at `roots` (start_reading's: None for one that is no msprobe dump), started on
    entering; `take(i)` hands one on (to Dump.reading_ahead.start), and leaving stops those not taken."""

    def __init__(self, roots: Any) -> None:
        self._roots = list(roots)
        self._readings: list[ChildRead | None] = []

    def __enter__(self) -> ReadingsAhead:
        self._readings = [start_reading(root) for root in self._roots]
        return self

    def take(self, i: int) -> ChildRead | None:
        reading, self._readings[i] = self._readings[i], None
        return reading

    def __exit__(self, *exc: object) -> None:
        for reading in self._readings:
            if reading is not None:
                reading.close()


def write_columns(root: str) -> None:
    """ChildRead's second process: the columns of the dump under `root`, marshalled to stdout (exit status 1
    where a folder or a statistics file cannot be read)."""
    try:
        listing = list_tensors(root)
        values = read_statistics(listing)
    except (OSError, StatsFileError):
        sys.exit(1)
    del values["npy"]
    sys.stdout.buffer.write(marshal.dumps((values, listing.unread)))

"""Where every file of a dump lives (format version 1) and how names become safe paths."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rlprobe.errors import DumpReadError, ProbeError

FORMAT_VERSION = 1
KINDS = ("key_data", "grad", "module", "scalar", "sample", "param", "module_param")
RUN_MANIFEST = "rlprobe.json"
PACK_SUFFIX = ".npys"  # a save call's key-data tensors, each a .npy record at an offset (lake/tensor_pack.py)
PLAIN_TENSOR_FILE = "_"  # file stem for index '' (a plain tensor, not a list/dict item)

_SAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_PART = re.compile(r"^part-(\d+)(?:-(\d+))?\.parquet$")
_MAX_NAME = 120
_MAX_FILE_STEM = 200


def rank_manifest_name(rank: int) -> str:
    return f"rank{rank}.json"


def config_file_name(rank: int) -> str:
    return "configurations.json" if rank == 0 else f"configurations.rank{rank}.json"


def check_text(name: object, what: str, where: str) -> str:
    """Refuse names that are not strings, are empty, hold a NUL or cannot be written as UTF-8
    (Parquet strings and file names are UTF-8); return the name."""
    if not isinstance(name, str):
        raise ProbeError(f"{where}: {what} must be a string, got {type(name).__name__} {name!r}")
    if name == "" or name.strip() == "":
        raise ProbeError(f"{where}: {what} is empty; give it a name such as 'log_prob'")
    if "\x00" in name:
        raise ProbeError(f"{where}: {what} {name!r} contains a NUL character")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ProbeError(f"{where}: {what} {name!r} is not valid Unicode text (a lone surrogate "
                         f"{name[e.start]!r} at position {e.start}, as from bytes decoded with "
                         "errors='surrogateescape'); give a name that can be written as UTF-8") from None
    return name


def check_name(name: object, what: str, where: str) -> str:
    """check_text, and refuse names that try to leave the dump; return the name."""
    check_text(name, what, where)
    assert isinstance(name, str)
    parts = re.split(r"[/\\]", name)
    if name.startswith(("/", "\\")) or ".." in parts or re.match(r"^[A-Za-z]:[/\\]", name):
        raise ProbeError(
            f"{where}: {what} {name!r} would write outside the dump directory; "
            "use a plain name without '..', a leading '/' or a drive such as 'C:\\'"
        )
    return name


def safe_component(name: str) -> str:
    """A path component for `name`: itself when already safe, else a cleaned form plus a hash."""
    cleaned = _SAFE.sub("_", name)
    if cleaned.startswith("."):
        cleaned = "_" + cleaned[1:]
    if cleaned == name and len(name) <= _MAX_NAME:
        return name
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=4).hexdigest()
    return f"{cleaned[:_MAX_NAME]}~{digest}"


# the writer names a file per tensor; keys and indexes repeat every step
_component = lru_cache(maxsize=4096)(safe_component)


def key_data_call_dir(step: int, rank: int, call: int) -> str:
    """The folder of one save call's key-data tensors as written before packing (and by the importer), relative to the dump root, POSIX separators:
    written as a hidden temporary folder and renamed into place once, complete (lake/atomic.py)."""
    return f"tensors/key_data/step={step}/rank={rank}/call={call}"


def key_data_pack(rank: int, first_step: int, call: int, last_step: int) -> str:
    """The packed file of the key-data tensors of the save calls the writer takes together, from the
    `call`-th of `first_step` to one of `last_step` (docs/dump-format.md, change 14), relative to the dump
    root, POSIX separators: each tensor a .npy record at an offset (lake/tensor_pack.py), written as a
    hidden temporary file and renamed into place once. One folder a rank, no folder a step: creating two
    folders a step cost the writer more than the rest of its file work."""
    return f"tensors/key_data/rank={rank}/steps={first_step}-{last_step}.call={call}{PACK_SUFFIX}"


_PACK_NAME = re.compile(r"^steps=(\d+)-(\d+)\.call=\d+" + re.escape(PACK_SUFFIX) + "$")


def pack_steps(name: str) -> tuple[int, int] | None:
    """(first step, last step) of a packed file named by key_data_pack; None for another name."""
    m = _PACK_NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def key_data_file_name(key: str, index: str) -> str:
    """A key-data tensor's file name in its call's folder: `<key>.npy`, or `<key>@<index>.npy` for
    an item of a list or dict. `@` is never part of a safe component, so names cannot collide."""
    name = _component(key) if not index else f"{_component(key)}@{_component(index)}"
    if len(name) > _MAX_FILE_STEM:  # two long names: keep the file name under the usual 255 bytes
        digest = hashlib.blake2b(f"{key}\x00{index}".encode("utf-8"), digest_size=4).hexdigest()
        name = f"{name[:_MAX_NAME]}~{digest}"
    return f"{name}.npy"


@dataclass(frozen=True)
class Part:
    """One stats Parquet file, covering flush sequence numbers first..last."""

    path: Path
    first: int
    last: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1


def part_name(first: int, last: int) -> str:
    return f"part-{first:06d}.parquet" if first == last else f"part-{first:06d}-{last:06d}.parquet"


def parse_part(path: Path) -> Part | None:
    m = _PART.match(path.name)
    if not m:
        return None
    first = int(m.group(1))
    return Part(path, first, int(m.group(2)) if m.group(2) else first)


class DumpLayout:
    """Paths inside one dump directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def run_manifest(self) -> Path:
        return self.root / RUN_MANIFEST

    def rank_manifest(self, rank: int) -> Path:
        return self.root / rank_manifest_name(rank)

    def config_file(self, rank: int) -> Path:
        return self.root / config_file_name(rank)

    def stats_dir(self, kind: str, rank: int) -> Path:
        return self.root / "stats" / kind / f"rank={rank}"

    def module_tensor(self, stage: str, step: int, rank: int, seq: int, io: str, index: str) -> Path:
        stem = safe_component(index) if index else PLAIN_TENSOR_FILE
        return (
            self.root / "tensors" / "module" / f"stage={safe_component(stage)}" / f"step={step}"
            / f"rank={rank}" / f"{seq}.{io}.{stem}.npy"
        )

    def grad_signs(self, monitor: str, step: int, rank: int) -> Path:
        """Packed gradient-sign bits of every parameter of one monitor, step and rank."""
        return (self.root / "tensors" / "grad_sign" / f"monitor={safe_component(monitor)}" / f"step={step}"
                / f"rank={rank}" / "signs.npy")

    def rank_dirs(self, kind: str) -> dict[int, Path]:
        base = self.root / "stats" / kind
        found: dict[int, Path] = {}
        if base.is_dir():
            for d in base.iterdir():
                if d.is_dir() and d.name.startswith("rank="):
                    try:
                        found[int(d.name[5:])] = d
                    except ValueError:
                        continue
        return found

    def rank_dirs_for(self, rank: int) -> list[str]:
        """Kinds that have a stats directory for `rank`."""
        base = self.root / "stats"
        if not base.is_dir():
            return []
        return sorted(k.name for k in base.iterdir() if (k / f"rank={rank}").is_dir())

    def ranks_with_stats(self) -> set[int]:
        """Every rank that has a stats directory of any kind."""
        base = self.root / "stats"
        kinds = [k.name for k in base.iterdir() if k.is_dir()] if base.is_dir() else []
        return {rank for kind in kinds for rank in self.rank_dirs(kind)}

    def first_tensor_dir(self, rank: int) -> Path | None:
        """A `tensors/key_data/rank=<rank>` or `tensors/<kind>/[<name>/]step=<S>/rank=<rank>` directory, if there
        is one: stops at the first."""
        base = self.root / "tensors"
        if not base.is_dir():
            return None
        packs = base / "key_data" / f"rank={rank}"
        if packs.is_dir() and next(packs.iterdir(), None) is not None:
            return packs
        for kind in base.iterdir():
            for child in kind.iterdir() if kind.is_dir() else ():
                if child.name.startswith("rank="):  # another rank's packed key data
                    continue
                # key data: step=<S>/rank=<R>; module, grad_sign and older key data: <name>/step=<S>/rank=<R>
                steps = [child] if child.name.startswith("step=") else child.iterdir() if child.is_dir() else ()
                for step in steps:
                    candidate = step / f"rank={rank}"
                    if candidate.is_dir():
                        return candidate
        return None

    def live_parts(self, kind: str, rank: int | None = None) -> list[Part]:
        """Parts to read: those not covered by a merged part (a merge killed before it removed
        the parts it replaced leaves them behind; they are ignored, and removed by compact)."""
        dirs = self.rank_dirs(kind) if rank is None else {rank: self.stats_dir(kind, rank)}
        live: list[Part] = []
        for d in dirs.values():
            live.extend(live_parts_in(d)[0])
        return sorted(live, key=lambda p: (str(p.path.parent), p.first))


def parts_in(directory: Path) -> list[Part]:
    """Every part file of one rank directory, live or covered, unordered."""
    if not directory.is_dir():
        return []
    return [p for p in (parse_part(f) for f in directory.iterdir()) if p is not None]


def live_parts_in(directory: Path) -> tuple[list[Part], list[Part]]:
    """(live, covered) parts of one rank directory.

    Merges take a contiguous run of live parts, so two parts either nest or are disjoint. Two
    that overlap only in part were made by two merges of one rank at once (which the rank lock
    prevents; see lake/rank_lock.py): the rows of the shared flushes are in both, and no choice
    of files reads them once, so this raises DumpReadError naming both files."""
    parts = parts_in(directory)
    # widest first, so a merged part claims its range before the parts it replaced
    parts.sort(key=lambda p: (p.first, -p.size))
    live: list[Part] = []
    covered: list[Part] = []
    reach: Part | None = None
    for p in parts:
        if reach is not None and p.last <= reach.last:
            covered.append(p)
            continue
        if reach is not None and p.first <= reach.last:
            raise DumpReadError(
                f"{directory}: stats parts {reach.path.name} and {p.path.name} overlap: the rows of flushes "
                f"{p.first}-{reach.last} are in both, written by two merges of this rank at once (a process that "
                "ignored the rank lock); readers refuse to count them twice. Keep a copy, then rewrite the two "
                "files as one without the duplicated rows")
        live.append(p)
        reach = p
    return live, covered

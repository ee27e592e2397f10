"""What of a dump rlprobe does not read, named, never an error: msprobe itself ignores folders it does not know,
and a file or folder that vanished from every table without a word hid a dump's key data (docs/dump-format.md,
"msprobe dumps"). For an rlprobe dump, the entries where its readers list names (the rank manifests and
`stats/<kind>/rank=<R>/`); for an msprobe dump, msprobe_format.unread_entries. rlprobe's own temporary files
(lake/atomic.py) are never named."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from rlprobe.errors import UnreadEntriesWarning
from rlprobe.lake.atomic import is_temporary
from rlprobe.lake.layout import KINDS, parse_part

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

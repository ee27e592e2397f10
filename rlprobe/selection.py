"""Selections shared by the CLI, rlprobe.compare(), probes and pipelines: steps and ranks such as "0-10,12" or
[0, "4-6"], keys such as "log_prob,ref_log_prob" or ["log_prob"]."""

from __future__ import annotations

from typing import Iterable


# values a selection may hold: its list is made in memory and matched row by row ("0-99999999999" took all of it)
MAX_SELECTED = 1_000_000


def parse_int_set(spec: str | int | Iterable[int | str] | None, what: str = "steps") -> list[int] | None:
    """"0-3,7" -> [0, 1, 2, 3, 7]; None or "all" -> None (everything). ValueError for a selection of more than
    MAX_SELECTED values."""
    if spec is None:
        return None
    if isinstance(spec, int):
        return [spec]
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    if isinstance(spec, str) and spec.strip().lower() in ("all", ""):
        return None
    values: set[int] = set()
    for item in items:
        values.update([item] if isinstance(item, int) else _numbers(item, what))
        if len(values) > MAX_SELECTED:
            raise ValueError(_too_many(item, what))
    return sorted(values)


def _numbers(item: object, what: str) -> range:
    """The numbers of one item of a selection: "7" or "4-6" (ValueError naming `what` for any other form, or a
    range of more than MAX_SELECTED numbers, refused before it is made)."""
    text = str(item).strip()
    lo, sep, hi = text.partition("-")
    try:
        first, last = int(lo), int(hi if sep else lo)
    except ValueError:
        first, last = -1, -1
    if first < 0 or last < first:
        raise ValueError(f"{what}: {item!r} is not a number or a range like 4-6 (expected e.g. '0-10,12')")
    if last - first + 1 > MAX_SELECTED:
        raise ValueError(_too_many(item, what))
    return range(first, last + 1)


def _too_many(item: object, what: str) -> str:
    return f"{what}: {item!r} makes a selection of more than {MAX_SELECTED:,} values (leave {what} out to select them all)"


def parse_key_list(spec: str | Iterable[str] | None, what: str = "keys") -> list[str] | None:
    """"log_prob, ref_log_prob" or a list of names -> the names; None, "all" or "" -> None (every key). ValueError
    for a name that is not a text."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("all", "")):
        return None
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"{what}: {name!r} is not a key name (expected e.g. 'log_prob,ref_log_prob')")
    return [n.strip() for n in names if n.strip()] or None

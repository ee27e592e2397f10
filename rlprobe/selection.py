"""Step/rank selections such as "0-10,12" or [0, "4-6"], shared by the CLI, probes and pipelines."""

from __future__ import annotations

from typing import Iterable


def parse_int_set(spec: str | int | Iterable[int | str] | None, what: str = "steps") -> list[int] | None:
    """"0-3,7" -> [0, 1, 2, 3, 7]; None or "all" -> None (everything)."""
    if spec is None:
        return None
    if isinstance(spec, int):
        return [spec]
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    if isinstance(spec, str) and spec.strip().lower() in ("all", ""):
        return None
    values: set[int] = set()
    for item in items:
        if isinstance(item, int):
            values.add(item)
            continue
        text = str(item).strip()
        try:
            if "-" in text:
                lo, hi = text.split("-", 1)
                lo_i, hi_i = int(lo), int(hi)
                if lo_i < 0 or hi_i < lo_i:
                    raise ValueError
                values.update(range(lo_i, hi_i + 1))
            else:
                values.add(int(text))
                if int(text) < 0:
                    raise ValueError
        except ValueError:
            raise ValueError(f"{what}: {item!r} is not a number or a range like 4-6 (expected e.g. '0-10,12')") from None
    return sorted(values)

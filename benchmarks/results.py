"""The sections of benchmarks/RESULTS.md that the benchmark scripts write themselves (`--record`).

Each section holds the latest figures of one script: what was run, on which machine, when, and a table. It
lies between two marker lines naming the script, and a later `--record` of that script replaces it whole, so
the file keeps the latest figures only (older ones are in git log). A script's first record appends its
section at the end of the file. The file is replaced atomically (written beside it, then renamed).
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path
from typing import Any, Sequence

RESULTS = Path(__file__).resolve().with_name("RESULTS.md")


def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- results:{name} (written by the script's --record: edit the script, not this section) -->",
            f"<!-- /results:{name} -->")


def machine() -> str:
    """The machine in a few words: CPUs, their model, the 1-minute load average now."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model}), load {os.getloadavg()[0]:.1f}"


def cell(value: Any) -> str:
    """A table cell: floats to 3 significant digits, None as empty, pipes escaped."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def section(name: str, title: str, command: str, header: Sequence[str], rows: Sequence[Sequence[Any]],
            notes: str = "") -> str:
    begin, end = _markers(name)
    lines = [begin, f"### {title}", "",
             f"`{command}` on {machine()}, {datetime.date.today().isoformat()}:", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"results section {name!r}: a row of {len(row)} cells under {len(header)} headers: {row!r}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    if notes:
        lines += ["", notes.strip()]
    return "\n".join(lines + [end]) + "\n"


def record(name: str, title: str, command: str, header: Sequence[str], rows: Sequence[Sequence[Any]],
           notes: str = "", path: Path | None = None) -> Path:
    """Write (or replace) the section `name` of `path` (default benchmarks/RESULTS.md)."""
    path = path or RESULTS
    begin, end = _markers(name)
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    new = section(name, title, command, header, rows, notes)
    start = text.find(begin)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + new
    else:
        stop = text.find(end, start)
        if stop < 0:
            raise ValueError(f"{path}: the section {name!r} has no end marker {end!r}; put it back or delete the "
                             "section's begin marker")
        text = text[:start] + new + text[stop + len(end):].removeprefix("\n")
    fresh = path.with_name(f".{path.name}.{os.getpid()}")
    fresh.write_text(text, encoding="utf-8")
    os.replace(fresh, path)
    return path

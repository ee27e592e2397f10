"""The consoles rlprobe prints through: a path, a number or a table cell is never split across lines.

To a terminal, a message wraps only at the spaces between words, never inside a word (a path,
a number) nor inside a span marked with `whole()`; a word wider than the terminal keeps its own
line. To a pipe or a file nothing is wrapped or cut: a script or a log reads each line as printed,
whatever COLUMNS says. A table is drawn at its natural width, or, where that is wider than the
terminal, shown one block of `column  value` lines per row (psql's expanded display).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Sequence
from typing import IO, Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.table import Column, Table
from rich.text import Text
from rich.theme import Theme

WHOLE = "whole"
# a pipe or a file gets lines as long as they are; rich needs a number, and draws nothing this wide
UNWRAPPED_WIDTH = 1_000_000
_BREAKS = re.compile(r" +")


def whole(value: object) -> str:
    """Markup for `value` (escaped) that never breaks across lines, e.g. 'max abs err 0.1' or a path."""
    return f"[{WHOLE}]{escape(str(value))}[/{WHOLE}]"


def make_console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console on stdout, stderr or `file`: wrapped to the terminal's width, unwrapped elsewhere."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    # emoji off: a ':name:' inside a path or a key is data, not an emoji code
    return _WholeWordConsole(file=file, stderr=stderr, width=terminal_width(stream) or UNWRAPPED_WIDTH,
                             emoji=False, theme=Theme({WHOLE: Style()}))


def terminal_width(stream: Any) -> int | None:
    """Columns of the terminal `stream` writes to (COLUMNS, where set, wins); None for a pipe or a file."""
    try:
        if not stream.isatty():
            return None
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # StringIO, a closed or a test runner's stream
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(fd).columns or 80
    except OSError:
        return 80


class _WholeWordConsole(Console):
    """A rich Console whose printed strings wrap between words only (see `Line`)."""

    def print(self, *objects: Any, sep: str = " ", **kwargs: Any) -> None:  # type: ignore[override]
        if objects and all(isinstance(o, str) for o in objects):
            objects = (Line(sep.join(objects), markup=kwargs.get("markup"), highlight=kwargs.get("highlight")),)
            # Line has wrapped already: rich must neither wrap again nor crop a word wider than the terminal
            kwargs["soft_wrap"] = True
        super().print(*objects, sep=sep, **kwargs)


class Line:
    """Rich markup wrapped at the spaces between words; a word or a `whole()` span never breaks."""

    def __init__(self, text: str, *, markup: bool | None = None, highlight: bool | None = None) -> None:
        self.text, self.markup, self.highlight = text, markup, highlight

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text = console.render_str(self.text, markup=self.markup, highlight=self.highlight)
        for line in text.split("\n", allow_blank=True):
            for piece in wrap(line, options.max_width):
                yield from piece.render(console)
                yield Segment.line()


def wrap(line: Text, width: int) -> list[Text]:
    """`line` cut at spaces outside `whole()` spans into lines of at most `width` cells where the words allow.

    A word wider than `width` keeps a line of its own, uncut; continuation lines are indented two
    spaces more than the first.
    """
    plain = line.plain
    kept = [(span.start, span.end) for span in line.spans if span.style == WHOLE]
    breaks = [(m.start(), m.end()) for m in _BREAKS.finditer(plain)
              if m.start() > 0 and m.end() < len(plain) and not any(a < m.end() and m.start() < b for a, b in kept)]
    if not breaks or cell_len(plain) <= width:
        return [line]
    starts = [0] + [end for _, end in breaks]
    ends = [start for start, _ in breaks] + [len(plain)]
    indent = " " * (len(plain) - len(plain.lstrip(" ")) + 2)
    pieces: list[Text] = []
    first, used = 0, cell_len(plain[starts[0]:ends[0]])
    for i in range(1, len(starts)):
        word = cell_len(plain[starts[i]:ends[i]])
        gap = cell_len(plain[ends[i - 1]:starts[i]])
        if used + gap + word <= width:
            used += gap + word
            continue
        pieces.append(line[starts[first]:ends[i - 1]])
        first, used = i, len(indent) + word
    pieces.append(line[starts[first]:ends[-1]])
    return [pieces[0]] + [Text(indent) + piece for piece in pieces[1:]]


def print_table(console: Console, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
                title: str | None = None) -> None:
    """Rows of plain values (never markup) under `title` (markup): a table where it fits, else one block per row."""
    rows = [["" if value is None else str(value) for value in row] for row in rows]
    if title is not None:
        console.print(title)
    table = Table(*(Column(Text(name), no_wrap=True, overflow="ignore") for name in columns))
    for row in rows:
        table.add_row(*(Text(value) for value in row))
    natural = Measurement.get(console, console.options.update_width(UNWRAPPED_WIDTH), table).maximum
    if natural <= console.width:
        console.print(table)
        return
    name_width = max((cell_len(c) for c in columns), default=0)
    for number, row in enumerate(rows, 1):
        console.print(f"[dim]-- row {number} of {len(rows)} --[/]", highlight=False)
        for name, value in zip(columns, row):
            console.print(f"{escape(name)}{' ' * (name_width - cell_len(name))}  {whole(value)}", highlight=False)

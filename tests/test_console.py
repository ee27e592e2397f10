"""rlprobe.console: wrapped between words on a terminal, never split inside a path, a number or a cell."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import termios

import pytest
from rich.text import Text

from rlprobe.console import UNWRAPPED_WIDTH, make_console, print_table, terminal_width, whole, wrap

PATH = "/tmp/pytest-of-ci/pytest-12/test_something_with_a_long_name0/out/report.xlsx"
SPACED_PATH = "/home/me/My Documents/run 2/summary.md"


def _render(console_width: int, *lines: str) -> str:
    buf = io.StringIO()
    console = make_console(file=buf)
    console.width = console_width  # as a terminal of this width would set it
    for line in lines:
        console.print(line)
    return buf.getvalue()


@pytest.mark.parametrize("width", range(1, 131))
def test_a_line_breaks_only_between_words_and_keeps_whole_spans(width):
    line = (f"first divergence: log_prob at {whole('step 12')}, {whole('rank 3')}: mismatch "
            f"({whole('max abs err 0.00123')}, {whole('max rel err 4.56e-07')}) report: {whole(PATH)}, "
            f"{whole(SPACED_PATH)}")
    out = _render(width, line)
    lines = out.splitlines()
    pieces = ("step 12", "rank 3", "max abs err 0.00123", "max rel err 4.56e-07", PATH, SPACED_PATH)
    for piece in (*pieces, "log_prob"):
        assert sum(piece in printed for printed in lines) == 1, (width, piece, out)
    # nothing lost or added but the line breaks and the continuation indent
    assert " ".join(out.split()) == " ".join(Text.from_markup(line).plain.split())
    for printed in lines:  # a line wider than the terminal holds one unbreakable word
        unbreakable = printed.strip()
        for piece in pieces:
            unbreakable = unbreakable.replace(piece, "X")
        assert len(printed) <= width or " " not in unbreakable, (width, printed)
    if width >= len(SPACED_PATH) + 2:
        assert all(len(printed) <= width for printed in lines if PATH not in printed)


def test_wrapping_fills_lines_and_indents_continuations():
    out = _render(24, "alpha beta gamma delta epsilon zeta eta theta")
    assert out.splitlines() == ["alpha beta gamma delta", "  epsilon zeta eta theta"]
    assert wrap(Text("  indented words here"), 12) == [Text("  indented"), Text("    words"), Text("    here")]


def test_a_pipe_or_a_file_is_never_wrapped_whatever_columns_says(monkeypatch):
    monkeypatch.setenv("COLUMNS", "20")
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as pipe, os.fdopen(read_fd) as reader:
        assert terminal_width(pipe) is None
        console = make_console(file=pipe)
        assert console.width == UNWRAPPED_WIDTH
        words = " ".join(["word"] * 40)
        console.print(f"report: {whole(PATH)} and {whole('max abs err 0.5')} {words}")
        pipe.close()
        assert reader.read() == f"report: {PATH} and max abs err 0.5 {words}\n"
    assert make_console(file=io.StringIO()).width == UNWRAPPED_WIDTH


def _pty_of(columns: int):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return master, os.fdopen(slave, "w")


def test_a_terminal_is_wrapped_to_its_own_width_and_columns_wins(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    master, terminal = _pty_of(37)
    try:
        assert terminal_width(terminal) == 37 and make_console(file=terminal).width == 37
        monkeypatch.setenv("COLUMNS", "52")
        assert terminal_width(terminal) == 52
    finally:
        terminal.close()
        os.close(master)


def test_a_table_that_fits_is_drawn_and_one_that_does_not_is_shown_per_row():
    rows = [["log_prob", 0.125, PATH], ["[bold]responses", None, "-"]]  # cells are data, never markup
    buf = io.StringIO()
    console = make_console(file=buf)
    console.width = 200
    print_table(console, ["key", "max abs err", "report"], rows, title="key data")
    wide = buf.getvalue()
    assert wide.splitlines()[0] == "key data"
    assert any("log_prob" in line and "0.125" in line and PATH in line for line in wide.splitlines())
    assert "[bold]responses" in wide
    buf = io.StringIO()
    console = make_console(file=buf)
    console.width = 30
    print_table(console, ["key", "max abs err", "report"], rows)
    narrow = buf.getvalue().splitlines()
    assert narrow[:4] == ["-- row 1 of 2 --", "key          log_prob", "max abs err  0.125", "report"]
    assert narrow[4] == "  " + PATH and narrow[6] == "key          [bold]responses"
    assert max(len(line) for line in narrow if PATH not in line) <= 30

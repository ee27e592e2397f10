"""`rlprobe` commands run in-process for tests (click's CliRunner), their output as one line."""

from __future__ import annotations

from click.testing import CliRunner

from rlprobe.cli import main


def cli(*args: object) -> tuple[int, str]:
    """The command's exit code and its output with runs of whitespace made one space (whatever the terminal's
    width)."""
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, " ".join(result.output.split())

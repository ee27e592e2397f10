"""The DuckDB connection `rlprobe compare` opens on a thread during its imports
(rlprobe/cli/startup.py): it is a working connection, taken once, and a comparison that fails
before taking it leaves no thread behind."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rlprobe.errors import ProbeError
from rlprobe.cli.startup import ConnectionAhead
from rlprobe.pipeline.compare_command import compare


def test_take_gives_a_working_connection_once():
    with ConnectionAhead() as ahead:
        con = ahead.take()
        assert con.execute("SELECT 40 + 2").fetchall() == [(42,)]
        with pytest.raises(RuntimeError, match="taken already"):
            ahead.take()
    assert con.execute("SELECT 1").fetchall() == [(1,)]  # the caller's: leaving the block does not close it


def test_leaving_without_take_waits_for_the_thread():
    with ConnectionAhead():
        pass
    assert not [t for t in threading.enumerate() if t.name == "rlprobe-connect"]


def test_a_comparison_that_fails_first_leaves_no_connecting_thread(tmp_path: Path):
    with pytest.raises(ProbeError, match="missing"):
        compare(tmp_path / "missing", tmp_path / "missing_too", tmp_path / "out")
    assert not [t for t in threading.enumerate() if t.name == "rlprobe-connect"]

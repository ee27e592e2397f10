"""rlprobe/lake/msprobe_format.py: what an rlprobe dump's readers list and leave out is named in one warning and in
`rlprobe info`, never an error, and rlprobe's own temporary files are not."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.errors import UnreadEntriesWarning

UNREAD = ["rank_backup.json", "stats/key_data/old", "stats/key_data/rank=0/notes.txt",
          "stats/key_data/rank=0/rows.parquet", "stats/metrics"]


def _dump(path: Path) -> Path:
    with rlprobe.Probe(path) as p:
        for _ in range(2):
            p.save({"loss": np.float32(1.5)})
            p.step()
    return path


def _with_unread(path: Path) -> Path:
    run = _dump(path)
    rank = run / "stats/key_data/rank=0"
    (rank / "notes.txt").write_text("")
    (rank / "rows.parquet").write_bytes((next(rank.glob("part-*.parquet"))).read_bytes())  # a Parquet file, no part
    (rank / ".part-9.parquet.tmp-123-0a0b0c0d").write_bytes(b"")  # rlprobe's own temporary: not named
    (run / "stats/key_data/old").mkdir()
    (run / "stats/metrics").mkdir()
    (run / "rank_backup.json").write_text("{}")
    return run


def test_a_clean_dump_warns_of_nothing(tmp_path):
    run = _dump(tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadEntriesWarning)
        assert len(rlprobe.open(run).arrow("key_data")) == 2
    info = json.loads(CliRunner().invoke(main, ["info", str(run), "--json"]).output)
    assert info["unread"] == []


def test_entries_its_readers_leave_out_are_named_once_and_the_rows_are_read(tmp_path):
    run = _with_unread(tmp_path / "run")
    with pytest.warns(UnreadEntriesWarning) as caught:
        dump = rlprobe.open(run)
    assert len(caught) == 1
    assert str(caught[0].message) == (f"rlprobe: 5 entries of the rlprobe dump {run} not read (in no layout rlprobe "
                                      f"writes; `rlprobe info` lists them all): {', '.join(UNREAD)}")
    rows = dump.arrow("key_data").to_pylist()
    assert [(r["key"], r["step"]) for r in rows] == [("loss", 0), ("loss", 1)]  # rows.parquet is not read as rows


def test_rlprobe_info_lists_them_apart_from_its_problems(tmp_path):
    run = _with_unread(tmp_path / "run")
    with pytest.warns(UnreadEntriesWarning):
        result = CliRunner().invoke(main, ["info", str(run), "--json"], catch_exceptions=False)
    assert result.exit_code == 0
    info = json.loads(result.stdout)
    assert info["unread"] == UNREAD and info["problems"] == []
    with pytest.warns(UnreadEntriesWarning):
        table = CliRunner().invoke(main, ["info", str(run)], catch_exceptions=False)
    assert table.exit_code == 0 and "not read (5" in table.output and "rows.parquet" in table.output
    assert ".tmp-" not in table.output

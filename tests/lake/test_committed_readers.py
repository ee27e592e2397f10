"""Readers show committed steps only: rows a killed writer left of a step it never committed (a
periodic flush wrote them) appear only with include_uncommitted=True, in every reader (polars,
Arrow, DuckDB views, tensors, `rlprobe info`, `rlprobe sql`, compare)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe import DumpReadError
from rlprobe.cli import main

KILLED = textwrap.dedent("""
    import os, sys
    import numpy as np
    import torch
    import rlprobe

    probe = rlprobe.Probe(sys.argv[1], rank=int(sys.argv[2]), world_size=2, flush_interval=3600)
    layer = torch.nn.Linear(2, 2)
    for s in range(4):
        probe.save({"x": np.full(3, float(s), np.float32)})
        probe.log_metrics({"loss": float(s)})
        with probe.stage("actor_update", model=layer):
            layer(torch.ones(1, 2))
        if s < 3:
            probe.step()
        if s == 1:
            probe.flush()   # steps 0-1 committed
    probe.flush()           # step 2 committed; step 3's rows written, uncommitted
    os._exit(1)
""")


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("killed") / "dump"
    for rank in (0, 1):
        proc = subprocess.run([sys.executable, "-c", KILLED, str(path), str(rank)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 1, proc.stderr
    return path


def test_the_killed_dump_holds_rows_of_an_uncommitted_step(killed):
    manifest = json.loads((killed / "rank0.json").read_text())
    assert manifest["committed_steps"] == [0, 1, 2]
    on_disk = pq.read_table(killed / "stats" / "key_data" / "rank=0", partitioning=None)
    assert sorted(set(on_disk["step"].to_pylist())) == [0, 1, 2, 3]


def test_every_reader_shows_committed_steps_only(killed):
    dump = rlprobe.open(killed)
    assert sorted(set(dump.key_data().collect()["step"].to_list())) == [0, 1, 2]
    assert sorted(dump.scalars().collect()["step"].to_list()) == [0, 0, 1, 1, 2, 2]
    for kind in ("key_data", "scalar", "module"):
        assert sorted(set(dump.arrow(kind)["step"].to_pylist())) == [0, 1, 2], kind
    con = dump.connect()
    assert con.execute("select max(step), count(*) from key_data").fetchone() == (2, 6)
    assert con.execute("select max(step) from scalars").fetchone() == (2,)
    with pytest.raises(DumpReadError, match="step 3 of rank 0 is not committed.*include_uncommitted=True"):
        dump.tensor("x", 3)
    np.testing.assert_array_equal(dump.tensor("x", 2, rank=1), np.full(3, 2.0, np.float32))


def test_include_uncommitted_shows_the_rest(killed):
    dump = rlprobe.open(killed, include_uncommitted=True)
    assert sorted(set(dump.key_data().collect()["step"].to_list())) == [0, 1, 2, 3]
    assert dump.connect().execute("select max(step), count(*) from key_data").fetchone() == (3, 8)
    assert sorted(set(dump.arrow("module")["step"].to_pylist())) == [0, 1, 2, 3]
    np.testing.assert_array_equal(dump.tensor("x", 3), np.full(3, 3.0, np.float32))


def test_info_sql_and_compare_read_committed_steps(killed, tmp_path):
    info = json.loads(CliRunner().invoke(main, ["info", str(killed), "--json"], catch_exceptions=False).output)
    (x,) = info["keys"]
    assert (x["last_step"], x["tensors"]) == (2, 6) and info["complete"] is False
    out = CliRunner().invoke(main, ["sql", str(killed), "SELECT max(step) AS s FROM key_data", "--format", "json"],
                             catch_exceptions=False).output
    assert json.loads(out) == [{"s": 2}]
    summary = rlprobe.compare(killed, killed, tmp_path / "out")
    rows = pq.read_table(tmp_path / "out" / "key_data.parquet")
    assert sorted(set(rows["step"].to_pylist())) == [0, 1, 2] and summary["counts"] == {"match": 6}
    modules = pq.read_table(tmp_path / "out" / "modules.parquet")
    assert sorted(set(modules["step"].to_pylist())) == [0, 1, 2]


def test_info_and_sql_include_uncommitted_on_request(killed):
    info = json.loads(CliRunner().invoke(main, ["info", str(killed), "--json", "--include-uncommitted"],
                                         catch_exceptions=False).output)
    (x,) = info["keys"]
    assert (x["last_step"], x["tensors"]) == (3, 8)
    query = "SELECT max(step) AS s, count(*) AS n FROM key_data"
    out = CliRunner().invoke(main, ["sql", str(killed), query, "--format", "json", "--include-uncommitted"],
                             catch_exceptions=False).output
    assert json.loads(out) == [{"s": 3, "n": 8}]
    for flag, expected in (([], [{"s": 2, "n": 6}]), (["--include-uncommitted"], [{"s": 3, "n": 8}])):
        out = CliRunner().invoke(main, ["sql", "--run", f"k={killed}", query.replace("key_data", "k.key_data"),
                                        "--format", "json", *flag], catch_exceptions=False).output
        assert json.loads(out) == expected, flag


def test_a_rank_without_its_manifest_is_hidden_and_named(killed, tmp_path):
    import shutil

    path = tmp_path / "dump"
    shutil.copytree(killed, path)
    (path / "rank1.json").unlink()
    dump = rlprobe.open(path)
    assert sorted(set(dump.key_data().collect()["rank"].to_list())) == [0]
    assert sorted(set(rlprobe.open(path, include_uncommitted=True).key_data().collect()["rank"].to_list())) == [0, 1]
    info = json.loads(CliRunner().invoke(main, ["info", str(path), "--json"], catch_exceptions=False).output)
    assert any("ranks [1] have statistics but no rank<R>.json" in p and "--include-uncommitted" in p
               for p in info["problems"]), info["problems"]
    shown = json.loads(CliRunner().invoke(main, ["info", str(path), "--json", "--include-uncommitted"],
                                          catch_exceptions=False).output)
    assert shown["keys"][0]["ranks"] == 2, shown["keys"]


def test_append_resumes_after_the_committed_steps_and_drops_the_rest(killed, tmp_path):
    import shutil

    path = tmp_path / "dump"
    shutil.copytree(killed, path)
    with rlprobe.Probe(path, rank=0, world_size=2, mode="append") as probe:
        assert probe.current_step == 3
        probe.save({"x": np.full(3, 30.0, np.float32)})
    everything = rlprobe.open(path, include_uncommitted=True).key_data().collect().filter(rank=0).sort("step")
    assert everything.select("step", "max").rows() == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]


def test_a_damaged_part_of_a_killed_rank_is_named_and_the_rest_shows_committed_steps(killed, tmp_path):
    """checked_parts() and the committed-step filter together: the damaged part is left out and
    named, the killed ranks' other parts still show committed steps only."""
    import shutil

    path = tmp_path / "dump"
    shutil.copytree(killed, path)
    bad = path / "stats" / "key_data" / "rank=1" / "part-000099.parquet"
    bad.write_bytes(b"not parquet")
    dump = rlprobe.open(path)
    errors: list[str] = []
    table = dump.arrow("key_data", errors=errors)
    assert len(errors) == 1 and errors[0].startswith(f"{bad}: unreadable Parquet part"), errors
    assert sorted(set(table["step"].to_pylist())) == [0, 1, 2]
    errors = []
    con = dump.connect(errors=errors)
    assert len(errors) == 1 and errors[0].startswith(f"{bad}: "), errors
    assert con.sql("SELECT DISTINCT step FROM key_data ORDER BY step").fetchall() == [(0,), (1,), (2,)]
    with pytest.raises(DumpReadError, match="unreadable Parquet part"):
        dump.key_data().collect()

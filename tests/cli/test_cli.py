"""The rlprobe command end to end, through click's runner and as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main


@pytest.fixture
def dump(tmp_path):
    path = tmp_path / "dump"
    with rlprobe.Probe(path) as p:
        p.save_config({"actor": {"lr": 1e-6}, "kl_coef": 0.05})
        for step in range(3):
            for _ in range(2):
                p.save({"responses": np.arange(12, dtype=np.int64).reshape(3, 4) + step,
                        "log_prob": np.full((3, 4), -1.5 - step, np.float32)})
            p.log_metrics({"e2e_tps": 70.0 + step})
            p.step()
    return path


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and rlprobe.__version__ in result.output


def test_help_everywhere():
    for cmd in ([], ["info"], ["sql"], ["compact"], ["import-msprobe"]):
        result = run(*cmd, "--help")
        assert result.exit_code == 0 and "Usage:" in result.output


def test_info_json_reports_keys_steps_and_completeness(dump):
    result = run("info", dump, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["complete"] is True and info["format"] == "rlprobe" and info["ranks"] == [0]
    keys = {k["key"]: k for k in info["keys"]}
    assert set(keys) == {"responses", "log_prob"}
    assert keys["responses"]["steps"] == 3 and keys["responses"]["micro_steps"] == 2
    assert keys["responses"]["dtypes"] == "int64" and keys["responses"]["tensors"] == 6
    assert keys["log_prob"]["bytes"] > 6 * 12 * 4  # six float32 files of 12 elements plus headers
    assert info["scalars"][0]["name"] == "e2e_tps" and info["scalars"][0]["steps"] == 3


def test_info_table_output(dump):
    result = run("info", dump)
    assert result.exit_code == 0
    assert "responses" in result.output and "complete" in result.output


def test_info_on_msprobe_fixture(fixtures_dir):
    result = run("info", fixtures_dir / "msprobe/keydata/run_a", "--json")
    info = json.loads(result.output)
    assert info["format"] == "msprobe" and info["complete"] is None
    assert sorted(k["key"] for k in info["keys"]) == ["kl_loss", "log_prob", "responses"]


def test_sql_formats(dump, tmp_path):
    q = "SELECT key, step, max(max) AS hi FROM key_data GROUP BY ALL ORDER BY key, step"
    csv = run("sql", dump, q, "--format", "csv")
    lines = csv.output.strip().splitlines()
    assert lines[0] == '"key","step","hi"' and len(lines) == 7
    assert lines[1] == '"log_prob",0,-1.5'
    js = json.loads(run("sql", dump, q, "--format", "json").output)
    assert js[-1] == {"key": "responses", "step": 2, "hi": 13.0}
    out = tmp_path / "r.parquet"
    assert run("sql", dump, q, "--format", "parquet", "-o", out).exit_code == 0
    assert pq.read_table(out).num_rows == 6
    table = run("sql", dump, "select * from configs order by path")
    assert "actor.lr" in table.output
    for fmt in ("table", "csv", "json"):  # each format to a file too, as it prints
        assert run("sql", dump, q, "--format", fmt, "-o", tmp_path / f"r.{fmt}").exit_code == 0
        assert (tmp_path / f"r.{fmt}").read_text(encoding="utf-8") == run("sql", dump, q, "--format", fmt).output


def test_sql_output_that_cannot_be_written_is_named(dump, tmp_path):
    """An --output that cannot be written (under a file, say) ended in a FileNotFoundError or OSError traceback,
    and a failed write could leave half a file. Exit 3 naming the file now, nothing left beside it."""
    q = "select key from key_data"
    (tmp_path / "afile").write_text("mine")
    for fmt in ("parquet", "csv", "json", "table"):
        result = run("sql", dump, q, "--format", fmt, "-o", tmp_path / "afile" / f"r.{fmt}")
        assert result.exit_code == 3 and f"cannot write report {tmp_path / 'afile' / f'r.{fmt}'}" in result.output
    assert (tmp_path / "afile").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "dump"]
    (tmp_path / "adir").mkdir()
    result = run("sql", dump, q, "--format", "csv", "-o", tmp_path / "adir")
    assert result.exit_code == 2  # click: a directory is no file
    assert run("sql", dump, q, "--max-rows", "-1").exit_code == 2


def test_sql_errors(dump, tmp_path):
    bad = run("sql", dump, "SELECT nope FROM key_data")
    assert bad.exit_code == 2 and "query failed" in bad.output
    assert run("sql", dump, "select 1", "--format", "parquet").exit_code == 2
    missing = run("sql", tmp_path / "missing", "select 1")
    assert missing.exit_code == 3 and "does not exist" in missing.output
    notdump = tmp_path / "empty"
    notdump.mkdir()
    assert run("info", notdump).exit_code == 3


KILLED_WRITER = """
import os, sys
import numpy as np
import rlprobe
p = rlprobe.Probe(sys.argv[1], rank=0, world_size=1, flush_interval=0)  # a part per step
for step in range(3):
    p.save({"x": np.ones(3, np.float32) * step})
    p.step()
p.flush()
os._exit(1)  # killed: no close(), so the parts stay unmerged
"""


def test_compact_merges_parts_of_killed_run(tmp_path):
    path = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    parts = list((path / "stats/key_data/rank=0").glob("part-*.parquet"))
    assert len(parts) == 3  # one per step, not yet merged
    result = run("compact", path)
    assert result.exit_code == 0 and "3 files -> 1" in result.output
    d = rlprobe.open(path)
    assert d.key_data().collect()["step"].to_list() == [0, 1, 2]


def test_compact_leaves_a_rank_with_a_live_writer_alone(tmp_path):
    path = tmp_path / "live"
    p = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=0)
    for step in range(3):
        p.save({"x": np.ones(3, np.float32) * step})
        p.step()
    p.flush()
    before = sorted(f.name for f in (path / "stats/key_data/rank=0").iterdir())
    result = run("compact", path)
    assert result.exit_code == 1, result.output
    assert "rank 0" in result.output and "live process" in result.output and f"pid {__import__('os').getpid()}" \
        in result.output and "not compacted" in result.output, result.output
    assert sorted(f.name for f in (path / "stats/key_data/rank=0").iterdir()) == before
    p.save({"x": np.ones(3, np.float32) * 3})
    p.close()  # the writer was not disturbed
    d = rlprobe.open(path)
    assert d.complete and d.key_data().collect()["step"].to_list() == [0, 1, 2, 3]


def test_import_msprobe(fixtures_dir, tmp_path):
    dst = tmp_path / "imported"
    result = run("import-msprobe", fixtures_dir / "msprobe/keydata/run_a", dst)
    assert result.exit_code == 0 and "imported 18 tensors" in result.output
    src = rlprobe.open(fixtures_dir / "msprobe/keydata/run_a")
    d = rlprobe.open(dst)
    assert d.format == "rlprobe" and d.complete
    for key, step, micro in [("responses", 2, 1), ("log_prob", 0, 0), ("kl_loss", 1, 1)]:
        np.testing.assert_array_equal(d.tensor(key, step, 0, micro), src.tensor(key, step, 0, micro))
    assert d.configs()[0] == json.loads((fixtures_dir / "msprobe/keydata/run_a/configurations.json").read_text())
    again = run("import-msprobe", fixtures_dir / "msprobe/keydata/run_a", dst)
    assert again.exit_code == 2 and "not empty" in again.output


def test_console_script_starts_without_heavy_imports():
    code = "import sys, rlprobe.cli; print(sorted(m for m in ('torch','duckdb','polars','pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

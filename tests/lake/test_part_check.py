"""A corrupt, truncated, empty or foreign Parquet part under stats/, or a stray config file: every
reader names the file. `rlprobe info` lists it and shows the rest, `rlprobe sql` and `rlprobe
compact` are exit 3, compare makes it an error row and compares the rest, the Python API raises
DumpReadError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.pipeline.compare_command import compare
from rlprobe.errors import DumpReadError
from tests.cli_runs import cli as _cli
from tests.lake.small_dumps import small_dump

STRAY = "part-000099.parquet"  # a live part beside the dump's own (merged) one


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return small_dump(tmp_path_factory.mktemp("good") / "dump", steps=3, responses=True)


def _corrupt_first_page(data: bytes, path: Path, column: str) -> bytes:
    """`data` (the Parquet file at `path`) with the first page of `column` overwritten: the footer
    still reads, the column's values do not."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == column)
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    return data[:start] + b"\xff" * 12 + data[start + 12:]


def _bad_part(kind: str, own: Path) -> bytes:
    data = own.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    if kind == "zero-byte":
        return b""
    if kind == "truncated":
        return data[: len(data) // 2]
    if kind == "corrupt footer":
        start = len(data) - 8 - footer
        return data[:start] + bytes(b ^ 0x5A for b in data[start:start + 64]) + data[start + 64:]
    if kind == "corrupt page":
        return _corrupt_first_page(data, own, "key")
    sink = pa.BufferOutputStream()
    if kind == "foreign columns":
        pq.write_table(pa.table({"foo": [1, 2], "bar": ["x", "y"]}), sink)
    else:  # "foreign types": key data's names, other types
        pq.write_table(pa.table({"key": [1], "step": ["0"], "micro_step": [0], "index": [""]}), sink)
    return sink.getvalue().to_pybytes()


KINDS = ["zero-byte", "truncated", "corrupt footer", "corrupt page", "foreign columns", "foreign types"]


@pytest.fixture(params=KINDS)
def broken(request, good, tmp_path) -> tuple[Path, Path, str]:
    """(a copy of the good dump with one bad key-data part, the part, the kind of damage)."""
    path = tmp_path / "dump"
    shutil.copytree(good, path)
    rank_dir = path / "stats" / "key_data" / "rank=0"
    own = next(rank_dir.glob("part-*.parquet"))
    bad = rank_dir / STRAY
    bad.write_bytes(_bad_part(request.param, own))
    return path, bad, request.param


def test_info_lists_the_bad_part_and_shows_the_rest(broken, good):
    path, bad, kind = broken
    code, output = _cli("info", path, "--json")
    assert code == 0, output
    info = json.loads(CliRunner().invoke(main, ["info", str(path), "--json"]).output)
    assert len(info["problems"]) == 1 and info["problems"][0].startswith(f"{bad}: "), info["problems"]
    expected = "not a key_data stats part" if kind.startswith("foreign") else "unreadable Parquet part"
    assert expected in info["problems"][0]
    reference = json.loads(CliRunner().invoke(main, ["info", str(good), "--json"]).output)
    assert info["keys"] == reference["keys"] and info["scalars"] == reference["scalars"]
    code, output = _cli("info", path)  # the table shows it too (wrapped where the terminal ends)
    assert code == 0 and f"!{bad}:" in "".join(output.split())


def test_sql_is_exit_3_naming_the_part(broken):
    path, bad, kind = broken
    code, output = _cli("sql", path, "SELECT key, step, max FROM key_data ORDER BY ALL")
    assert code == 3 and output.startswith(f"error: {bad}: "), output
    code, output = _cli("sql", "--run", f"x={path}", "SELECT * FROM x.key_data")
    assert code == 3 and output.startswith(f"error: {bad}: "), output


def test_compare_makes_the_part_an_error_row(broken, good, tmp_path):
    path, bad, kind = broken
    summary = compare(path, good, tmp_path / "out")
    assert len(summary["read_errors"]) == 1 and summary["read_errors"][0].startswith(f"run A: {bad}: ")
    assert summary["counts"] == {"error": 1, "match": 6}  # the good part's rows are all compared
    assert summary["first_divergence"]["status"] == "error" and str(bad) in summary["first_divergence"]["message"]


def test_compare_makes_run_b_s_part_an_error_row(broken, good, tmp_path):
    # a part of run B that cannot be read is named as run A's is, whatever the damage, with 1 worker and 2
    # (the worker count changes what runs beside the statistics' reading: comparison/key_data.py, run.py)
    path, bad, kind = broken
    for workers in (1, 2):
        summary = compare(good, path, tmp_path / f"out{workers}", workers=workers)
        assert len(summary["read_errors"]) == 1 and summary["read_errors"][0].startswith(f"run B: {bad}: ")
        assert summary["counts"] == {"error": 1, "match": 6}
        assert summary["first_divergence"]["status"] == "error" and str(bad) in summary["first_divergence"]["message"]


def test_compact_refuses_and_changes_nothing(broken):
    path, bad, kind = broken
    before = {f: f.read_bytes() for f in (path / "stats").rglob("*") if f.is_file()}
    code, output = _cli("compact", path)
    assert code == 3 and output.startswith(f"error: {bad}: ") and output.endswith("nothing was compacted"), output
    assert {f: f.read_bytes() for f in (path / "stats").rglob("*") if f.is_file()} == before  # no foreign rows merged


def test_python_readers_name_the_part(broken):
    path, bad, kind = broken
    dump = rlprobe.open(path)
    readers = {"arrow": lambda: dump.arrow("key_data"), "check_every_page": dump.check_every_page}
    if kind != "corrupt page":  # footers are checked as a reader opens; a page only when it is read
        readers.update(polars=lambda: dump.key_data().collect(), connect=dump.connect)
    for name, read in readers.items():
        with pytest.raises(DumpReadError) as error:
            read()
        assert str(error.value).startswith(f"{bad}: "), (name, str(error.value))
    errors: list[str] = []
    assert dump.arrow("key_data", errors=errors).num_rows == 6
    assert len(errors) == 1 and errors[0].startswith(f"{bad}: ")
    if kind != "corrupt page":
        errors = []
        assert dump.connect(errors=errors).sql("SELECT count(*) FROM key_data").fetchall() == [(6,)]
        assert len(errors) == 1 and errors[0].startswith(f"{bad}: ")


def test_stray_and_unreadable_config_files(good, tmp_path):
    path = tmp_path / "dump"
    shutil.copytree(good, path)
    (path / "configurations.rankX.json").write_text("{}")
    code, output = _cli("sql", path, "SELECT rank, path, value FROM configs")
    assert code == 0 and "lr" in output  # a file rlprobe does not write is not read
    info = json.loads(CliRunner().invoke(main, ["info", str(path), "--json"]).output)
    assert info["problems"] == [f"{path / 'configurations.rankX.json'}: not a config file rlprobe writes "
                                "(configurations.json or configurations.rank<R>.json); left out of configs"]
    assert rlprobe.open(path).configs() == {0: {"lr": 0.1}}
    (path / "configurations.rank2.json").write_text("{not json")
    code, output = _cli("sql", path, "SELECT * FROM configs")
    assert code == 3 and output.startswith(f"error: {path / 'configurations.rank2.json'}: unreadable JSON"), output
    code, output = _cli("info", path)
    assert code == 0 and f"{path / 'configurations.rank2.json'}:unreadableJSON" in "".join(output.split())
    assert compare(path, good, tmp_path / "out")["counts"] == {"match": 6}


def test_views_keep_a_newer_versions_column_and_fill_an_older_versions(tmp_path):
    """Ranks are unioned by position, so every rank shows the kind's columns in order (null where
    an older part lacks one), then columns the kind does not define (null where a rank lacks them)."""
    path = tmp_path / "dump"
    for rank in (0, 1):
        with rlprobe.Probe(path, rank=rank, world_size=2) as p:
            p.save({"x": np.ones(2, np.float32) * rank})
            p.step()
    older = next((path / "stats" / "key_data" / "rank=0").glob("part-*.parquet"))
    pq.write_table(pq.read_table(older, partitioning=None).drop_columns(["absent"]), older)
    newer = next((path / "stats" / "key_data" / "rank=1").glob("part-*.parquet"))
    table = pq.read_table(newer, partitioning=None)
    pq.write_table(table.append_column("newer", pa.array(["n"] * table.num_rows)), newer)
    con = rlprobe.open(path).connect()
    rows = con.sql('SELECT rank, absent, newer, max FROM key_data ORDER BY rank').fetchall()
    assert rows == [(0, None, None, 0.0), (1, False, "n", 1.0)]

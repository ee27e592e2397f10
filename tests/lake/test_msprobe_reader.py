"""rlprobe.open reads dumps written by msprobe 8.1.2 (tests/fixtures/msprobe) as if they were rlprobe dumps."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import rlprobe
from rlprobe import DumpReadError

KEYS = ("kl_loss", "log_prob", "responses")
STEPS = (0, 1, 2)
MICRO_STEPS = (0, 1)
GRAD_PARAMS = ("0.weight", "0.bias", "2.weight", "2.bias")
GRAD_STEPS = (0, 1, 2, 3)


def _scalar(con, query: str):
    rows = con.sql(query).fetchall()
    assert len(rows) == 1, (query, rows)
    return rows[0][0]


def _msprobe_file(run: Path, key: str, step: int, micro: int, suffix: str) -> Path:
    return run / "data" / key / f"step{step}" / "rank0" / f"micro_step{micro}" / f"{key}.{suffix}"


@pytest.fixture(params=["run_a", "run_b"])
def keydata_run(request, fixtures_dir: Path) -> Path:
    return fixtures_dir / "msprobe" / "keydata" / request.param


@pytest.fixture(params=["run_a", "run_b"])
def grad_run(request, fixtures_dir: Path) -> Path:
    return fixtures_dir / "msprobe" / "grad" / request.param


# -- key data (SingleSave) -------------------------------------------------------------------

def test_keydata_rows_match_msprobe_json(keydata_run: Path):
    dump = rlprobe.open(keydata_run)
    assert dump.format == "msprobe"
    assert dump.complete is None  # msprobe records no completion
    df = dump.key_data().collect()
    assert df.height == len(KEYS) * len(STEPS) * len(MICRO_STEPS)
    got = set(zip(df["key"], df["step"], df["micro_step"]))
    assert got == {(k, s, m) for k in KEYS for s in STEPS for m in MICRO_STEPS}
    assert df["rank"].to_list() == [0] * df.height
    assert df["index"].to_list() == [""] * df.height
    assert df["dtype"].null_count() == df.height  # msprobe stores no dtype
    assert set(df["framework"]) == {"msprobe"}

    for row in df.iter_rows(named=True):
        meta = json.loads(_msprobe_file(keydata_run, row["key"], row["step"], row["micro_step"], "json")
                          .read_text())["data"]
        where = (row["key"], row["step"], row["micro_step"])
        for stat in ("min", "max", "mean", "norm"):
            assert row[stat] == meta[stat], (where, stat)
        assert row["shape"] == meta["shape"], where
        assert row["numel"] == int(np.prod(meta["shape"], dtype=np.int64)), where
        assert (keydata_run / row["tensor_file"]).is_file(), where


def test_keydata_shapes(keydata_run: Path):
    df = rlprobe.open(keydata_run).key_data().collect()
    shapes = {k: set(map(tuple, df.filter(pl.col("key") == k)["shape"].to_list())) for k in KEYS}
    assert shapes == {"kl_loss": {()}, "log_prob": {(4, 16)}, "responses": {(4, 16)}}


def test_keydata_tensors_equal_npy_files(keydata_run: Path):
    dump = rlprobe.open(keydata_run)
    for key in KEYS:
        for step in STEPS:
            for micro in MICRO_STEPS:
                expected = np.load(_msprobe_file(keydata_run, key, step, micro, "npy"))
                got = dump.tensor(key, step, rank=0, micro_step=micro, index="")
                assert got.dtype == expected.dtype
                assert got.shape == expected.shape
                np.testing.assert_array_equal(got, expected)


def test_keydata_missing_tensor_names_it(keydata_run: Path):
    dump = rlprobe.open(keydata_run)
    with pytest.raises(DumpReadError, match="log_prob.*step 7"):
        dump.tensor("log_prob", 7)


def test_keydata_configs(keydata_run: Path):
    dump = rlprobe.open(keydata_run)
    expected = json.loads((keydata_run / "configurations.json").read_text())
    assert dump.configs() == {0: expected}


def test_keydata_duckdb_views(keydata_run: Path):
    dump = rlprobe.open(keydata_run)
    con = dump.connect()
    assert _scalar(con, "select count(*) from key_data") == 18
    per_key = dict(con.sql("select key, count(*) from key_data group by key order by key").fetchall())
    assert per_key == {k: 6 for k in KEYS}
    assert _scalar(con, "select count(*) from key_data where rank = 0 and index = '' and dtype is null") == 18
    # values through SQL equal the polars values
    sql_max = _scalar(con, "select max from key_data where key = 'log_prob' and step = 1 and micro_step = 0")
    meta = json.loads(_msprobe_file(keydata_run, "log_prob", 1, 0, "json").read_text())["data"]
    assert sql_max == meta["max"]
    assert _scalar(con, "select count(*) from scalars") == 0
    configs = dict(con.sql("select path, value from configs where rank = 0").fetchall())
    expected = json.loads((keydata_run / "configurations.json").read_text())
    assert {p: json.loads(v) for p, v in configs.items()} == expected


def test_keydata_connect_into_schemas(fixtures_dir: Path):
    import duckdb

    con = duckdb.connect()
    a = rlprobe.open(fixtures_dir / "msprobe" / "keydata" / "run_a")
    b = rlprobe.open(fixtures_dir / "msprobe" / "keydata" / "run_b")
    a.connect(con, schema="a")
    b.connect(con, schema="b")
    assert _scalar(con, "select current_schema()") == "main"  # the caller's schema is restored
    assert _scalar(con, "select count(*) from a.key_data") == 18
    assert _scalar(con, "select count(*) from b.key_data") == 18
    assert _scalar(con, "select count(*) from a.configs") == 3
    # a row-wise diff of the two runs through SQL: log_prob first differs at step 1
    first = con.sql(
        "select min(x.step) from a.key_data x join b.key_data y using (key, step, rank, micro_step, index) "
        "where x.key = 'log_prob' and x.max <> y.max"
    ).fetchall()[0][0]
    assert first == 1
    a.connect(con)  # and unqualified views in the current schema
    assert _scalar(con, "select count(*) from key_data") == 18
    names = {r[0] for r in con.sql("select table_schema || '.' || table_name from information_schema.tables").fetchall()}
    assert {"a.key_data", "b.key_data", "main.key_data", "a.scalars", "a.configs"} <= names


def test_keydata_runs_differ_where_the_readme_says(fixtures_dir: Path):
    a = rlprobe.open(fixtures_dir / "msprobe" / "keydata" / "run_a")
    b = rlprobe.open(fixtures_dir / "msprobe" / "keydata" / "run_b")
    for key in KEYS:
        np.testing.assert_array_equal(a.tensor(key, 0, micro_step=1), b.tensor(key, 0, micro_step=1))
    np.testing.assert_array_equal(a.tensor("responses", 1, micro_step=0), b.tensor("responses", 1, micro_step=0))
    assert not np.array_equal(a.tensor("log_prob", 1, micro_step=0), b.tensor("log_prob", 1, micro_step=0))


# -- grad_probe ------------------------------------------------------------------------------

def _grad_csv(run: Path, step: int) -> dict[str, dict[str, str]]:
    with open(run / "rank0" / f"grad_summary_{step}.csv", newline="", encoding="utf-8-sig") as fh:
        return {rec["param_name"]: rec for rec in csv.DictReader(fh)}


def test_grad_rows_match_csv(grad_run: Path):
    dump = rlprobe.open(grad_run)
    assert dump.format == "msprobe-grad"
    table = dump.arrow("grad")
    assert table.num_rows == len(GRAD_PARAMS) * len(GRAD_STEPS)
    rows = table.to_pylist()
    assert {(r["param"], r["step"]) for r in rows} == {(p, s) for p in GRAD_PARAMS for s in GRAD_STEPS}
    assert {r["rank"] for r in rows} == {0}
    for r in rows:
        rec = _grad_csv(grad_run, r["step"])[r["param"]]
        where = (r["param"], r["step"])
        assert r["max"] == float(rec["max"]), where
        assert r["min"] == float(rec["min"]), where
        assert r["norm"] == float(rec["norm"]), where
        assert r["zero_fraction"] == float(rec["=0"]), where
        assert r["shape"] == json.loads(rec["shape"]), where
        signs = np.load(grad_run / r["sign_file"])
        assert signs.dtype == np.bool_ and list(signs.shape) == r["shape"], where


def test_grad_dump_has_no_key_data(grad_run: Path):
    dump = rlprobe.open(grad_run)
    assert dump.key_data().collect().height == 0
    assert _scalar(dump.connect(), "select count(*) from key_data") == 0


# -- what is not a dump ----------------------------------------------------------------------

def test_missing_path_raises_naming_it(tmp_path: Path):
    missing = tmp_path / "no-such-dump"
    with pytest.raises(DumpReadError) as info:
        rlprobe.open(missing)
    assert str(missing) in str(info.value)


def test_file_path_raises_naming_it(tmp_path: Path):
    f = tmp_path / "dump.txt"
    f.write_text("not a dump")
    with pytest.raises(DumpReadError) as info:
        rlprobe.open(f)
    assert str(f) in str(info.value)


@pytest.mark.parametrize("content", ["empty", "files", "rank_dir_without_summaries"])
def test_non_dump_directory_raises_naming_it(tmp_path: Path, content: str):
    d = tmp_path / "not-a-dump"
    d.mkdir()
    if content == "files":
        (d / "notes.txt").write_text("hello")
        (d / "sub").mkdir()
    elif content == "rank_dir_without_summaries":
        (d / "rank0").mkdir()
        (d / "rank0" / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DumpReadError) as info:
        rlprobe.open(d)
    assert str(d) in str(info.value)


def test_dump_read_error_is_a_probe_error():
    assert issubclass(DumpReadError, rlprobe.ProbeError)


# -- msprobe layouts the fixtures do not hold: list/dict items, other ranks, missing/corrupt JSON --

def _write_item(run: Path, key: str, step: int, rank: int, micro: int, stem: str, array: np.ndarray,
                with_json: bool = True) -> None:
    d = run / "data" / key / f"step{step}" / f"rank{rank}" / f"micro_step{micro}"
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / f"{stem}.npy", array)
    if with_json:
        a = array.astype(np.float64)
        meta = {"max": float(a.max()), "min": float(a.min()), "mean": float(a.mean()),
                "norm": float(np.linalg.norm(a.reshape(-1))), "shape": list(array.shape)}
        (d / f"{stem}.json").write_text(json.dumps({"data": meta}))


def test_synthetic_msprobe_lists_dicts_and_ranks(tmp_path: Path):
    run = tmp_path / "msprobe_run"
    items = {
        ("adv", 0, 0, 0, "adv.0"): np.arange(4, dtype=np.float32),
        ("adv", 0, 0, 0, "adv.1"): np.arange(3, dtype=np.float32) * -1,
        ("values", 1, 1, 2, "values.critic"): np.ones((2, 2), np.float32) * 3,
        ("values", 1, 1, 2, "values"): np.zeros(2, np.float32),
    }
    for (key, step, rank, micro, stem), arr in items.items():
        _write_item(run, key, step, rank, micro, stem, arr)
    _write_item(run, "nojson", 0, 0, 0, "nojson", np.arange(6, dtype=np.float32).reshape(2, 3), with_json=False)
    (run / "data" / "adv" / "not-a-step").mkdir()  # unrelated folders are ignored
    dump = rlprobe.open(run)
    assert dump.format == "msprobe"
    df = dump.key_data().collect()
    got = {(r["key"], r["step"], r["rank"], r["micro_step"], r["index"]) for r in df.iter_rows(named=True)}
    assert got == {("adv", 0, 0, 0, "0"), ("adv", 0, 0, 0, "1"), ("values", 1, 1, 2, "critic"),
                   ("values", 1, 1, 2, ""), ("nojson", 0, 0, 0, "")}
    np.testing.assert_array_equal(dump.tensor("adv", 0, index="1"), items[("adv", 0, 0, 0, "adv.1")])
    np.testing.assert_array_equal(dump.tensor("values", 1, rank=1, micro_step=2, index="critic"),
                                  items[("values", 1, 1, 2, "values.critic")])
    row = df.filter((pl.col("key") == "values") & (pl.col("index") == "critic")).row(0, named=True)
    assert (row["max"], row["min"], row["norm"], row["shape"], row["numel"]) == (3.0, 3.0, 6.0, [2, 2], 4)
    nojson = df.filter(pl.col("key") == "nojson").row(0, named=True)
    assert nojson["shape"] == [2, 3] and nojson["numel"] == 6 and nojson["max"] is None
    assert dump.configs() == {}
    assert _scalar(dump.connect(), "select count(distinct rank) from key_data") == 2


def test_corrupt_msprobe_json_raises_naming_file(tmp_path: Path):
    run = tmp_path / "msprobe_run"
    _write_item(run, "kl", 0, 0, 0, "kl", np.array(1.0, np.float32))
    bad = run / "data" / "kl" / "step0" / "rank0" / "micro_step0" / "kl.json"
    bad.write_text("{not json")
    with pytest.raises(DumpReadError) as info:
        rlprobe.open(run).key_data().collect()
    assert str(bad) in str(info.value)


def test_msprobe_json_not_utf8_raises_naming_file(tmp_path: Path):
    run = tmp_path / "msprobe_run"
    _write_item(run, "kl", 0, 0, 0, "kl", np.array(1.0, np.float32))
    bad = run / "data" / "kl" / "step0" / "rank0" / "micro_step0" / "kl.json"
    bad.write_bytes(b'{"data": {"max": 1.0, "note": "\xff\xfe"}}')
    with pytest.raises(DumpReadError) as info:
        rlprobe.open(run).key_data().collect()
    assert str(bad) in str(info.value) and "not valid JSON" in str(info.value)


def test_msprobe_json_larger_than_one_read(tmp_path: Path):
    """A statistics file longer than one os.read (64 KiB) is read whole."""
    run = tmp_path / "msprobe_run"
    _write_item(run, "kl", 0, 0, 0, "kl", np.arange(3, dtype=np.float32))
    meta = run / "data" / "kl" / "step0" / "rank0" / "micro_step0" / "kl.json"
    text = json.loads(meta.read_text())
    text["data"]["padding"] = "x" * 200_000
    meta.write_text(json.dumps(text))
    row = rlprobe.open(run).key_data().collect().row(0, named=True)
    assert (row["max"], row["min"], row["shape"], row["numel"]) == (2.0, 0.0, [3], 3)


@pytest.mark.parametrize("size", [65_535, 65_536, 65_537, 131_072])
def test_msprobe_json_at_the_edges_of_one_read(tmp_path: Path, size: int):
    """A statistics file of one read's size (64 KiB) less one, exactly, one more and two reads is read
    whole; integer and text statistics read as the floats they were before (float())."""
    run = tmp_path / "msprobe_run"
    _write_item(run, "kl", 0, 0, 0, "kl", np.arange(3, dtype=np.float32), with_json=False)
    meta = run / "data" / "kl" / "step0" / "rank0" / "micro_step0" / "kl.json"
    text = json.dumps({"data": {"max": 2, "min": "0.5", "mean": 1.0, "norm": True, "shape": [3], "pad": ""}})
    text = text.replace('"pad": ""', '"pad": "' + "x" * (size - len(text)) + '"')
    meta.write_text(text)
    assert meta.stat().st_size == size
    row = rlprobe.open(run).key_data().collect().row(0, named=True)
    assert (row["max"], row["min"], row["mean"], row["norm"], row["shape"], row["numel"]) == (2.0, 0.5, 1.0, 1.0,
                                                                                              [3], 3)


def test_corrupt_msprobe_tensor_raises_naming_file(tmp_path: Path):
    run = tmp_path / "msprobe_run"
    _write_item(run, "kl", 0, 0, 0, "kl", np.arange(3, dtype=np.float32))
    npy = run / "data" / "kl" / "step0" / "rank0" / "micro_step0" / "kl.npy"
    npy.write_bytes(npy.read_bytes()[:20])
    dump = rlprobe.open(run)
    with pytest.raises(DumpReadError) as info:
        dump.tensor("kl", 0)
    assert str(npy) in str(info.value)

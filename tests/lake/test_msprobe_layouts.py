"""msprobe dumps without `micro_step<M>/` folders (tests/fixtures/README.md: keydata_flat, keydata_ids) are
read by rlprobe.open, `rlprobe info`, `compare` and `import-msprobe` at micro-step 0, as msprobe's own
comparator reads them; whatever rlprobe does not read in an msprobe dump is named (a warning, `rlprobe info`),
never an error, and rlprobe's own temporary files are not."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.errors import UnreadEntriesWarning
from rlprobe.pipeline.compare_command import compare


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _rows(dump: Path) -> dict[tuple, dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadEntriesWarning)  # msprobe's own dumps: everything in them is read
        table = rlprobe.open(dump).arrow("key_data")
    return {(r["key"], r["step"], r["micro_step"], r["index"]): r for r in table.to_pylist()}


def test_save_ex_without_micro_batch_is_read_at_micro_step_zero(fixtures_dir):
    run = fixtures_dir / "msprobe/keydata_flat/run_a"
    rows = _rows(run)
    assert len(rows) == 21  # 5 keys x 3 steps: 3 plain tensors, a list of 2 and a dict of 2
    assert sorted({k for k, *_ in rows}) == ["adv", "kl_loss", "log_prob", "logits_parts", "responses"]
    assert {micro for _, _, micro, _ in rows} == {0}
    assert sorted(i for k, s, _, i in rows if k == "logits_parts" and s == 1) == ["0", "1"]
    assert sorted(i for k, s, _, i in rows if k == "adv" and s == 2) == ["max", "mean"]
    for step in range(3):  # statistics from msprobe's <key>.json, tensors from its <key>.npy
        stats = json.loads((run / f"data/log_prob/step{step}/rank0/log_prob.json").read_text())["data"]
        r = rows[("log_prob", step, 0, "")]
        assert (r["min"], r["max"], r["mean"], r["norm"], r["shape"]) == (
            stats["min"], stats["max"], stats["mean"], stats["norm"], stats["shape"])
        assert r["tensor_file"] == f"data/log_prob/step{step}/rank0/log_prob.npy"
    np.testing.assert_array_equal(rlprobe.open(run).tensor("logits_parts", 2, 0, 0, "1"),
                                  np.load(run / "data/logits_parts/step2/rank0/logits_parts.1.npy"))


def test_name_underscore_n_in_a_rank_folder_is_index_n(fixtures_dir):
    run = fixtures_dir / "msprobe/keydata_ids/run_a"
    rows = _rows(run)
    assert sorted(rows) == [(k, s, 0, i) for k in ("log_prob", "values") for s in range(3) for i in ("0", "1")]
    r = rows[("values", 2, 0, "1")]
    assert r["shape"] == [2, 3] and r["max"] is None  # no statistics file: the .npy header's shape
    assert r["tensor_file"] == "data/values/step2/rank0/values_1.npy"


def _msprobe_expected(csv_path: Path):
    with open(csv_path, encoding="utf-8-sig") as f:
        for rec in csv.reader(f):
            if rec[0] != "step":
                yield int(rec[0]), int(rec[1]), int(rec[2]), int(rec[3]), rec


@pytest.mark.parametrize("fixture, index_of, rows_checked", [
    # msprobe 8.1.2's comparator: id 0 for <key>.npy, N for a list's <key>.N.npy (a dict's items collide on id 0)
    ("keydata_flat", lambda key, i: "" if key != "logits_parts" else str(i), 15),
    # msprobe 26.2.0's comparator: id N for <name>_<N>.npy directly in rank<R>/
    ("keydata_ids", lambda key, i: str(i), 12)])
def test_a_pair_compares_as_msprobe_s_comparator_does(fixtures_dir, tmp_path, fixture, index_of, rows_checked):
    base = fixtures_dir / "msprobe" / fixture
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadEntriesWarning)
        summary = compare(base / "run_a", base / "run_b", out)
    rows = {(r["key"], r["step"], r["micro_step"], r["index"]): r
            for r in pq.read_table(out / "key_data.parquet").to_pylist()}
    checked = 0
    for expected in sorted((base / "expected").glob("*.csv")):
        key = expected.stem
        if key == "adv":  # msprobe compared one of the dict's two items under id 0 (a known fault)
            continue
        for step, rank, micro, i, rec in _msprobe_expected(expected):
            r = rows[(key, step, micro, index_of(key, i))]
            assert rank == 0 and micro == 0
            assert json.loads(rec[4]) == r["shape_a"] and json.loads(rec[5]) == r["shape_b"]
            for col, text in zip(("same_pct", "first_mismatch_index", "max_abs_err", "max_rel_err",
                                  "within_1e3_pct", "within_1e2_pct"), rec[6:12]):
                if text == "":
                    assert r[col] is None, (key, step, i, col)
                else:
                    assert math.isclose(r[col], float(text), rel_tol=1e-6, abs_tol=1e-12), (key, step, i, col)
            checked += 1
    assert checked == rows_checked
    assert summary["counts"]["match"] + summary["counts"]["mismatch"] == len(rows)
    if fixture == "keydata_ids":
        assert summary["counts"] == {"match": 10, "mismatch": 2}  # log_prob's id 1 at steps 1 and 2
        first = summary["first_divergence"]
        assert (first["key"], first["step"], first["micro_step"], first["index"]) == ("log_prob", 1, 0, "1")


@pytest.mark.parametrize("fixture, tensors", [("keydata_flat", 21), ("keydata_ids", 12)])
def test_import_msprobe_keeps_every_tensor_of_the_layout(fixtures_dir, tmp_path, fixture, tensors):
    src = fixtures_dir / "msprobe" / fixture / "run_a"
    result = _cli("import-msprobe", src, tmp_path / "imported")
    assert result.exit_code == 0 and f"imported {tensors} tensors" in result.output
    imported = rlprobe.open(tmp_path / "imported")
    rows = imported.arrow("key_data").to_pylist()
    assert sorted((r["key"], r["step"], r["micro_step"], r["index"]) for r in rows) == sorted(_rows(src))
    source = rlprobe.open(src)
    for r in rows:
        np.testing.assert_array_equal(imported.tensor(r["key"], r["step"], 0, 0, r["index"]),
                                      source.tensor(r["key"], r["step"], 0, 0, r["index"]))
    assert compare(src, tmp_path / "imported", tmp_path / "out")["counts"] == {"match": tensors}


def test_rlprobe_info_shows_the_keys_of_each_layout(fixtures_dir):
    for fixture, keys in (("keydata_flat", ["adv", "kl_loss", "log_prob", "logits_parts", "responses"]),
                          ("keydata_ids", ["log_prob", "values"])):
        info = json.loads(_cli("info", fixtures_dir / "msprobe" / fixture / "run_a", "--json").output)
        assert sorted(k["key"] for k in info["keys"]) == keys
        assert {k["micro_steps"] for k in info["keys"]} == {1} and info["unread"] == []


def _with_unread(fixtures_dir: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(fixtures_dir / "msprobe/keydata/run_a", run)
    (run / "notes.txt").write_text("")
    (run / "data/log_prob/README").write_text("")
    (run / "data/log_prob/step1/rank0/micro_step0/log_prob.pt").write_bytes(b"")
    (run / "data/log_prob/step1/rank0/micro_step0/.log_prob.npy.tmp-123-0a0b0c0d").write_bytes(b"")  # rlprobe's
    (run / "data/.kl_loss.json.tmp-9-00000001").write_bytes(b"")
    for n in range(12):
        (run / f"data/responses/step0/rank0/sample{n:02d}").mkdir()
    return run


UNREAD = ["notes.txt", "data/log_prob/README", "data/log_prob/step1/rank0/micro_step0/log_prob.pt"] + [
    f"data/responses/step0/rank0/sample{n:02d}" for n in range(12)]


def test_entries_not_read_are_named_in_one_warning_and_the_rest_is_read(fixtures_dir, tmp_path):
    run = _with_unread(fixtures_dir, tmp_path)
    with pytest.warns(UnreadEntriesWarning) as caught:
        rows = rlprobe.open(run).arrow("key_data").to_pylist()
    assert len(rows) == 18  # every tensor msprobe wrote
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith(f"rlprobe: 15 entries of the msprobe dump {run} not read")
    shown = message.split("): ", 1)[1]
    assert shown.split(", ")[:3] == UNREAD[:3] and shown.endswith("sample06 and 5 more")  # the first 10, a count
    assert ".tmp-" not in message


def test_rlprobe_info_lists_every_entry_not_read(fixtures_dir, tmp_path):
    run = _with_unread(fixtures_dir, tmp_path)
    with pytest.warns(UnreadEntriesWarning, match="15 entries"):
        result = CliRunner().invoke(main, ["info", str(run), "--json"], catch_exceptions=False)
    assert result.exit_code == 0
    info = json.loads(result.stdout)
    assert info["unread"] == UNREAD and info["problems"] == []  # named, never an error
    with pytest.warns(UnreadEntriesWarning):
        table = _cli("info", run)
    assert table.exit_code == 0 and "not read (15" in table.output and "sample11" in table.output
    assert ".tmp-" not in table.output


def test_a_tensor_at_a_micro_step_another_file_holds_is_named_not_read_twice(fixtures_dir, tmp_path):
    """save() (micro_step0/) and save_ex() without micro_batch (rank<R>/) in one step both give micro-step 0, as do
    <key>.1.npy and <key>_1.npy: msprobe's comparator keeps one of them at random; rlprobe reads micro_step0/'s,
    then the first by name, and names the other (one row per key, step, rank, micro-step and index)."""
    run = tmp_path / "run"
    shutil.copytree(fixtures_dir / "msprobe/keydata/run_a", run)
    rank = run / "data/log_prob/step0/rank0"
    np.save(rank / "log_prob.npy", np.zeros(3, np.float32))
    np.save(rank / "log_prob.1.npy", np.ones(2, np.float32))
    np.save(rank / "log_prob_1.npy", np.full(2, 2, np.float32))
    with pytest.warns(UnreadEntriesWarning, match=r"2 entries .*: data/log_prob/step0/rank0/log_prob.npy, "
                                                  r"data/log_prob/step0/rank0/log_prob_1.npy$"):
        rows = rlprobe.open(run).arrow("key_data").to_pylist()
    mine = [(r["micro_step"], r["index"], r["tensor_file"]) for r in rows if r["key"] == "log_prob" and r["step"] == 0]
    assert mine == [(0, "", "data/log_prob/step0/rank0/micro_step0/log_prob.npy"),
                    (1, "", "data/log_prob/step0/rank0/micro_step1/log_prob.npy"),
                    (0, "1", "data/log_prob/step0/rank0/log_prob.1.npy")]


def test_an_entry_whose_name_is_no_utf8_is_named_printably(fixtures_dir, tmp_path):
    """os.listdir gives a byte that is no UTF-8 as a surrogate, which no encoder takes: a warning or info
    table holding it failed where the text was written (it killed a pytest-xdist worker). It is named as \\xff."""
    run = tmp_path / "run"
    shutil.copytree(fixtures_dir / "msprobe" / "keydata" / "run_a", run)
    os.mkdir(os.fsencode(run / "data" / "log_prob") + b"/odd\xff")
    with pytest.warns(UnreadEntriesWarning) as caught:
        rlprobe.open(run).arrow("key_data")
    assert str(caught[0].message).endswith(": data/log_prob/odd\\xff")
    str(caught[0].message).encode("utf-8")  # no surrogate left
    with pytest.warns(UnreadEntriesWarning):
        result = CliRunner().invoke(main, ["info", str(run), "--json"], catch_exceptions=False)
    assert result.exit_code == 0 and json.loads(result.stdout)["unread"] == ["data/log_prob/odd\\xff"]

"""rlprobe.compare end to end: statuses, first divergence, verdict, msprobe parity and faults."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import rlprobe
from rlprobe.pipeline.compare_command import compare

from tests.lake.layouts import unpack
from rlprobe.comparison.options import CompareOptions, Runtime


def _dump(path: Path, steps: dict[int, dict], **probe_kw) -> Path:
    with rlprobe.Probe(path, **probe_kw) as p:
        for step in sorted(steps):
            for call in steps[step] if isinstance(steps[step], list) else [steps[step]]:
                p.save(call)
            p.step()
    return path


def _rows(out: Path) -> dict[tuple, dict]:
    table = pq.read_table(out / "key_data.parquet").to_pylist()
    return {(r["key"], r["step"], r["rank"], r["micro_step"], r["index"]): r for r in table}


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_msprobe_fixture_metrics_equal_msprobe_expected(fixtures_dir, tmp_path):
    base = fixtures_dir / "msprobe/keydata"
    out = tmp_path / "out"
    compare(base / "run_a", base / "run_b", out)
    rows = _rows(out)
    checked = 0
    for expected_csv in sorted((base / "expected").glob("*.csv")):
        key = expected_csv.stem
        with open(expected_csv, encoding="utf-8-sig") as f:
            for rec in csv.reader(f):
                if rec[0] == "step":
                    continue
                step, rank, micro, idx = int(rec[0]), int(rec[1]), int(rec[2]), int(rec[3])
                r = rows[(key, step, rank, micro, "")]
                assert idx == 0
                assert json.loads(rec[4]) == r["shape_a"] and json.loads(rec[5]) == r["shape_b"]
                expect = {"same_pct": rec[6], "first_mismatch_index": rec[7], "max_abs_err": rec[8],
                          "max_rel_err": rec[9], "within_1e3_pct": rec[10], "within_1e2_pct": rec[11]}
                for col, text in expect.items():
                    if text == "":
                        assert r[col] is None, (key, step, micro, col)
                        continue
                    value = float(text)
                    assert math.isclose(r[col], value, rel_tol=1e-6, abs_tol=1e-12), (key, step, micro, col, r[col], value)
                checked += 1
    assert checked == 18  # 3 keys x 3 steps x 2 micro steps, every row of msprobe's output
    summary = _summary(out)
    # run_b perturbs log_prob from step 1 micro-step 0 and responses differ from micro-step 1 on;
    # the contract orders by step, then dataflow order (responses before log_prob), then micro_step
    first = summary["first_divergence"]
    assert (first["key"], first["step"], first["micro_step"]) == ("responses", 1, 1)
    assert summary["counts"] == {"match": 7, "mismatch": 11}  # step 0, and responses at step 1 micro-step 0


def test_statuses_cover_every_row_seen_in_either_run(tmp_path):
    f = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = _dump(tmp_path / "a", {0: {"same": f, "shape": f, "dtype": f, "only_a": f, "diff": f},
                               1: {"same": f}})
    b = _dump(tmp_path / "b", {0: {"same": f, "shape": f[:, :2], "dtype": f.astype(np.float64),
                                   "only_b": f, "diff": f + 1e-3}})
    out = tmp_path / "out"
    summary = compare(a, b, out)
    rows = _rows(out)
    assert rows[("same", 0, 0, 0, "")]["status"] == "match"
    assert rows[("same", 1, 0, 0, "")]["status"] == "only_in_a"
    assert rows[("shape", 0, 0, 0, "")]["status"] == "shape_mismatch"
    assert rows[("shape", 0, 0, 0, "")]["equal_count"] is None  # never truncated and compared
    assert "not compared element-wise" in rows[("shape", 0, 0, 0, "")]["message"]
    dt = rows[("dtype", 0, 0, 0, "")]
    assert dt["status"] == "dtype_mismatch" and dt["equal_count"] == 12
    assert "float32" in dt["message"] and "float64" in dt["message"]
    assert rows[("only_a", 0, 0, 0, "")]["status"] == "only_in_a"
    assert rows[("only_b", 0, 0, 0, "")]["status"] == "only_in_b"
    d = rows[("diff", 0, 0, 0, "")]
    assert d["status"] == "mismatch" and d["first_mismatch_index"] == 0
    assert math.isclose(d["max_abs_err"], 1e-3, rel_tol=1e-3)
    assert summary["counts"] == {"match": 1, "only_in_a": 2, "only_in_b": 1, "shape_mismatch": 1,
                                 "dtype_mismatch": 1, "mismatch": 1}


def test_first_divergence_follows_dataflow_order_not_alphabet(tmp_path):
    x = np.ones(4, np.float32)
    a = _dump(tmp_path / "a", {0: {"advantages": x, "ref_log_prob": x, "responses": np.arange(4)}})
    b = _dump(tmp_path / "b", {0: {"advantages": x * 2, "ref_log_prob": x * 3, "responses": np.arange(4)}})
    summary = compare(a, b, tmp_path / "out")
    assert summary["first_divergence"]["key"] == "ref_log_prob"  # before advantages in PPO's data flow
    assert "reference model" in summary["suspect"] and "responses identical" in summary["suspect"]
    cfg = summary["next_config"]["rlprobe_config"]
    assert cfg["stages"] == ["reference_compute_log_prob"] and cfg["step_start"] == 0
    rows = _rows(tmp_path / "out")
    assert rows[("ref_log_prob", 0, 0, 0, "")]["is_first_divergence"] is True
    assert rows[("advantages", 0, 0, 0, "")]["is_first_divergence"] is False


def test_update_suspected_when_everything_matched_until_new_rollouts_differ(tmp_path):
    x = np.ones(4, np.float32)
    a = _dump(tmp_path / "a", {0: {"responses": np.arange(4), "loss": x}, 1: {"responses": np.arange(4), "loss": x}})
    b = _dump(tmp_path / "b", {0: {"responses": np.arange(4), "loss": x}, 1: {"responses": np.arange(4) + 1, "loss": x}})
    summary = compare(a, b, tmp_path / "out")
    assert summary["first_divergence"]["step"] == 1
    assert "parameter update after step 0" in summary["suspect"]


def test_no_divergence(tmp_path):
    x = {0: {"log_prob": np.linspace(-3, 0, 7, dtype=np.float32)}}
    summary = compare(_dump(tmp_path / "a", x), _dump(tmp_path / "b", x), tmp_path / "out")
    assert summary["first_divergence"] is None and summary["counts"] == {"match": 1}
    for name in ("key_data.parquet", "key_data.csv", "summary.json", "summary.md", "report.xlsx"):
        assert (tmp_path / "out" / name).is_file()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".rlprobe-tmp")]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]  # no work folder left beside


def test_stats_only_rows_compare_by_hash_and_tolerance(tmp_path):
    x = np.linspace(0, 1, 100, dtype=np.float32)
    a = _dump(tmp_path / "a", {0: {"same": x, "near": x, "far": x}}, stats_only=True)
    b = _dump(tmp_path / "b", {0: {"same": x, "near": x * (1 + 1e-7), "far": x * (1 + 1e-3)}}, stats_only=True)
    rows = _rows(tmp_path / "out") if compare(a, b, tmp_path / "out") else None
    assert rows[("same", 0, 0, 0, "")]["status"] == "stats_only_match"
    # CPU stats-only rows carry hashes: other bits, statistics within float32's tolerance (1.5e-05)
    assert rows[("near", 0, 0, 0, "")]["status"] == "stats_only_close"
    assert "hash" in rows[("near", 0, 0, 0, "")]["message"]
    assert rows[("far", 0, 0, 0, "")]["status"] == "stats_only_mismatch"
    # --stats-rtol 0: statistics-only rows are compared exactly, bits by hash
    rows = _rows(tmp_path / "exact") if compare(a, b, tmp_path / "exact", stats_rtol=0) else None
    assert rows[("near", 0, 0, 0, "")]["status"] == "stats_only_mismatch"


def test_corrupt_and_truncated_tensors_are_error_rows_and_the_rest_completes(tmp_path):
    x = np.arange(1000, dtype=np.float32)
    a = _dump(tmp_path / "a", {0: {"k1": x, "k2": x, "k3": x}})
    b = _dump(tmp_path / "b", {0: {"k1": x, "k2": x, "k3": x}})
    unpack(b)  # a file a tensor, the layout before packed files (a record cut short: tests/lake/test_tensor_pack.py)
    d = rlprobe.open(b)
    files = {r["key"]: b / r["tensor_file"] for r in d.arrow("key_data").to_pylist()}
    data = files["k1"].read_bytes()
    files["k1"].write_bytes(data[: len(data) // 2])  # truncated
    files["k2"].write_bytes(b"not a numpy file at all")  # corrupt
    summary = compare(a, b, tmp_path / "out")
    rows = _rows(tmp_path / "out")
    assert rows[("k1", 0, 0, 0, "")]["status"] == "error" and "k1" in rows[("k1", 0, 0, 0, "")]["message"]
    assert rows[("k2", 0, 0, 0, "")]["status"] == "error"
    assert rows[("k3", 0, 0, 0, "")]["status"] == "match"
    assert summary["counts"] == {"error": 2, "match": 1}


def test_unreadable_parquet_part_is_reported_not_fatal(tmp_path):
    x = np.ones(3, np.float32)
    a = _dump(tmp_path / "a", {0: {"k": x}, 1: {"k": x}})
    b = _dump(tmp_path / "b", {0: {"k": x}, 1: {"k": x}})
    part = next((b / "stats/key_data/rank=0").glob("part-*.parquet"))
    part.write_bytes(b"PAR1 garbage")
    summary = compare(a, b, tmp_path / "out")
    assert summary["read_errors"] and str(part) in summary["read_errors"][0]
    assert summary["first_divergence"]["status"] == "error"
    assert summary["counts"]["only_in_a"] == 2  # rows of the unreadable part are missing in B, not dropped


# -- the known msprobe faults (tests/fixtures/README.md), each handled correctly -------------
def test_nan_does_not_poison_errors(tmp_path):
    a = _dump(tmp_path / "a", {0: {"x": np.array([1.0, np.nan, 3.0, 4.0], np.float32)}})
    b = _dump(tmp_path / "b", {0: {"x": np.array([1.0, np.nan, 3.5, np.nan], np.float32)}})
    compare(a, b, tmp_path / "out")
    r = _rows(tmp_path / "out")[("x", 0, 0, 0, "")]
    assert r["status"] == "mismatch" and r["equal_count"] == 2  # NaN at the same position counts as equal
    assert r["max_abs_err"] == 0.5 and math.isclose(r["max_rel_err"], 0.5 / 3.5)  # msprobe: NaN and 0
    assert r["nan_mismatch_count"] == 1 and r["first_mismatch_index"] == 2


def test_different_shapes_are_not_truncated(tmp_path):
    a = _dump(tmp_path / "a", {0: {"x": np.zeros((4, 16), np.float32)}})
    b = _dump(tmp_path / "b", {0: {"x": np.zeros((4, 8), np.float32)}})
    summary = compare(a, b, tmp_path / "out")
    assert summary["first_divergence"]["status"] == "shape_mismatch"  # msprobe reports a match here


def test_dict_items_each_compared(tmp_path):
    a = _dump(tmp_path / "a", {0: {"stats": {"mean": np.ones(2), "std": np.ones(2)}}})
    b = _dump(tmp_path / "b", {0: {"stats": {"mean": np.ones(2), "std": np.ones(2) * 2}}})
    compare(a, b, tmp_path / "out")
    rows = _rows(tmp_path / "out")
    assert rows[("stats", 0, 0, 0, "mean")]["status"] == "match"
    assert rows[("stats", 0, 0, 0, "std")]["status"] == "mismatch"  # msprobe compares only one (id 0)


def test_key_in_one_run_only_is_reported(tmp_path):
    a = _dump(tmp_path / "a", {0: {"x": np.ones(2), "extra": np.ones(2)}})
    b = _dump(tmp_path / "b", {0: {"x": np.ones(2)}})
    summary = compare(a, b, tmp_path / "out")
    assert summary["counts"]["only_in_a"] == 1 and "run B has no 'extra'" in summary["suspect"]


def test_token_ids_beyond_float32_precision_are_told_apart(tmp_path):
    ids = np.array([16_777_216, 5], np.int64)
    a = _dump(tmp_path / "a", {0: {"responses": ids}})
    b = _dump(tmp_path / "b", {0: {"responses": ids + np.array([1, 0])}})
    compare(a, b, tmp_path / "out")
    r = _rows(tmp_path / "out")[("responses", 0, 0, 0, "")]
    assert r["status"] == "mismatch" and r["max_abs_err"] == 1.0  # as float32 (msprobe) both would be 16777216


def test_msprobe_dump_against_rlprobe_dump(fixtures_dir, tmp_path):
    src = fixtures_dir / "msprobe/keydata/run_a"
    mine = tmp_path / "mine"
    from rlprobe.lake.importer import import_msprobe

    import_msprobe(src, mine)
    summary = compare(src, mine, tmp_path / "out")
    assert summary["first_divergence"] is None and summary["counts"] == {"match": 18}


def test_filters_and_unwritable_output(tmp_path):
    x = np.ones(2)
    a = _dump(tmp_path / "a", {0: {"x": x, "y": x}, 1: {"x": x, "y": x}})
    summary = compare(a, a, tmp_path / "out", keys=["x"], steps=[1])
    assert summary["counts"] == {"match": 1}
    (tmp_path / "file").write_text("")
    with pytest.raises(rlprobe.ProbeError, match="cannot be written"):
        compare(a, a, tmp_path / "file" / "out")


def test_public_api_rlprobe_compare_returns_summary(tmp_path):
    import rlprobe.comparison.run  # noqa: F401  (importing a submodule must not hide the callable)

    x = {0: {"loss": np.float32(1.0)}}
    summary = rlprobe.compare(_dump(tmp_path / "a", x), _dump(tmp_path / "b", x), tmp_path / "out")
    assert summary["counts"] == {"match": 1} and summary["first_divergence"] is None


def test_both_runs_statistics_are_returned_unless_asked_not_to(tmp_path):
    from rlprobe.comparison.run import compare_dumps
    from rlprobe.lake.reader import open_dump

    x = {0: {"log_prob": np.linspace(-3, 0, 7, dtype=np.float32)}, 1: {"log_prob": np.zeros(3, np.float32)}}
    a, b = open_dump(_dump(tmp_path / "a", x)), open_dump(_dump(tmp_path / "b", x))
    tables, summary = compare_dumps(a, b, CompareOptions(workers=1))
    assert tables["stats_a"].num_rows == tables["stats_b"].num_rows == 2
    assert sorted(tables["stats_a"]["step"].to_pylist()) == [0, 1]
    without, summary_without = compare_dumps(a, b, CompareOptions(workers=1), Runtime(stats=False))
    assert "stats_a" not in without and "stats_b" not in without
    assert without["key_data"].equals(tables["key_data"]) and summary_without["counts"] == summary["counts"]

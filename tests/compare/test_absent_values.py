"""None values (a trainer's "not computed", as TRL hands them): saved as rows marked absent, and
compared as absent_in_a / absent_in_b / absent_in_both rather than a missing row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import rlprobe
from rlprobe import DumpReadError
from rlprobe.cli import main
from rlprobe.pipeline.compare_command import compare


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("RLPROBE_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _run(path: Path, steps: list[dict], **kw) -> Path:
    with rlprobe.Probe(path, rank=0, world_size=1, **kw) as probe:
        for values in steps:
            probe.save(values)
            probe.step()
    return path


def _rows(out: Path) -> dict[tuple, dict]:
    return {(r["key"], r["step"], r["micro_step"], r["index"]): r
            for r in pq.read_table(out / "key_data.parquet").to_pylist()}


LOG_PROB = torch.tensor([-1.0, -2.0, -0.5])


def test_none_is_saved_as_an_absent_row_and_the_rest_of_the_call_is_kept(tmp_path):
    path = _run(tmp_path / "dump", [{"old_log_prob": None, "log_prob": LOG_PROB, "pair": [LOG_PROB, None]}])
    dump = rlprobe.open(path)
    rows = {(r["key"], r["index"]): r for r in dump.key_data().collect().to_dicts()}
    assert set(rows) == {("old_log_prob", ""), ("log_prob", ""), ("pair", "0"), ("pair", "1")}
    for key in (("old_log_prob", ""), ("pair", "1")):
        absent = rows[key]
        assert absent["absent"] is True and absent["step"] == 0 and absent["micro_step"] == 0
        for column in ("dtype", "shape", "numel", "min", "max", "mean", "norm", "nan_count", "hash", "tensor_file"):
            assert absent[column] is None, (key, column)
    assert not rows[("log_prob", "")]["absent"]
    np.testing.assert_array_equal(dump.tensor("log_prob", 0), LOG_PROB.numpy())
    with pytest.raises(DumpReadError, match="'old_log_prob' step 0 .* saved as None"):
        dump.tensor("old_log_prob", 0)
    assert not (path / "tensors" / "key_data" / "key=old_log_prob").exists()
    (info,) = [k for k in json.loads(CliRunner().invoke(main, ["info", str(path), "--json"]).output)["keys"]
               if k["key"] == "old_log_prob"]
    assert (info["absent"], info["tensors"], info["tensor_files"]) == (1, 0, 0)


def test_micro_steps_count_a_none_like_any_other_save(tmp_path):
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save({"values": None})
        probe.save({"values": LOG_PROB})
    rows = rlprobe.open(path).key_data().collect().sort("micro_step")
    assert rows.select("micro_step", "absent").rows() == [(0, True), (1, False)]


@pytest.mark.parametrize("stats_only", [False, True])
def test_compare_says_absent_in_a_b_or_both(tmp_path, stats_only):
    a = _run(tmp_path / "a", [{"old_log_prob": None, "ref_log_prob": None, "log_prob": LOG_PROB, "values": LOG_PROB,
                               "kl": None}], stats_only=stats_only)
    b = _run(tmp_path / "b", [{"old_log_prob": LOG_PROB, "ref_log_prob": None, "log_prob": LOG_PROB, "values": None}],
             stats_only=stats_only)
    out = tmp_path / "out"
    summary = compare(a, b, out)
    rows = _rows(out)
    keys = ("old_log_prob", "ref_log_prob", "log_prob", "values", "kl")
    status = {key: rows[(key, 0, 0, "")]["status"] for key in keys}
    assert status == {"old_log_prob": "absent_in_a", "ref_log_prob": "absent_in_both",
                      "log_prob": "stats_only_match" if stats_only else "match", "values": "absent_in_b",
                      "kl": "only_in_a"}
    assert rows[("old_log_prob", 0, 0, "")]["message"] == "None (not computed) in run A, a value in run B"
    assert rows[("ref_log_prob", 0, 0, "")]["message"] == "None (not computed) in both runs"
    assert rows[("kl", 0, 0, "")]["message"] == "missing in run B (None in run A)"
    assert rows[("old_log_prob", 0, 0, "")]["max_b"] == -0.5 and rows[("old_log_prob", 0, 0, "")]["max_a"] is None
    assert summary["counts"] == {"absent_in_a": 1, "absent_in_b": 1, "absent_in_both": 1, "only_in_a": 1,
                                 ("stats_only_match" if stats_only else "match"): 1}
    # first divergence in dataflow order: values (critic) comes before old_log_prob
    first = summary["first_divergence"]
    assert (first["key"], first["status"]) == ("values", "absent_in_b"), first
    assert "run B saved None (not computed) for 'values'" in summary["suspect"], summary["suspect"]
    rollup = {k["key"]: k for k in summary["keys"]}
    assert (rollup["ref_log_prob"]["matching"], rollup["ref_log_prob"]["diverging"]) == (1, 0)
    assert (rollup["old_log_prob"]["matching"], rollup["old_log_prob"]["diverging"]) == (0, 1)


def test_none_in_both_runs_is_no_divergence(tmp_path):
    steps = [{"old_log_prob": None, "log_prob": LOG_PROB + s} for s in range(3)]
    a, b = _run(tmp_path / "a", steps), _run(tmp_path / "b", steps)
    summary = compare(a, b, tmp_path / "out")
    assert summary["first_divergence"] is None
    assert summary["counts"] == {"absent_in_both": 3, "match": 3}
    assert summary["on_policy_recompute"] == {}  # a None old_log_prob is no failed recomputation
    gate = CliRunner().invoke(main, ["compare", str(a), str(b), "-o", str(tmp_path / "out2"), "--fail-on-diff",
                                     "--quiet"])
    assert gate.exit_code == 0, gate.output


def test_parts_written_before_the_absent_column_still_compare(tmp_path):
    """Dumps of earlier versions have no `absent` column: read as null (a value was saved)."""
    import pyarrow.parquet as pq_

    a = _run(tmp_path / "a", [{"log_prob": LOG_PROB}])
    b = _run(tmp_path / "b", [{"log_prob": LOG_PROB}])
    for part in (a / "stats" / "key_data" / "rank=0").glob("*.parquet"):
        table = pq_.read_table(part, partitioning=None)
        pq_.write_table(table.drop_columns(["absent"]), part)
    summary = compare(a, b, tmp_path / "out")
    assert summary["counts"] == {"match": 1}
    con = rlprobe.open(a).connect()
    assert con.execute("select absent from key_data").fetchall() == [(None,)]

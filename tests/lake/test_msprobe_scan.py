"""rlprobe/lake/msprobe_scan.py: an msprobe dump's statistics read by a child Python (what
`rlprobe compare --workers 2` does for run B) give the table this process reads, and every error
is still the one this process reports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from rlprobe.errors import DumpReadError
from rlprobe.lake import msprobe_format
from rlprobe.lake.msprobe_format import KeyDataReader, key_data_table, tensors_estimate


def _item(run: Path, key: str, step: int, micro: int, stem: str, array: np.ndarray, meta: str | None) -> Path:
    d = run / "data" / key / f"step{step}" / "rank0" / f"micro_step{micro}"
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / f"{stem}.npy", array)
    if meta is not None:
        (d / f"{stem}.json").write_text(meta, encoding="utf-8")
    return d / f"{stem}.json"


def _odd_dump(run: Path) -> Path:
    """Statistics as msprobe writes them and as it might: NaN and infinities (JSON's NaN/Infinity),
    integers and text, no shape, no statistics file, indexes, a non-ASCII key, folders to skip."""
    _item(run, "log_prob", 0, 0, "log_prob", np.arange(8, dtype=np.float32).reshape(2, 4),
          json.dumps({"data": {"max": 7.0, "min": 0.0, "mean": 3.5, "norm": 11.832159566199232, "shape": [2, 4]}}))
    _item(run, "log_prob", 0, 1, "log_prob", np.zeros(3, np.float32),
          '{"data": {"max": NaN, "min": -Infinity, "mean": Infinity, "norm": 0.1, "shape": [3]}}')
    _item(run, "adv", 10, 0, "adv.0", np.ones(2, np.float32), json.dumps({"data": {"max": 1, "min": "0.5"}}))
    _item(run, "adv", 10, 0, "adv.critic", np.ones((1, 2), np.float64), None)
    _item(run, "adv", 2, 0, "adv", np.ones(5, np.int64), json.dumps({"data": {"shape": [5], "norm": True}}))
    _item(run, "清", 1, 0, "清", np.ones(1, np.float32), json.dumps({"data": {"max": 0.30000000000000004}}))
    (run / "data" / "adv" / "not-a-step").mkdir()
    (run / "data" / "adv" / "step10" / "rank0" / "micro_step0" / ".hidden.npy").write_bytes(b"")
    return run


def test_a_child_reads_the_table_this_process_reads(tmp_path: Path):
    run = _odd_dump(tmp_path / "run")
    reader = KeyDataReader(run)
    columns = reader.columns()
    assert columns is not None  # the child read it (else the comparison below would compare a table with itself)
    assert columns["key"] == ["adv", "adv", "adv", "log_prob", "log_prob", "清"]
    assert columns["step"] == [2, 10, 10, 0, 0, 1]
    here = key_data_table(run)
    reader = KeyDataReader(run)
    beside = key_data_table(run, reader)
    assert repr(beside.to_pylist()) == repr(here.to_pylist())  # NaN and -0.0 as they are
    rows = here.to_pylist()
    assert [r["index"] for r in rows] == ["", "0", "critic", "", "", ""]
    assert rows[4]["max"] != rows[4]["max"] and rows[4]["min"] == float("-inf")
    assert rows[2]["shape"] == [1, 2] and rows[2]["max"] is None  # no statistics file: the npy header's shape
    assert rows[5]["max"] == 0.30000000000000004


def test_the_estimate_of_tensors_decides_the_child(tmp_path: Path):
    run = _odd_dump(tmp_path / "run")
    assert tensors_estimate(run) == 3 * 2 * 1 * 1 * 1  # keys x adv's steps (2, 10) x ranks x micro-steps x tensors
    assert tensors_estimate(tmp_path / "missing") == 0
    assert rlprobe_open(run).read_key_data_beside() is None  # 6 < CHILD_MIN_TENSORS: read here
    for step in range(CHILDLESS := msprobe_format.CHILD_MIN_TENSORS // 2):
        _item(tmp_path / "big", "k", step, 0, "k", np.zeros(1, np.float32), None)
        _item(tmp_path / "big", "l", step, 0, "l", np.zeros(1, np.float32), None)
    assert tensors_estimate(tmp_path / "big") == 2 * CHILDLESS
    dump = rlprobe_open(tmp_path / "big")
    reader = dump.read_key_data_beside()
    assert reader is not None and dump.read_key_data_beside() is None  # one child a dump
    assert dump.arrow("key_data").num_rows == 2 * CHILDLESS


def rlprobe_open(path: Path):
    from rlprobe.lake.reader import open_dump

    return open_dump(path)


def test_a_corrupt_statistics_file_of_run_b_is_named_with_two_workers(tmp_path: Path, monkeypatch):
    from rlprobe.pipeline.compare_command import compare

    monkeypatch.setattr(msprobe_format, "CHILD_MIN_TENSORS", 1)  # a child for these few tensors too

    run_a = _odd_dump(tmp_path / "a")
    run_b = _odd_dump(tmp_path / "b")
    bad = run_b / "data" / "adv" / "step2" / "rank0" / "micro_step0" / "adv.json"
    bad.write_text("{not json")
    assert KeyDataReader(run_b).columns() is None  # the child fails: this process reads run B and says why
    with pytest.raises(DumpReadError) as info:
        compare(run_a, run_b, tmp_path / "out", workers=2)
    assert str(bad) in str(info.value) and "not valid JSON" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_run_a_failing_first_stops_run_b_s_child(tmp_path: Path, monkeypatch):
    from rlprobe.pipeline.compare_command import compare

    monkeypatch.setattr(msprobe_format, "CHILD_MIN_TENSORS", 1)  # a child for these few tensors too

    run_a = _odd_dump(tmp_path / "a")
    run_b = _odd_dump(tmp_path / "b")
    bad = run_a / "data" / "log_prob" / "step0" / "rank0" / "micro_step1" / "log_prob.json"
    bad.write_bytes(b'{"data": {"max": "\xff"}}')
    before = _children()
    with pytest.raises(DumpReadError) as info:
        compare(run_a, run_b, tmp_path / "out", workers=2)
    assert str(bad) in str(info.value)
    assert _children() == before  # run B's reader was stopped and reaped


def _children() -> set[int]:
    """This process's child processes (Linux: /proc), zombies included."""
    task = Path(f"/proc/{os.getpid()}/task")
    if not task.is_dir():
        pytest.skip("needs /proc")
    found: set[int] = set()
    for t in task.iterdir():
        children = t / "children"
        if children.is_file():
            found.update(int(p) for p in children.read_text().split())
    return found

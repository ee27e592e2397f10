"""rlprobe/lake/msprobe_scan.py: an msprobe dump's folders listed first (what a comparison with two
workers starts comparing pairs from: rlprobe/comparison/pair_results.py), its statistics read from that
listing, give the table a reading in one go gives, and every error is still the one it reports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from rlprobe.errors import DumpReadError
from rlprobe.lake import msprobe_scan
from rlprobe.lake.msprobe_format import key_data_table


def _item(run: Path, key: str, step: int, micro: int, stem: str, array: np.ndarray, meta: str | None) -> Path:
    d = run / "data" / key / f"step{step}" / "rank0" / f"micro_step{micro}"
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / f"{stem}.npy", array)
    if meta is not None:
        (d / f"{stem}.json").write_text(meta, encoding="utf-8")
    return d / f"{stem}.json"


def _odd_dump(run: Path, unread: bool = True) -> Path:
    """Statistics as msprobe writes them and as it might: NaN and infinities (JSON's NaN/Infinity),
    integers and text, no shape, no statistics file, indexes, a non-ASCII key, and (`unread`) a folder and a
    hidden file that are not read (named: msprobe_format.unread_entries)."""
    _item(run, "log_prob", 0, 0, "log_prob", np.arange(8, dtype=np.float32).reshape(2, 4),
          json.dumps({"data": {"max": 7.0, "min": 0.0, "mean": 3.5, "norm": 11.832159566199232, "shape": [2, 4]}}))
    _item(run, "log_prob", 0, 1, "log_prob", np.zeros(3, np.float32),
          '{"data": {"max": NaN, "min": -Infinity, "mean": Infinity, "norm": 0.1, "shape": [3]}}')
    _item(run, "adv", 10, 0, "adv.0", np.ones(2, np.float32), json.dumps({"data": {"max": 1, "min": "0.5"}}))
    _item(run, "adv", 10, 0, "adv.critic", np.ones((1, 2), np.float64), None)
    _item(run, "adv", 2, 0, "adv", np.ones(5, np.int64), json.dumps({"data": {"shape": [5], "norm": True}}))
    _item(run, "清", 1, 0, "清", np.ones(1, np.float32), json.dumps({"data": {"max": 0.30000000000000004}}))
    if unread:
        (run / "data" / "adv" / "not-a-step").mkdir()
        (run / "data" / "adv" / "step10" / "rank0" / "micro_step0" / ".hidden.npy").write_bytes(b"")
    return run


def test_the_statistics_read_from_a_listing_are_the_table_read_in_one_go(tmp_path: Path):
    run = _odd_dump(tmp_path / "run")
    listing = msprobe_scan.list_tensors(os.fspath(run))
    assert listing.columns["key"] == ["adv", "adv", "adv", "log_prob", "log_prob", "清"]
    assert listing.columns["step"] == [2, 10, 10, 0, 0, 1]
    assert listing.metas[2] is None  # adv.critic: no statistics file
    here = key_data_table(run)
    listed = key_data_table(run, listing)
    assert repr(listed.to_pylist()) == repr(here.to_pylist())  # NaN and -0.0 as they are
    rows = here.to_pylist()
    assert [r["index"] for r in rows] == ["", "0", "critic", "", "", ""]
    assert rows[4]["max"] != rows[4]["max"] and rows[4]["min"] == float("-inf")
    assert rows[2]["shape"] == [1, 2] and rows[2]["max"] is None  # no statistics file: the npy header's shape
    assert rows[5]["max"] == 0.30000000000000004
    assert rows[1]["min"] == 0.5 and rows[0]["norm"] == 1.0  # text and true read as numbers, as before


def test_a_dump_lists_its_folders_once_and_reads_its_statistics_from_that_listing(tmp_path: Path):
    run = _odd_dump(tmp_path / "run")
    dump = rlprobe_open(run)
    files = dump.msprobe_tensor_files()
    assert files == ["data/adv/step2/rank0/micro_step0/adv.npy", "data/adv/step10/rank0/micro_step0/adv.0.npy",
                     "data/adv/step10/rank0/micro_step0/adv.critic.npy",
                     "data/log_prob/step0/rank0/micro_step0/log_prob.npy",
                     "data/log_prob/step0/rank0/micro_step1/log_prob.npy", "data/清/step1/rank0/micro_step0/清.npy"]
    # a tensor written after the listing is not in the table: the statistics are read from the listing
    _item(run, "late", 0, 0, "late", np.zeros(1, np.float32), None)
    table = dump.arrow("key_data")
    assert table["tensor_file"].to_pylist() == files
    now = key_data_table(run)
    assert repr(table.to_pylist()) == repr(now.filter(pc.not_equal(now["key"], "late")).to_pylist())
    assert dump.msprobe_tensor_files() == files  # from the table now
    assert rlprobe_open(tmp_path / "run").msprobe_tensor_files()[3] == "data/late/step0/rank0/micro_step0/late.npy"


def test_a_folder_that_cannot_be_listed_is_the_reading_s_error(tmp_path: Path):
    dump = rlprobe_open(_odd_dump(tmp_path / "run"))
    (tmp_path / "run" / "data").rename(tmp_path / "moved")
    with pytest.raises(OSError):
        dump.msprobe_tensor_files()
    with pytest.raises(OSError):
        dump.arrow("key_data")


def rlprobe_open(path: Path):
    from rlprobe.lake.reader import open_dump

    return open_dump(path)


def test_a_corrupt_statistics_file_of_run_b_is_named_with_two_workers(tmp_path: Path):
    """Pairs are compared ahead from the listings while the statistics are read (two workers, 16 pairs or
    more): the statistics file that is not JSON is the error, and no thread of the comparison is left."""
    import threading

    from rlprobe.pipeline.compare_command import compare
    from tests.compare.test_pairs_ahead import COMPARISON_THREADS

    runs = {}
    for name in ("a", "b"):
        runs[name] = _odd_dump(tmp_path / name)
        for step in range(20):
            _item(runs[name], "many", step, 0, "many", np.full(3, step, np.float32), None)
    bad = runs["b"] / "data" / "adv" / "step2" / "rank0" / "micro_step0" / "adv.json"
    bad.write_text("{not json")
    with pytest.raises(DumpReadError) as info:
        compare(runs["a"], runs["b"], tmp_path / "out", workers=2)
    assert str(bad) in str(info.value) and "not valid JSON" in str(info.value)
    assert not (tmp_path / "out").exists()
    assert not [t.name for t in threading.enumerate() if t.name.startswith(COMPARISON_THREADS)]


def test_run_a_failing_first_is_the_error_with_two_workers(tmp_path: Path):
    from rlprobe.pipeline.compare_command import compare

    run_a = _odd_dump(tmp_path / "a")
    run_b = _odd_dump(tmp_path / "b")
    bad = run_a / "data" / "log_prob" / "step0" / "rank0" / "micro_step1" / "log_prob.json"
    bad.write_bytes(b'{"data": {"max": "\xff"}}')
    (run_b / "data" / "adv" / "step2" / "rank0" / "micro_step0" / "adv.json").write_text("{not json")
    with pytest.raises(DumpReadError) as info:
        compare(run_a, run_b, tmp_path / "out", workers=2)
    assert str(bad) in str(info.value)


def test_a_second_process_reads_the_table_this_one_reads(tmp_path: Path):
    """msprobe_scan.ChildRead (what a comparison reads run B with while its modules load): the same rows, NaN and
    infinities, the same entries named as not read."""
    run = _odd_dump(tmp_path / "run")
    assert msprobe_scan.start_reading(run) is None  # a few tensors: read here, where they are asked for
    reading = msprobe_scan.start_reading(run, least=1)
    assert reading is not None
    read = reading.result()
    assert read is not None and read[1] == msprobe_scan.list_tensors(os.fspath(run)).unread != ()
    with pytest.warns(UserWarning, match="not-a-step"):
        there = key_data_table(run, read=read)
    with pytest.warns(UserWarning, match="not-a-step"):
        here = key_data_table(run)
    assert repr(there.to_pylist()) == repr(here.to_pylist())
    assert msprobe_scan.start_reading(tmp_path / "nothing-here", least=1) is None


@pytest.mark.parametrize("ranks, micro_steps", [(1, 1), (2, 4)])
def test_a_dump_of_many_tensors_is_read_in_a_second_process(tmp_path: Path, ranks: int, micro_steps: int):
    """The tensors start_reading estimates (keys x steps x ranks x micro-steps) decide: from CHILD_MIN_TENSORS on,
    a second process; below, none."""
    run, steps = tmp_path / "run", msprobe_scan.CHILD_MIN_TENSORS // (2 * ranks * micro_steps)
    (run / "data" / ".hidden").mkdir(parents=True)  # not counted, nor a stray file looked into
    (run / "data" / "README").write_text("not a key")
    for key in ("kl", "loss"):
        for step in range(steps):
            for rank in range(ranks):
                for micro in range(micro_steps):
                    d = run / "data" / key / f"step{step}" / f"rank{rank}" / f"micro_step{micro}"
                    d.mkdir(parents=True)
                    np.save(d / f"{key}.npy", np.zeros(2, np.float32))
    reading = msprobe_scan.start_reading(run, least=msprobe_scan.CHILD_MIN_TENSORS + 1)
    assert reading is not None  # 3 entries under data/ (the README counted) x steps x ranks x micro-steps
    values, unread = reading.result()
    assert len(values["key"]) == 2 * steps * ranks * micro_steps and unread == ("data/README",)
    assert msprobe_scan.start_reading(run, least=3 * steps * ranks * micro_steps + 1) is None


def test_a_bad_statistics_file_read_in_a_second_process_is_named_by_this_one(tmp_path: Path):
    run = _odd_dump(tmp_path / "run", unread=False)
    bad = _item(run, "log_prob", 3, 0, "log_prob", np.zeros(2, np.float32), "{not json")
    dump = rlprobe_open(run)
    dump.reading_ahead.start(msprobe_scan.start_reading(run, least=1))  # a small dump: as a large one would be
    with pytest.raises(DumpReadError) as info:
        dump.arrow("key_data")
    assert str(bad) in str(info.value) and "not valid JSON" in str(info.value)


@pytest.mark.parametrize("pad", [(1 << 16) - 40, 1 << 16, 3 << 16])
def test_a_statistics_file_longer_than_one_read_is_read_whole(tmp_path: Path, pad: int):
    """A statistics file is read in 64 KiB reads: one of any length (a pad of spaces: one read's length, more)
    gives its statistics, here and in a second process."""
    run = tmp_path / "run"
    _item(run, "kl", 1, 0, "kl", np.zeros(2, np.float32), '{"data": {"max": 2.5,' + " " * pad + '"shape": [2]}}')
    for values in (msprobe_scan.scan_key_data(os.fspath(run)), msprobe_scan.start_reading(run, least=1).result()[0]):
        assert values["max"] == [2.5] and values["shape"] == [[2]]

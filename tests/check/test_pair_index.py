"""The pairs within a save call computed on the tensor index's columns (rlprobe/checks/pair_index.py) are
token_tables.pairs' (the rule in Python, a dict a row), key by key in the same order, with the same
files read; where the columnar rule does not apply, token_tables pairs in Python and its tables do not
change."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import rlprobe
from rlprobe.checks import pair_index as pair_index_module
from rlprobe.checks import token_tables as token_tables_module
from rlprobe.checks.inputs import stats_table
from rlprobe.checks.pair_index import pair_index
from rlprobe.checks.token_tables import pairs, tensor_rows, token_tables
from rlprobe.lake.reader import open_dump


def every_case(path):
    """Rollout vs old (a mask, none, one saved without an index for a list of log-probs, one of another
    size), rollout vs log_prob at micro-step 0 and none at 1, the on-policy pair, shapes that differ, an
    integer rollout and a float64 pair, over 9 steps of 2 save calls (more keys than pool jobs)."""
    rng = np.random.default_rng(3)
    with rlprobe.Probe(path, flush_interval=0) as p:
        for step in range(9):
            for micro in range(2):
                old = -rng.random((3, 10 + step), dtype=np.float32)
                batch = {"rollout_log_prob": old + np.float32(0.01), "old_log_prob": old,
                         "response_mask": rng.random(old.shape) > 0.3}
                if step == 1:  # no old_log_prob: rollout vs log_prob at micro-step 0 only
                    batch["log_prob"] = batch.pop("old_log_prob")
                if step == 2:  # log-probs in lists, one mask for each of them; and a mask of another size
                    batch = {"rollout_log_probs": [old + np.float32(0.02), old], "old_log_probs": [old, old - 1],
                             "response_mask": batch["response_mask"]}
                    if micro == 0:  # a mask for each log-prob of another size: none
                        batch["action_mask"] = [np.ones(4, bool)] * 2
                if step == 3 and micro == 1:
                    batch["rollout_log_prob"] = batch["rollout_log_prob"][:, :-1]  # shapes differ: no pair
                if step == 4:
                    batch["rollout_log_prob"] = (batch["rollout_log_prob"] * 100).astype(np.int64)  # not float
                    batch["log_prob"] = old + np.float32(1e-3)
                    batch["old_log_prob"] = old.astype(np.float64)
                if step == 5 and micro == 0:
                    del batch["response_mask"]
                    batch["log_prob"] = old
                p.save(batch)
            p.step()
    return open_dump(path)


def _where(row):
    """A tensor's place: its file and its record's offset (a save call's tensors share one packed file)."""
    return row["tensor_file"], row["tensor_offset"]


def python_pairs(stats):
    found: dict[tuple, list] = {}
    for p in pairs(tensor_rows(stats)):
        found.setdefault((p.pair, p.a["step"], p.a["rank"]), []).append(
            (_where(p.a), _where(p.b), None if p.mask is None else _where(p.mask)))
    return sorted(found.items())


def test_the_columns_pair_as_the_rows_do(tmp_path):
    dump = every_case(tmp_path / "d")
    stats = stats_table(dump)
    index = pair_index(stats)
    files = list(zip(index.table["tensor_file"].to_pylist(), index.table["tensor_offset"].to_pylist()))
    got = [(key, [(files[a], files[b], None if m < 0 else files[m])
                  for a, b, m in zip(*(x[index.starts[k]:index.starts[k + 1]].tolist()
                                       for x in (index.a, index.b, index.mask)))])
           for k, key in enumerate(index.keys())]
    expected = python_pairs(stats)
    assert got == expected
    assert pair_index(stats, min_keys=len(expected)) is not None and pair_index(stats, len(expected) + 1) is None
    chunked = pair_index(pa.concat_tables([stats.slice(0, 5), stats.slice(5, 3), stats.slice(8)]))  # as a lake reads
    assert [x.tolist() for x in (chunked.a, chunked.b, chunked.mask, chunked.name_at)] == \
        [x.tolist() for x in (index.a, index.b, index.mask, index.name_at)] and bytes(chunked.paths) == bytes(index.paths)
    kinds = {key[0] for key, _ in expected}
    assert kinds == {"rollout_vs_old", "rollout_vs_log_prob", "on_policy"}
    assert any(m is None for _, parts in expected for _, _, m in parts)
    names = {f: r["key"] for r in stats.to_pylist() for f in [(r["tensor_file"], r["tensor_offset"])]}
    assert len({f for f, _ in files}) < len(files) == len(set(files))  # a call's tensors: one packed file
    assert any(m is not None and names.get(m) == "response_mask" and "rollout_log_probs" in names.get(b, "")
               for _, parts in expected for _, b, m in parts)  # a mask saved without an index serves each
    part = index.part(int(index.starts[1]))
    assert (part.pair, part.a["step"], part.b["canonical"]) == (expected[1][0][0], expected[1][0][1],
                                                                "rollout_log_prob" if part.pair != "on_policy"
                                                                else "log_prob")


def test_files_are_named_from_their_folder_as_the_plan_names_them(tmp_path):
    from rlprobe.checks.token_batch import _split

    index = pair_index(stats_table(every_case(tmp_path / "d")))
    names = bytes(index.paths)
    for i, file in enumerate(index.table["tensor_file"].to_pylist()):
        at = int(index.name_at[i])
        assert (index.folders[index.folder[i]], names[at:names.index(b"\0", at)].decode()) == _split(file)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_name_saved_twice_in_a_call_pairs_in_python_with_the_same_tables(tmp_path, workers):
    """old_log_prob and old_log_probs in one call share a canonical name: the rows' dict keeps the last,
    the columns give up (None) and the tables are those of the Python pairing."""
    rng = np.random.default_rng(4)
    with rlprobe.Probe(tmp_path / "d", flush_interval=0) as p:
        for _ in range(9):
            old = -rng.random((2, 16), dtype=np.float32)
            p.save({"rollout_log_prob": old + np.float32(0.01), "old_log_prob": old, "old_log_probs": old - 1})
            p.step()
    dump = open_dump(tmp_path / "d")
    stats = stats_table(dump)
    assert pair_index(stats) is None
    got = token_tables(dump, stats, 0.2, workers=workers)
    assert got["token_steps"].num_rows == 9
    assert got["token_steps"]["max_abs"].to_pylist() == pytest.approx([1.01] * 9, rel=1e-6)  # the last saved


@pytest.mark.parametrize("workers", [1, 2])
def test_the_tables_from_the_columns_equal_those_from_the_rows(tmp_path, monkeypatch, workers):
    dump = every_case(tmp_path / "d")
    stats = stats_table(dump)
    columns = token_tables(dump, stats, 0.2, workers=workers)
    monkeypatch.setattr(token_tables_module, "pair_index", lambda *args: None)  # the rows paired in Python
    rows = token_tables(dump, stats, 0.2, workers=workers)
    assert columns["token_steps"].num_rows == len(python_pairs(stats)) >= 8  # the columns' path was taken
    for name, table in rows.items():
        assert table.schema == columns[name].schema, name
        pd.testing.assert_frame_equal(columns[name].to_pandas(), table.to_pandas(), check_exact=True, obj=name)


def test_tuples_past_62_bits_are_not_numbered():
    big = np.array([0, 2 ** 40], np.int64)
    assert pair_index_module._numbered(big, big) is None
    assert pair_index_module._numbered(big, np.array([5, 5])).tolist() == [0, 1]


def test_without_compiled_reads_numpy_reads_each_part_of_the_index(tmp_path, monkeypatch):
    """Where the C library's reads do not run (not POSIX: npy_header.COMPILED_READS), every part of a job planned
    from the index is read by numpy (token_batch._preload) in the one compiled call, with the same tables."""
    from rlprobe.checks import token_batch
    from rlprobe.lake import npy_header

    dump = every_case(tmp_path / "d")
    stats = stats_table(dump)
    expected = token_tables(dump, stats, 0.2, workers=1)
    read = []
    preload = token_batch._preload
    monkeypatch.setattr(npy_header, "COMPILED_READS", False)
    monkeypatch.setattr(token_batch, "_preload", lambda *a: read.append(a[1]) or preload(*a))
    got = token_tables(dump, stats, 0.2, workers=1)
    parts = {(p.pair, _where(p.a), _where(p.b)) for p in read}
    # every part read by numpy but those of the job of the float64 pair (not the batch call's: one by one)
    assert len(read) >= 12 and parts <= {(key[0], a, b) for key, found in python_pairs(stats) for a, b, _ in found}
    for name, table in expected.items():
        pd.testing.assert_frame_equal(got[name].to_pandas(), table.to_pandas(), check_exact=True, obj=name)

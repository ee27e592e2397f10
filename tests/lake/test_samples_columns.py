"""lake/samples.py builds a call's sample rows as whole columns: the rows must be those of the
per-row definition in docs/dump-format.md ("Samples"), computed here one row at a time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from rlprobe.frameworks.base import StagedLeaf
from rlprobe.lake.encoding import widen
from rlprobe.errors import ProbeError
from rlprobe.lake.samples import (OccurrenceCounter, call_identity, row_hashes, sample_table,
                                   sample_tables_of_calls)


@dataclass
class Job:
    key: str
    index: str
    micro_step: int
    leaf: StagedLeaf | None


def _leaf(array: np.ndarray, dtype: str | None = None) -> StagedLeaf:
    return StagedLeaf(dtype or array.dtype.name, array.shape, array)


def _call(rng: np.random.Generator, n: int, micro: int) -> list[Job]:
    bf16 = (rng.standard_normal((n, 3)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    floats = rng.standard_normal((n, 8)).astype(np.float32)
    floats[0, 1] = np.nan
    return [
        Job("prompts", "", micro, _leaf(rng.integers(0, 50, (n, 5)))),
        Job("responses", "", micro, _leaf(rng.integers(0, 50, (n, 4)).astype(np.int32))),
        Job("log_prob", "", micro, _leaf(floats)),
        Job("entropies", "", micro, _leaf(rng.standard_normal((n, 8)).astype(np.float32))),  # stacked with log_prob
        Job("ref", "", micro, _leaf(bf16, "bfloat16")),
        Job("mask", "", micro, _leaf(rng.integers(0, 2, (n, 8)).astype(bool))),
        Job("empty_rows", "", micro, _leaf(np.zeros((n, 0), np.float32))),
        Job("pair", "0", micro, _leaf(rng.standard_normal(n))),
        Job("loss", "", micro, _leaf(np.array(0.5))),  # not a batch tensor: no rows
        Job("other_batch", "", micro, _leaf(np.zeros((n + 1, 2)))),  # another leading size: no rows
        Job("not_computed", "", micro, None),
    ]


def _expected_rows(jobs: list[Job], ids: np.ndarray, step: int, seen: dict, text=None, groups=None) -> list[dict]:
    rows = []
    n = len(ids)
    for job in jobs:
        leaf = job.leaf
        if leaf is None or len(leaf.shape) == 0 or leaf.shape[0] != n:
            continue
        for r in range(n):
            raw_row = leaf.raw[r:r + 1]
            values = widen(leaf.raw, leaf.dtype).reshape(n, -1)[r].astype(np.float64)
            occurrence = seen.get((job.key, job.index, int(ids[r])), 0)
            seen[(job.key, job.index, int(ids[r]))] = occurrence + 1
            rows.append({
                "key": job.key, "index": job.index, "step": step, "micro_step": job.micro_step, "row": r,
                "sample": int(ids[r:r + 1].view(np.int64)[0]), "sample_id": None if text is None else text[r],
                "occurrence": occurrence, "group_id": None if groups is None else groups[r], "dtype": leaf.dtype,
                "row_numel": values.size, "row_hash": int(row_hashes(raw_row).view(np.int64)[0]),
                "row_sum": float(values.sum()) if values.size else None,
                "row_min": float(values.min()) if values.size else None,
                "row_max": float(values.max()) if values.size else None,
            })
    return rows


def _same(actual: list[dict], expected: list[dict]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        for name, value in e.items():
            got = a[name]
            if name.startswith("row_") and name != "row_numel" and name != "row_hash":
                if value is None:
                    assert got is None or np.isnan(got), (name, a)
                    continue
                assert (np.isnan(value) and np.isnan(got)) or got == value, (name, got, value)
            else:
                assert got == value, (name, got, value)


def test_columns_equal_the_per_row_definition_and_occurrences_count_across_calls():
    rng = np.random.default_rng(7)
    counter, seen = OccurrenceCounter(), {}
    for micro in range(3):  # the same prompts again: their next occurrences
        jobs = _call(rng, 6, micro) if micro == 0 else _call(np.random.default_rng(7), 6, micro)
        identity = call_identity([(j.key, j.index, None if j.leaf is None else j.leaf.shape) for j in jobs],
                                 None, None, "test")
        ids = row_hashes(jobs[0].leaf.raw)
        table = sample_table(identity, jobs, 4, counter)
        _same(table.to_pylist(), _expected_rows(jobs, ids, 4, seen))
    assert max(r["occurrence"] for r in table.to_pylist()) == 2


def test_explicit_ids_and_groups_and_keys_with_different_histories():
    rng = np.random.default_rng(3)
    counter, seen = OccurrenceCounter(), {}
    first = _call(rng, 4, 0)[:3]
    second = _call(rng, 4, 1)[1:5]  # "responses" and "log_prob" saved before, "entropies" and "ref" not
    for jobs, sample_ids in ((first, [10, 11, 12, 13]), (second, [12, 13, 14, 15])):
        identity = call_identity([(j.key, j.index, j.leaf.shape) for j in jobs], sample_ids, ["g0", "g0", "g1", "g1"],
                                 "test")
        table = sample_table(identity, jobs, 0, counter)
        _same(table.to_pylist(), _expected_rows(jobs, identity.explicit, 0, seen, [str(i) for i in sample_ids],
                                                ["g0", "g0", "g1", "g1"]))


def test_calls_worked_out_together_count_occurrences_through_steps_and_batches():
    """The writer takes a commit's calls in one go (capture/key_data_rows.py): occurrences counted
    in one pass over several calls and steps, and on from the previous batch when its last step
    goes on, are those of the per-row definition, call after call."""
    counter, seen, rows, expected = OccurrenceCounter(), {}, [], []
    batches = [[(2, 0, [5, 6, 7]), (2, 1, [7, 8, 9]), (3, 0, [1, 2, 3])], [(3, 1, [3, 1, 4]), (3, 2, None)]]
    for batch in batches:
        calls = []
        for step, micro, sample_ids in batch:
            jobs = _call(np.random.default_rng(step + (micro > 1)), 3, micro)  # prompts repeat: derived ids repeat
            if micro == 1:  # a key saved before in the step beside keys that were not
                jobs = jobs[2:5]
            identity = call_identity([(j.key, j.index, None if j.leaf is None else j.leaf.shape) for j in jobs],
                                     None if sample_ids is None else np.array(sample_ids), None, "t")
            ids = row_hashes(jobs[0].leaf.raw) if sample_ids is None else row_hashes(
                np.array(sample_ids, np.int64).reshape(-1, 1))
            if seen.get("step") != step:
                seen.clear()
                seen["step"] = step
            expected += _expected_rows(jobs, ids, step, seen, None if sample_ids is None else
                                       [str(i) for i in sample_ids])
            calls.append((identity, jobs, step))
        for table in sample_tables_of_calls(calls, counter):
            rows += table.to_pylist()
    _same(rows, expected)
    assert max(r["occurrence"] for r in rows) >= 1


def test_a_new_step_starts_the_occurrences_again_and_an_empty_batch_has_no_rows():
    rng = np.random.default_rng(5)
    counter = OccurrenceCounter()
    jobs = _call(rng, 3, 0)
    identity = call_identity([(j.key, j.index, None if j.leaf is None else j.leaf.shape) for j in jobs], None, None, "t")
    sample_table(identity, jobs, 0, counter)
    assert set(sample_table(identity, jobs, 1, counter).column("occurrence").to_pylist()) == {0}
    empty = [Job("prompts", "", 0, _leaf(np.zeros((0, 4), np.int64)))]
    identity = call_identity([("prompts", "", (0, 4))], None, None, "t")
    assert sample_table(identity, empty, 0, counter).num_rows == 0


@pytest.mark.parametrize("size", [1, 300_000])  # stacked, and one large tensor worked on alone
def test_large_and_small_tensors_give_the_same_rows(size):
    rng = np.random.default_rng(11)
    jobs = [Job("prompts", "", 0, _leaf(rng.integers(0, 9, (4, 2)))),
            Job("a", "", 0, _leaf(rng.standard_normal((4, size)))),
            Job("b", "", 0, _leaf(rng.standard_normal((4, size))))]
    identity = call_identity([(j.key, j.index, j.leaf.shape) for j in jobs], None, None, "t")
    table = sample_table(identity, jobs, 0, OccurrenceCounter())
    _same(table.to_pylist(), _expected_rows(jobs, row_hashes(jobs[0].leaf.raw), 0, {}))


def _rows(table) -> str:
    """The rows exactly, NaN equal to NaN (repr of a float round-trips)."""
    return repr(table.to_pylist())


def test_calls_worked_out_together_give_each_call_its_own_rows():
    """The writer works out the calls of several steps at once: each call's slice is the table
    the call alone gives, occurrences counted through the calls in order, steps kept apart."""
    calls = []
    plan = ((0, 0, 1, None), (0, 1, 1, [7, 8, 9, 10]), (0, 2, 1, None), (1, 0, 1, None), (1, 1, 3, [1, 2, 3, 4]))
    for step, micro, seed, ids in plan:
        jobs = _call(np.random.default_rng(seed), 4, micro)
        identity = call_identity([(j.key, j.index, None if j.leaf is None else j.leaf.shape) for j in jobs],
                                 ids, None if ids is None else ["a", "a", "b", "b"], "t")
        calls.append((identity, jobs, step))
    together = sample_tables_of_calls(calls, OccurrenceCounter())
    alone_counter = OccurrenceCounter()
    for (identity, jobs, step), table in zip(calls, together):
        assert _rows(table) == _rows(sample_table(identity, jobs, step, alone_counter))
    assert max(together[2].column("occurrence").to_pylist()) == 1  # the first call's prompts again
    assert set(together[3].column("occurrence").to_pylist()) == {0}  # a new step counts again


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_integer_id_arrays_give_what_the_same_ids_as_a_list_give(kind):
    """Integer ids are checked on the training thread and written out by the writer (resolve):
    the same rows as the ids given as a list; a later change of the caller's tensor is not seen."""
    jobs = _call(np.random.default_rng(4), 4, 0)
    keys = [(j.key, j.index, None if j.leaf is None else j.leaf.shape) for j in jobs]
    ids, groups = np.array([5, -3, 1 << 40, 0]), np.array([0, 0, 1, 1], np.int32)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        ids, groups = torch.from_numpy(ids), torch.from_numpy(groups)
    fast = call_identity(keys, ids, groups, "t")
    listed = call_identity(keys, [5, -3, 1 << 40, 0], [0, 0, 1, 1], "t")
    ids[0] = 99  # the caller reuses its tensor
    assert fast.resolve().explicit_text == listed.explicit_text == ["5", "-3", "1099511627776", "0"]
    assert fast.groups == listed.groups == ["0", "0", "1", "1"]
    assert np.array_equal(fast.explicit, listed.explicit)
    assert _rows(sample_table(fast, jobs, 0, OccurrenceCounter())) == _rows(sample_table(listed, jobs, 0,
                                                                                         OccurrenceCounter()))


def test_repeated_integer_ids_are_refused_naming_the_id():
    jobs = _call(np.random.default_rng(4), 4, 0)
    keys = [(j.key, j.index, None if j.leaf is None else j.leaf.shape) for j in jobs]
    with pytest.raises(ProbeError, match="sample_ids holds '3' more than once"):
        call_identity(keys, np.array([1, 3, 2, 3]), None, "t")
    with pytest.raises(ProbeError, match="group_ids has 3 ids but the batch has 4 rows"):
        call_identity(keys, np.array([1, 2, 3, 4]), np.array([0, 0, 1]), "t")

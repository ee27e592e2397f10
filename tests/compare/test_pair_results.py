"""rlprobe/comparison/pair_results.py: the kernel's results of many pairs as the table key_data.sql joins."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rlprobe.comparison.pair_results import PairResults, pair_results_table

_METRICS = {"numel": 4, "equal_count": 3, "first_mismatch_index": 2, "max_abs_err": 0.5, "max_rel_err": 0.25,
            "within_1e3_count": 3, "within_1e2_count": 4, "cosine": 0.9, "nan_mismatch_count": 0}


def _results() -> PairResults:
    results = PairResults([0, 1, 2])
    results.put(0, _METRICS)
    results.put(1, {"error": "b/x.npy: truncated"})
    results.put(2, dict(_METRICS, first_mismatch_index=None, cosine=None, numel=0))
    return results


@pytest.mark.parametrize("as_table", [False, True])
def test_files_join_each_pair_by_its_id(as_table):
    """`files` as a list of (file_a, file_b) or as the table tensor_pairs.sql returns (row i: pair i) give
    the same table; a dict of results in another order still gets each pair's own files."""
    files = [("a/x.npy", "b/x.npy"), ("a/y.npy", "b/y.npy"), ("a/z.npy", "b/z.npy")]
    given = pa.table({"file_a": [a for a, _ in files], "file_b": [b for _, b in files]}) if as_table else files
    table = pair_results_table(_results(), given)
    assert table["file_a"].to_pylist() == ["a/x.npy", "a/y.npy", "a/z.npy"]
    assert table["file_b"].to_pylist() == ["b/x.npy", "b/y.npy", "b/z.npy"]
    assert table.schema.field("file_a").type == pa.string()
    assert table["error"].to_pylist() == [None, "b/x.npy: truncated", None]
    assert table["first_mismatch_index"].to_pylist() == [2, None, None]
    assert table["cosine"].to_pylist() == [0.9, None, None]

    shuffled = {2: dict(_METRICS, numel=7), 0: _METRICS}  # a custom executor's dict, another order
    table = pair_results_table(shuffled, given)
    assert table["pair_id"].to_pylist() == [2, 0]
    assert table["file_a"].to_pylist() == ["a/z.npy", "a/x.npy"]
    assert table["numel"].to_pylist() == [7, 4]


def test_no_pairs_give_an_empty_table_with_the_file_columns():
    empty = pa.table({"file_a": pa.array([], pa.string()), "file_b": pa.array([], pa.string())})
    for files in ([], empty):
        table = pair_results_table({}, files)
        assert table.num_rows == 0 and table.column_names[-2:] == ["file_a", "file_b"]

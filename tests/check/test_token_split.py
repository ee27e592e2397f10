"""A single large pair is cut into row ranges so that both kernel threads work; the tables equal
those of one uncut kernel job."""

from __future__ import annotations

import numpy as np
import pytest

import rlprobe
from rlprobe.checks.inputs import stats_table
from rlprobe.checks.token_tables import (
    MIN_PIECE,
    pairs,
    split_rows,
    tensor_rows,
    token_tables,
)
from rlprobe.lake.reader import open_dump


def one_large_pair(path, rows=6, width=MIN_PIECE // 2):
    rng = np.random.default_rng(5)
    old = -rng.random((rows, width), dtype=np.float32) * 4
    rollout = old + rng.normal(0, 0.01, old.shape).astype(np.float32)
    mask = rng.random(old.shape) > 0.3
    with rlprobe.Probe(path, flush_interval=0) as p:
        p.save({"rollout_log_prob": rollout, "old_log_prob": old, "response_mask": mask})
        p.step()
    return open_dump(path)


def test_one_large_pair_is_split_and_its_tables_equal_the_uncut_job(tmp_path):
    dump = one_large_pair(tmp_path / "d")
    stats = stats_table(dump)
    (part,) = pairs(tensor_rows(stats))
    pieces = split_rows([part], 2)
    assert [p[0].a_rows for p in pieces] == [slice(0, 3), slice(3, 6)]  # 3 rows of MIN_PIECE / 2 tokens each
    cut = token_tables(dump, stats, 0.2, workers=2)
    whole = token_tables(dump, stats, 0.2, workers=1)
    for name in ("token_hist", "token_positions", "token_probability"):
        for column in ("lo", "hi", "tokens"):
            assert cut[name][column].equals(whole[name][column]), (name, column)
    assert cut["token_sequences"].drop(["log_ratio"]).equals(whole["token_sequences"].drop(["log_ratio"]))
    assert cut["token_sequences"]["sequence"].to_pylist() == list(range(6))
    assert np.allclose(cut["token_sequences"]["log_ratio"], whole["token_sequences"]["log_ratio"], rtol=1e-12)
    a, b = cut["token_steps"].to_pylist()[0], whole["token_steps"].to_pylist()[0]
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == (pytest.approx(b[k], rel=1e-12) if isinstance(b[k], float) else b[k]), k


def test_parts_whose_mask_rows_differ_are_not_cut(tmp_path):
    dump = one_large_pair(tmp_path / "d")
    (part,) = pairs(tensor_rows(stats_table(dump)))
    flat_mask = part._replace(mask={**part.mask, "shape": [part.a["shape"][0] * part.a["shape"][1]]})
    assert split_rows([flat_mask], 2) == [[flat_mask]]
    small = part._replace(a={**part.a, "shape": [6, 100]})
    assert split_rows([small], 2) == [[small]]

"""token_tables over many (pair, step, rank): pool jobs batch several of them, a thread reuses its
figures from one to the next, and every step's rows equal those of the step reduced on its own."""

from __future__ import annotations

import numpy as np
import pytest

import rlprobe
from rlprobe.check.inputs import stats_table
from rlprobe.check.pair_part import Part
from rlprobe.check.token_kernel import reduce_pair
from rlprobe.check.token_tables import batches, token_tables
from rlprobe.lake.reader import open_dump


def many_steps(path, steps=9):
    rng = np.random.default_rng(8)
    saved = []
    with rlprobe.Probe(path, flush_interval=0) as p:
        for step in range(steps):
            old = -rng.random((3, 50 + 40 * step), dtype=np.float32) * 5
            rollout = old + rng.normal(0, 0.01 * (step + 1), old.shape).astype(np.float32)
            mask = rng.random(old.shape) > 0.2
            p.save({"rollout_log_prob": rollout, "old_log_prob": old, "response_mask": mask})
            p.step()
            saved.append((old, rollout, mask))
    return open_dump(path), saved


@pytest.mark.parametrize("workers", [1, 2])
def test_each_step_equals_its_pair_reduced_alone(tmp_path, workers):
    dump, saved = many_steps(tmp_path / "d")
    tables = token_tables(dump, stats_table(dump), 0.2, workers=workers)
    steps = tables["token_steps"].to_pylist()
    hist = tables["token_hist"].to_pandas()
    probability = tables["token_probability"].to_pandas()
    assert [r["step"] for r in steps] == list(range(len(saved)))
    for row, (old, rollout, mask) in zip(steps, saved):
        f, seq_sum, _ = reduce_pair(old, rollout, 0.2, mask)
        assert row["tokens"] == f.tokens and row["max_abs"] == f.max_abs
        assert row["mean_abs"] == pytest.approx(f.sum_abs / f.tokens, rel=1e-12)
        assert row["p95_abs"] == f.quantile(0.95)
        mine = hist[hist["step"] == row["step"]]
        assert mine["tokens"].sum() == f.tokens and len(mine) == np.count_nonzero(f.hist)
        assert sorted(mine["tokens"]) == sorted(f.hist[f.hist > 0])
        prob = probability[probability["step"] == row["step"]]
        assert list(prob["tokens"]) == list(f.prob_count[f.prob_count > 0])
        seqs = tables["token_sequences"].filter(tables["token_sequences"]["step"].to_numpy() == row["step"])
        assert seqs["log_ratio"].to_pylist() == pytest.approx(seq_sum.tolist(), rel=1e-12, abs=1e-15)


def test_batches_keep_the_order_and_even_out_the_tokens():
    part = Part("p", {"shape": [4, 100]}, {"shape": [4, 100]}, None)
    big = part._replace(a={"shape": [40, 100]})
    pieces = [(i, [big if i == 0 else part]) for i in range(12)]
    found = batches(pieces, 4)
    assert [key for batch in found for key, _ in batch] == list(range(12))
    assert 2 <= len(found) <= 4 and [key for key, _ in found[0]] == [0]  # the large piece is a job of its own
    assert batches(pieces[:3], 8) == [[p] for p in pieces[:3]]
    assert batches([], 4) == []

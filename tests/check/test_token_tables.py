"""token_tables over many (pair, step, rank): pool jobs batch several of them, a thread reuses its
figures from one to the next, and every step's rows equal those of the step reduced on its own."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import rlprobe
from rlprobe.checks import token_batch
from rlprobe.checks.compiled import reduce_pair
from rlprobe.checks.inputs import stats_table
from rlprobe.checks.token_figures import TABLE_BITS
from rlprobe.checks.token_rows import Part
from rlprobe.checks.token_tables import batches, token_tables
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
        merged = f.hist.reshape(-1, 1 << TABLE_BITS).sum(axis=1)  # the table's bins: the kernel's, 8 summed
        assert mine["tokens"].sum() == f.tokens and len(mine) == np.count_nonzero(merged)
        assert sorted(mine["tokens"]) == sorted(merged[merged > 0])
        prob = probability[probability["step"] == row["step"]]
        assert list(prob["tokens"]) == list(f.prob_count[f.prob_count > 0])
        seqs = tables["token_sequences"].filter(tables["token_sequences"]["step"].to_numpy() == row["step"])
        assert seqs["log_ratio"].to_pylist() == pytest.approx(seq_sum.tolist(), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("small", [True, False])
def test_the_histogram_rows_count_the_tokens_between_their_edges_in_numpy(tmp_path, monkeypatch, small):
    """token_hist: per step the masked Δ (as float32) in [lo, hi) (Δ >= 0) or (lo, hi] (Δ < 0), every
    row filled, 8 bins an octave (32 rows at most in the octave of 2^-7 to 2^-6 with both signs)."""
    dump, saved = many_steps(tmp_path / "d")
    if not small:
        monkeypatch.setattr(token_batch, "SMALL", -1)  # every key through reduce_pair and PairFigures
    hist = token_tables(dump, stats_table(dump), 0.2, workers=2)["token_hist"].to_pandas()
    for step, (old, rollout, mask) in enumerate(saved):
        d = (rollout - old)[mask]
        mine = hist[hist["step"] == step]
        assert (mine["tokens"] > 0).all() and mine["tokens"].sum() == d.size
        for lo, hi, tokens in zip(mine["lo"], mine["hi"], mine["tokens"]):
            inside = (d >= lo) & (d < hi) & ~np.signbit(d) if hi > 0 else (d > lo) & (d <= hi) & np.signbit(d)
            assert np.count_nonzero(inside) == tokens, (step, lo, hi)
        near, far = np.minimum(mine["lo"].abs(), mine["hi"].abs()), np.maximum(mine["lo"].abs(), mine["hi"].abs())
        assert ((near >= 2.0 ** -7) & (far <= 2.0 ** -6)).sum() <= 16


def test_batches_keep_the_order_and_even_out_the_tokens():
    part = Part("p", {"shape": [4, 100]}, {"shape": [4, 100]}, None)
    big = part._replace(a={"shape": [40, 100]})
    pieces = [(i, [big if i == 0 else part]) for i in range(12)]
    found = batches(pieces, 4)
    assert [key for batch in found for key, _ in batch] == list(range(12))
    assert 2 <= len(found) <= 4 and [key for key, _ in found[0]] == [0]  # the large piece is a job of its own
    assert batches(pieces[:3], 8) == [[p] for p in pieces[:3]]
    assert batches([], 4) == []


def mixed_steps(path):
    """Steps of two save calls (two pairs a key), the on-policy pair, a step without a mask, one
    masked out whole, non-finite log-probs, an integer mask, float64 log-probs, and a step whose
    rollout rows pair by sample."""
    rng = np.random.default_rng(11)
    with rlprobe.Probe(path, flush_interval=0) as p:
        for step in range(7):
            for micro in range(2):
                old = -rng.random((4, 30 + 7 * step), dtype=np.float32) * 5
                batch = {"rollout_log_prob": old + rng.normal(0, 0.02, old.shape).astype(np.float32),
                         "old_log_prob": old}
                if step != 2:
                    batch["response_mask"] = np.zeros(old.shape, bool) if step == 3 else rng.random(old.shape) > 0.3
                if step == 4:
                    batch["rollout_log_prob"][1, :3] = [np.nan, np.inf, -np.inf]
                if step == 5:  # an integer mask: not read straight into the batch
                    batch["response_mask"] = batch["response_mask"].astype(np.int64) * 3
                if step == 6:  # float64 log-probs: their job goes one call a pair
                    batch = {k: v.astype(np.float64) if k != "response_mask" else v for k, v in batch.items()}
                if micro == 0:
                    batch["log_prob"] = old + rng.normal(0, 1e-4, old.shape).astype(np.float32)
                p.save(batch)
            p.step()
        ids = np.arange(6)
        trainer = -rng.random((6, 20), dtype=np.float32)
        p.save({"rollout_log_prob": trainer + 0.01, "response_mask": rng.random((6, 20)) > 0.2}, sample_ids=ids)
        order = rng.permutation(6)
        for chunk in np.array_split(order, 2):
            p.save({"old_log_prob": trainer[chunk]}, sample_ids=ids[chunk])
        p.step()
    return open_dump(path)


@pytest.mark.parametrize("workers", [1, 2])
def test_small_pairs_in_one_kernel_call_give_the_tables_of_one_call_a_pair(tmp_path, monkeypatch, workers):
    dump = mixed_steps(tmp_path / "d")
    batched = token_tables(dump, stats_table(dump), 0.2, workers=workers)
    monkeypatch.setattr(token_batch, "SMALL", -1)  # every key through reduce_pair and PairFigures
    alone = token_tables(dump, stats_table(dump), 0.2, workers=workers)
    steps = alone["token_steps"].to_pylist()
    assert {r["pair"] for r in steps} == {"rollout_vs_old", "on_policy"} and len(steps) == 15
    assert [r["tokens"] for r in steps if r["step"] == 3] == [0, 0] and any(r["nonfinite"] for r in steps)
    assert alone["token_sequences"].num_rows > 60
    for name, table in alone.items():
        assert table.schema == batched[name].schema, name
        pd.testing.assert_frame_equal(batched[name].to_pandas(), table.to_pandas(), check_exact=True, obj=name)

"""Rollout vs trainer when the rollout and the shuffled update micro-batches are different save
calls (TRL's layout): rows paired by save(sample_ids=...), figures recomputed with numpy."""

from __future__ import annotations

import numpy as np
import pytest

import rlprobe


def shuffled_run(path, rng, steps=2, rows=8, width=6, micro=2, old=False):
    """Per step: one rollout call (all rows, ids, groups), then `micro` update calls of shuffled rows.
    Returns, per step, the rollout rows, the trainer rows and the mask, aligned by sample."""
    expected = []
    with rlprobe.Probe(path, flush_interval=0) as probe:
        for step in range(steps):
            ids = np.arange(rows) + step * rows
            trainer = -rng.random((rows, width), dtype=np.float32) * 3
            rollout = trainer + rng.normal(0, 0.05, trainer.shape).astype(np.float32)
            mask = rng.random((rows, width)) < 0.7
            adv = np.repeat(rng.normal(size=rows // 2), 2).astype(np.float32)
            adv[1::2] *= -1
            probe.save({"rollout_log_prob": rollout, "response_mask": mask, "advantages": adv},
                       sample_ids=ids, group_ids=ids // 2)
            order = rng.permutation(rows)
            for chunk in np.array_split(order, micro):
                key = "old_log_prob" if old else "log_prob"
                probe.save({key: trainer[chunk], "loss": np.float32(1.0)}, sample_ids=ids[chunk])
            expected.append((rollout, trainer, mask))
            probe.step()
    return expected


@pytest.mark.parametrize("old", [False, True])
def test_rollout_rows_pair_with_the_shuffled_trainer_rows_of_the_same_sample(tmp_path, old):
    expected = shuffled_run(tmp_path / "d", np.random.default_rng(3), old=old)
    result = rlprobe.check(tmp_path / "d", max_mean_abs_delta=1.0, max_outside_share=1.0, max_abs_delta=10.0)
    check = {r["check"]: r for r in result.results.to_pylist()}
    assert check["rollout_vs_recompute"]["status"] == "pass", check["rollout_vs_recompute"]
    steps = result.tables["token_steps"].to_pylist()
    pair = "rollout_vs_old" if old else "rollout_vs_log_prob"
    assert [(r["pair"], r["step"]) for r in steps] == [(pair, 0), (pair, 1)]
    for row, (rollout, trainer, mask) in zip(steps, expected):
        delta = (rollout.astype(np.float64) - trainer.astype(np.float64))[mask]
        assert row["tokens"] == delta.size and row["masked"]
        assert row["mean_delta"] == pytest.approx(delta.mean(), rel=1e-9, abs=1e-12)
        assert row["mean_abs"] == pytest.approx(np.abs(delta).mean(), rel=1e-9)
        assert row["max_abs"] == pytest.approx(np.abs(delta).max(), rel=1e-9)
        share = np.mean((np.exp(delta) < 0.8) | (np.exp(delta) > 1.2))
        assert row["outside_share"] == pytest.approx(share)
    # per sequence: Σ Δ over the masked tokens of each trainer row, whatever the shuffle
    seq = result.tables["token_sequences"].to_pylist()
    rollout, trainer, mask = expected[0]
    got = sorted(round(r["log_ratio"], 9) for r in seq if r["step"] == 0)
    want = sorted(round(float(((rollout - trainer.astype(np.float64)) * mask).sum(axis=1)[i]), 9) for i in range(8))
    assert got == pytest.approx(want, abs=1e-6)
    # the same dump fails at the default thresholds (Δ sd 0.05 is far beyond 0.001)
    assert rlprobe.check(tmp_path / "d").exit_code == 1


def test_groups_come_from_save_group_ids(tmp_path):
    shuffled_run(tmp_path / "d", np.random.default_rng(4))
    result = rlprobe.check(tmp_path / "d")
    groups = result.tables["group_advantages"].to_pylist()
    assert {g["group_source"] for g in groups} == {"save(group_ids=...)"}
    assert {g["sequences"] for g in groups} == {2} and len(groups) == 8
    assert {r["check"]: r["status"] for r in result.results.to_pylist()}["grpo_advantages"] == "pass"

"""The PPO example's `--replay-from BASELINE` (examples/ppo/tiny_ppo.py, docs/replay.md): the run
consumes the baseline's prompts, responses and rewards, so a fault of its trainer is named at its
own step although its sampled tokens would have parted earlier (issue 41, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import rlprobe
from ppo_runs import REPO, train
from rlprobe.demo import example_dir

FAULTS = ["sampling-seed@1", "advantage-bug@2"]  # tokens part at step 1; the trainer's fault is at step 2
STEPS = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppo_replay")
    baseline = train(root / "baseline", **{"ppo.steps": STEPS})
    sampled = train(root / "sampled", FAULTS, **{"ppo.steps": STEPS})
    # the replayed run through the command line, as a user starts it
    done = subprocess.run([sys.executable, str(example_dir() / "tiny_ppo.py"), "--out", str(root / "replayed"),
                           "--replay-from", str(baseline), "--set", f"ppo.steps={STEPS}",
                           *[a for f in FAULTS for a in ("--fault", f)]],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return {"baseline": baseline, "sampled": sampled, "replayed": root / "replayed"}


def same(a, b, key: str, step: int, micro: int) -> bool:
    return np.array_equal(rlprobe.open(a).tensor(key, step, 0, micro), rlprobe.open(b).tensor(key, step, 0, micro))


def test_replayed_responses_and_rewards_are_the_baseline_s_at_every_step(runs):
    for step in range(STEPS):
        for micro in range(2):
            for key in ("prompts", "responses", "rewards", "rollout_log_prob", "old_log_prob"):
                assert same(runs["baseline"], runs["replayed"], key, step, micro), (key, step, micro)
            # without replay the other sampling seed parts the tokens from step 1 on
            assert same(runs["baseline"], runs["sampled"], "responses", step, micro) == (step == 0), (step, micro)


def test_with_replay_the_fault_planted_at_step_2_is_named_at_step_2(runs, tmp_path):
    replayed = rlprobe.compare(runs["baseline"], runs["replayed"], tmp_path / "replayed")
    first = replayed["first_divergence"]
    assert (first["key"], first["step"]) == ("advantages", 2)
    assert "the advantage computation" in replayed["suspect"]
    sampled = rlprobe.compare(runs["baseline"], runs["sampled"], tmp_path / "sampled")
    assert (sampled["first_divergence"]["key"], sampled["first_divergence"]["step"]) == ("responses", 1)


def test_the_replayed_run_records_its_baseline(runs):
    record = rlprobe.open(runs["replayed"]).manifest["replay_from"]
    assert record == {"path": str(runs["baseline"].resolve()), "run_id": rlprobe.open(runs["baseline"]).manifest["run_id"]}
    assert "replay_from" not in rlprobe.open(runs["sampled"]).manifest


def test_a_fault_from_a_later_step_leaves_the_earlier_steps_clean(runs):
    # advantage-bug@2 (with replay: the same tokens): advantages equal at steps 0 and 1, not at step 2
    assert [same(runs["baseline"], runs["replayed"], "advantages", s, 0) for s in range(STEPS)] == [True, True, False]

"""The main job: each planted fault in the tiny PPO run leads rlprobe to the right conclusion."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq

import rlprobe
from rlprobe.demo import example_dir, run_demo


def demo(fault, tmp_path):
    return run_demo(fault, tmp_path / fault, steps=2, say=lambda _: None)


def test_ref_bf16_points_at_the_reference_forward_and_its_first_layer(tmp_path):
    r = demo("ref-bf16", tmp_path)
    first = r["key_data"]["first_divergence"]
    assert (first["key"], first["step"]) == ("ref_log_prob", 0)
    assert "reference model's forward" in r["key_data"]["suspect"]
    mod = r["modules"]["module_first_divergence"]
    assert mod["stage"] == "reference_compute_log_prob" and mod["step"] == 0
    assert mod["module"] == "embed" and mod["io"] == "output" and mod["inputs_match"] is True
    assert "first diverging module: embed" in r["chain"][-1]


def test_nondeterministic_layer_is_named(tmp_path):
    r = demo("nondeterministic", tmp_path)
    first = r["key_data"]["first_divergence"]
    assert (first["key"], first["step"]) == ("old_log_prob", 0)
    assert "not deterministic" in r["key_data"]["suspect"]
    recompute = r["key_data"]["on_policy_recompute"]
    assert "B" in recompute and recompute.keys() <= {"A", "B"}
    # the baseline recomputes bit for bit where this CPU's kernels round both batch shapes alike, else
    # within float32 rounding (docs/check.md, "Agreement is rounding, not bitwise equality")
    assert all(row["within_tolerance"] for row in recompute.get("A", []))
    mod = r["modules"]["module_first_divergence"]
    assert mod["stage"] == "actor_compute_log_prob"
    assert mod["module"] == "layers.1.mlp.fc2" and mod["inputs_match"] is True  # the planted layer


def test_advantage_bug_is_not_a_model(tmp_path):
    r = demo("advantage-bug", tmp_path)
    first = r["key_data"]["first_divergence"]
    assert (first["key"], first["step"]) == ("advantages", 0)
    assert "not a model" in r["key_data"]["suspect"] and r["modules"] is None
    rows = pq.read_table(tmp_path / "advantage-bug" / "compare" / "key_data.parquet").to_pylist()
    for key in ("responses", "rewards", "values", "old_log_prob", "ref_log_prob", "kl"):
        assert {x["status"] for x in rows if x["key"] == key and x["step"] == 0} == {"match"}, key


def test_sampling_seed_points_at_rollout_sampling(tmp_path):
    r = demo("sampling-seed", tmp_path)
    first = r["key_data"]["first_divergence"]
    assert (first["key"], first["step"]) == ("responses", 0)
    assert "rollout sampling" in r["key_data"]["suspect"] and r["modules"] is None


def test_learning_rate_change_shows_after_the_first_update(tmp_path):
    r = demo("lr", tmp_path)
    first = r["key_data"]["first_divergence"]
    assert (first["key"], first["step"]) == ("responses", 1)
    assert "the update of step 0 differs for model 'actor'" in r["key_data"]["suspect"]  # parameter fingerprints
    out = tmp_path / "lr" / "compare"
    rows = pq.read_table(out / "key_data.parquet").to_pylist()
    assert {x["status"] for x in rows if x["step"] == 0} == {"match"}  # all key data of step 0
    grad_steps = pq.read_table(out / "grad_steps.parquet").to_pylist()
    step0 = [g for g in grad_steps if g["step"] == 0]
    assert {g["monitor"] for g in step0} == {"actor", "critic"} and not any(g["flagged"] for g in step0)
    actor = next(g for g in step0 if g["monitor"] == "actor")  # level L1: sign maps compared bit for bit
    assert actor["weighted_similarity"] == 1.0  # ... and so are its gradients
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gates"] and summary["gates"][0]["passed"] is False


def test_ppo_example_runs_on_two_gloo_ranks(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # --standalone: the rendezvous takes a free port, so parallel test workers or other runs never collide
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(example_dir() / "tiny_ppo.py"), "--out", str(tmp_path / "ddp"), "--set", "ppo.steps=1"],
                   check=True, env=env, capture_output=True, cwd=tmp_path)
    d = rlprobe.open(tmp_path / "ddp")
    assert d.complete and sorted(d.rank_manifests) == [0, 1]
    ranks = {r["rank"] for r in d.arrow("key_data").to_pylist() if r["key"] == "responses"}
    assert ranks == {0, 1}


def test_demo_command_from_any_folder(tmp_path):
    """`rlprobe demo` with its default, relative output folder, run from a folder that is not the
    checkout (the README's first command runs it from wherever the user is)."""
    proc = subprocess.run([sys.executable, "-m", "rlprobe.cli", "demo", "--fault", "advantage-bug", "--steps", "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "advantages" in proc.stdout and (tmp_path / "rlprobe_demo" / "compare" / "summary.md").exists()

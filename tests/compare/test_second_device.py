"""A comparison across devices names the fault a comparison on one device names, and noise alone is
"no divergence beyond rounding" (issue 41). Run A is the PPO example on this CPU; run B the same run
on the second device of tests/second_device.py (every nn.Linear accumulated in float64: about one
float32 ulp apart), clean or with a planted fault. The expected key, step and suspect of each fault
are those the one-device tests assert (tests/test_demo.py, tests/compare/test_single_run_verdict.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

import rlprobe
from ppo_runs import train
from second_device import train_on_second_device

# two steps (the lr and stale-weights faults show at step 1), with everything the example captures:
# gradients (the actor's sign maps, the critic's digests), parameter fingerprints, and module dumps with
# tensors and weights of the actor's and the reference's forwards and of the actor's update, in every run
# alike, so the configs agree
STAGES = ["reference_compute_log_prob", "actor_compute_log_prob", "actor_update"]
SETTINGS = {"ppo.steps": 2, "rlprobe_config.stages": STAGES, "rlprobe_config.tensors": True}
FAULTS = ("advantage-bug", "ref-bf16", "sampling-seed", "lr", "rollout-bf16", "stale-rollout-weights",
          "nondeterministic")
# a fault from step 1 on: the GAE bug after a clean step
LATER = ("advantage-bug@1",)
# tokens that part under noise alone: other sampling draws from step 1 stand for a draw that straddled a
# probability the second device's rounding moved (a real flip is too rare to meet in a cheap run), with the
# trainer on noise only; at temperature 0.1 many draws still pick the same first tokens, which both runs share
COLD = {**SETTINGS, "ppo.temperature": 0.1}
# fault -> (key, step, words of the suspect) of the first divergence on one device
EXPECTED = {
    "advantage-bug": ("advantages", 0, "not a model"),
    "ref-bf16": ("ref_log_prob", 0, "reference model's forward"),
    "sampling-seed": ("responses", 0, "rollout sampling"),
    "lr": ("responses", 1, "the update of step 0 differs for model 'actor'"),  # the fingerprints' wording
    "rollout-bf16": ("responses", 0, "run B's rollout engine disagrees with its trainer"),
    "stale-rollout-weights": ("responses", 1, "run B's rollout engine disagrees with its trainer"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("second_device")
    made = {"one": train(root / "one", None, **SETTINGS), "noise": train_on_second_device(root / "noise", None, **SETTINGS)}
    for fault in FAULTS + LATER:
        made[fault] = train_on_second_device(root / fault, fault, **SETTINGS)
    # the lr fault with the baseline's rollout: step 1's actor forward sees the same tokens with other weights
    made["lr-replayed"] = train_on_second_device(root / "lr-replayed", "lr", **SETTINGS,
                                                 **{"rlprobe_config.replay_from": str(made["one"])})
    made["lr on one device"] = train(root / "lr_one", "lr", **SETTINGS)
    made["cold"] = train(root / "cold", None, **COLD)
    made["cold, sampling-seed@1"] = train_on_second_device(root / "cold_seed", "sampling-seed@1", **COLD)
    made["actor_lr changed"] = train_on_second_device(root / "actor_lr", None, **SETTINGS, **{"ppo.actor_lr": 0.003})
    return made


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rlprobe.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_noise_alone_is_no_divergence_beyond_rounding(runs, tmp_path):
    out = tmp_path / "out"
    proc = _cli("compare", runs["one"], runs["noise"], "-o", out, "--quiet", "--fail-on-diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no divergence beyond rounding" in proc.stdout
    assert "first difference, within rounding: 'rollout_log_prob', step 0" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"] is None and summary["module_first_divergence"] is None
    first = summary["first_difference"]
    assert (first["key"], first["step"], first["status"]) == ("rollout_log_prob", 0, "close")
    assert 0 < first["norm_rel_err"] < first["rtol"] == 2.0**-23 * 128  # float32's default
    assert summary["counts"].get("close", 0) > 0 and set(summary["counts"]) <= {"match", "close"}
    modules = pq.read_table(out / "modules.parquet").to_pylist()
    assert {r["stage"] for r in modules} == set(STAGES)
    assert {r["status"] for r in modules} <= {"match", "close"} and "close" in {r["status"] for r in modules}
    # gradients, fingerprints and the weights at the module dumps: rounding, none of them a divergence
    assert summary["grad_first_flagged"] is None and summary["param_first_difference"] is None
    assert summary["module_weights_first_difference"] is None
    for table in ("params", "module_weights"):
        statuses = {r["status"] for r in pq.read_table(out / f"{table}.parquet").to_pylist()}
        assert statuses == {"match", "close"}, table  # the weights after update 0 differ in their last bits
    grads = pq.read_table(out / "grads.parquet").to_pylist()
    assert not any(g["flagged"] for g in grads)
    # the measured case: a qkv bias (its key part has a gradient of zero but for rounding) agrees in sign on
    # fewer than 0.97 of its elements; its norm, max and min agree within rounding, so it is not flagged
    qkv = [g for g in grads if g["param"].endswith("attn.qkv.bias") and g["step"] == 0 and g["monitor"] == "actor"]
    assert min(g["similarity"] for g in qkv) < 0.97
    assert {g["rounding"] for g in qkv if g["similarity"] < 1} == {"statistics within rounding"}
    rows = pq.read_table(out / "key_data.parquet").to_pylist()
    # tokens are exact and equal: the sampling did not part under noise in two steps
    assert {r["status"] for r in rows if r["key"] in ("prompts", "responses")} == {"match"}
    # the noise uses a tenth of its tolerance at most (measured: 0.055 at most, pg_loss; kl_loss's 1.2e-05 of
    # its own magnitude is 2.6e-08 absolute, within the floor atol)
    tolerance = {k["key"]: (k["rtol"], k["atol"]) for k in summary["keys"]}  # the per-key table's
    assert tolerance["advantages"] == (2.0**-16, 2.0**-20) and tolerance["responses"] == (0.0, 0.0)
    used = [r["max_abs_err"] / (tolerance[r["key"]][1] + tolerance[r["key"]][0] * max(
            abs(r["min_a"]), abs(r["max_a"]), abs(r["min_b"]), abs(r["max_b"]))) for r in rows if r["status"] == "close"]
    assert used and max(used) < 0.1
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "no divergence beyond rounding" in md and "| close |" in md
    assert summary["amplification"] is None and summary["error_jump"] is None and summary["parting"] is None


def test_bitwise_gate_and_bitwise_tolerance_see_the_noise(runs, tmp_path):
    proc = _cli("compare", runs["one"], runs["noise"], "-o", tmp_path / "o", "--quiet", "--fail-on-diff",
                "--rtol", "0", "--atol", "0")
    assert proc.returncode == 1 and "first divergence: rollout_log_prob at step 0" in proc.stdout
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())  # gradients and weights alike
    assert summary["grad_first_flagged"]["step"] == 0 and summary["param_first_difference"]["step"] == 0
    assert summary["module_weights_first_difference"]["step"] == 1  # the weights after update 0


def test_weights_that_differ_at_a_forward_are_named_not_its_first_module(runs, tmp_path):
    """The lr fault with the baseline's rollout replayed: step 1's actor forward gets the same tokens,
    every module's output differs with equal inputs, and the weights are what differs."""
    summary = rlprobe.compare(runs["one"], runs["lr-replayed"], tmp_path / "out", reports=False)
    module = summary["module_first_divergence"]
    assert (module["stage"], module["step"], module["module"], module["inputs_match"]) == \
        ("actor_compute_log_prob", 1, "embed", True)
    assert (module["weights"]["parameter"], module["weights"]["status"]) == ("embed.weight", "differs")
    assert summary["module_suspect"].startswith(
        "the weights of 'actor' differ at step 1 (first parameter 'embed.weight'")
    assert "computation diverges" not in summary["module_suspect"]
    # the key data's verdict names the update that left those weights, as on one device
    assert "the update of step 0 differs for model 'actor' (first parameter 'embed.weight'" in summary["suspect"]
    rows = pq.read_table(tmp_path / "out" / "module_weights.parquet").to_pylist()
    assert {r["status"] for r in rows if r["step"] == 0} <= {"match", "close"}  # step 0's weights: rounding


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_each_fault_on_the_second_device_is_named_as_on_one_device(runs, tmp_path, fault):
    key, step, words = EXPECTED[fault]
    summary = rlprobe.compare(runs["one"], runs[fault], tmp_path / "out", reports=False)
    first = summary["first_divergence"]
    assert (first["key"], first["step"]) == (key, step), first
    assert first["status"] not in ("close", "stats_only_close")
    assert words in summary["suspect"], summary["suspect"]
    rows = pq.read_table(tmp_path / "out" / "key_data.parquet").to_pylist()
    assert {r["status"] for r in rows if r["step"] < step} <= {"match", "close"}  # noise before the fault


def test_the_advantage_bug_differs_by_more_than_one_while_its_inputs_differ_by_rounding(runs, tmp_path):
    rlprobe.compare(runs["one"], runs["advantage-bug"], tmp_path / "out", reports=False)
    rows = pq.read_table(tmp_path / "out" / "key_data.parquet").to_pylist()
    step0 = [r for r in rows if r["step"] == 0]
    for key in ("responses", "rewards", "values", "old_log_prob", "ref_log_prob", "kl", "token_level_rewards"):
        assert {r["status"] for r in step0 if r["key"] == key} <= {"match", "close"}, key
    assert max(r["max_abs_err"] for r in step0 if r["key"] == "advantages") > 0.5


def test_a_model_in_bfloat16_is_named_as_a_coarser_dtype_and_its_first_module(runs, tmp_path):
    summary = rlprobe.compare(runs["one"], runs["ref-bf16"], tmp_path / "out", reports=False)
    assert "one run computes it in a coarser dtype (bfloat16 or float16) than float32" in \
        summary["first_divergence"]["message"]
    module = summary["module_first_divergence"]  # as on one device (tests/test_demo.py)
    assert (module["stage"], module["step"], module["module"], module["io"]) == \
           ("reference_compute_log_prob", 0, "embed", "output")
    assert module["inputs_match"] is True


def test_a_nondeterministic_reduction_is_rounding_and_named_only_as_a_note(runs, tmp_path):
    """A reduction order that changes per call differs by rounding only: across devices no divergence,
    and the advice names the run whose actor recomputes its log-probs not bit for bit."""
    summary = rlprobe.compare(runs["one"], runs["nondeterministic"], tmp_path / "out", reports=False)
    assert summary["first_divergence"] is None and summary["first_difference"]["status"] == "close"
    assert "of run B recomputes its log-probs on-policy not bit for bit" in summary["advice"]


def test_a_tight_tolerance_still_names_the_advantage_computation_where_its_error_jumps(runs, tmp_path):
    """With --rtol far under the noise, log-probs, rewards and values are beyond tolerance too: the first
    divergence is the first of them, yet the advantages' error is 1e6 times their inputs': the suspect."""
    summary = rlprobe.compare(runs["one"], runs["advantage-bug"], tmp_path / "out", reports=False,
                              rtol=1e-9, atol=0)
    first = summary["first_divergence"]
    assert first["step"] == 0 and first["key"] != "advantages" and first["norm_rel_err"] < 1e-6
    rows = pq.read_table(tmp_path / "out" / "key_data.parquet").to_pylist()
    for key in ("rewards", "values", "old_log_prob"):  # the advantages' inputs: beyond this tolerance too
        assert "mismatch" in {r["status"] for r in rows if r["step"] == 0 and r["key"] == key}, key
    amplification = summary["amplification"]
    assert (amplification["key"], amplification["step"]) == ("advantages", 0)
    assert amplification["ratio"] > 1e3 and amplification["upstream_error"] < 1e-6 < 0.5 < amplification["error"]
    assert "the error of advantages jumps at step 0" in summary["suspect"]
    assert "-> the advantage computation (GAE or group normalisation), not a model" in summary["suspect"]
    assert f"the first divergence beyond tolerance, {first['key']} at step 0" in summary["suspect"]
    # the default tolerance: the same key, now the first divergence and its own amplification point
    summary = rlprobe.compare(runs["one"], runs["advantage-bug"], tmp_path / "default", reports=False)
    assert summary["first_divergence"]["key"] == summary["amplification"]["key"] == "advantages"
    assert "advantages diverges first at step 0" in summary["suspect"]


def test_a_fault_planted_at_a_later_step_is_named_where_the_errors_jump(runs, tmp_path):
    summary = rlprobe.compare(runs["one"], runs["advantage-bug@1"], tmp_path / "out", reports=False)
    jump = summary["error_jump"]
    assert jump["step"] == 1 and jump["ratio"] > 1e3 and jump["previous_error"] < 1e-6
    assert "errors jump at step 1" in summary["advice"]
    assert (summary["first_divergence"]["key"], summary["first_divergence"]["step"]) == ("advantages", 1)
    # a tolerance under the noise puts the first divergence at step 0; the jump names step 1's advantages
    tight = rlprobe.compare(runs["one"], runs["advantage-bug@1"], tmp_path / "tight", reports=False,
                            rtol=1e-9, atol=0)
    assert tight["first_divergence"]["step"] == 0 and tight["error_jump"]["step"] == 1
    assert (tight["amplification"]["key"], tight["amplification"]["step"]) == ("advantages", 1)
    assert "the error of advantages jumps at step 1" in tight["suspect"] and "not a model" in tight["suspect"]


def test_responses_that_part_under_noise_are_named_as_sampling(runs, tmp_path):
    out = tmp_path / "out"
    proc = _cli("compare", runs["cold"], runs["cold, sampling-seed@1"], "-o", out, "--quiet")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["suspect"].startswith(
        "responses differ from step 1 (sampling under rounding noise: every earlier key is within rounding); "
        "replay the baseline's rollout to compare the trainer past it")
    assert "responses differ from step 1 (sampling under rounding noise" in proc.stdout
    parting = summary["parting"]
    assert (parting["step"], parting["cause"]) == (1, "sampling")
    # the tokens before each sample's first differing one, scored by the rollout engine in both runs: rounding
    (evidence,) = parting["evidence"]
    assert "the policy's log-probs of the tokens both runs share at step 1 (rollout_log_prob" in evidence
    assert "<= their tolerance" in evidence
    assert {"advantages", "rewards", "old_log_prob"} <= set(parting["consequences"])
    assert "replay run A's rollout in run B" in summary["advice"] and "as the consequence of the other tokens" in \
        summary["advice"]
    assert summary["error_jump"]["consequence_of"] == "responses at step 1"


def test_an_update_that_differs_parts_the_responses_by_the_update_not_by_sampling(runs, tmp_path):
    """The lr fault on the second device: every earlier key is within rounding and the tokens part at step 1 as
    under sampling noise, but the policy's log-probs of the tokens both runs still share differ beyond rounding."""
    summary = rlprobe.compare(runs["one"], runs["lr"], tmp_path / "out", reports=False)
    parting = summary["parting"]
    assert (parting["step"], parting["cause"]) == (1, "update")
    shared = [e for e in parting["evidence"] if "the policy's log-probs of the tokens both runs share at step 1" in e]
    assert shared and "> their tolerance" in shared[0], parting["evidence"]
    # the run fingerprints its parameters too: the suspect is the update the fingerprints name
    assert "the update of step 0 differs for model 'actor'" in summary["suspect"], summary["suspect"]
    assert "sampling under rounding noise" not in summary["suspect"]
    # on one device every earlier key matches bitwise: no noise to sample under, the update
    one = rlprobe.compare(runs["one"], runs["lr on one device"], tmp_path / "one", reports=False)
    assert one["parting"] is None
    assert "the update of step 0 differs for model 'actor'" in one["suspect"], one["suspect"]  # its fingerprints
    # a changed optimizer setting in the config diff is evidence too
    changed = rlprobe.compare(runs["one"], runs["actor_lr changed"], tmp_path / "changed", reports=False)
    assert changed["parting"]["cause"] == "update"
    assert any("ppo.actor_lr" in e for e in changed["parting"]["evidence"])
    assert changed["suspect"].startswith("config: learning rate changed: ppo.actor_lr: A=0.001, B=0.003 -> ")


def test_noise_keeps_every_key_near_its_inputs_error(runs, tmp_path):
    """The amplification rule's premise: under noise a key's error is of the size of its inputs' (measured: 8 at
    most, a KL), far under the factor; the planted faults reach 1e4 and more."""
    import duckdb

    from rlprobe.comparison.amplification import AMPLIFICATION, KeyErrors, against_inputs

    ratios = {}
    for name in ("noise", "advantage-bug", "ref-bf16"):
        rlprobe.compare(runs["one"], runs[name], tmp_path / name, reports=False)
        con = duckdb.connect()
        con.register("key_data", pq.read_table(tmp_path / name / "key_data.parquet"))
        errors = KeyErrors(con, [0, 1])
        assert sorted(errors.per_step) == [0, 1]
        found = [(against_inputs(r, errors.at(step)), r) for step in (0, 1) for r in errors.at(step).values()]
        ratios[name] = {(r["step"], r["key"]): f["ratio"] for f, r in found if f is not None}
    assert ratios["noise"] and max(ratios["noise"].values()) < AMPLIFICATION / 10
    assert ratios["advantage-bug"][(0, "advantages")] > 10 * AMPLIFICATION
    assert ratios["ref-bf16"][(0, "ref_log_prob")] > 10 * AMPLIFICATION


def test_fingerprints_of_an_update_that_differs_part_the_responses_by_the_update(tmp_path):
    """Tokens that share nothing at step 1 (other draws) give no log-prob evidence; the actor's fingerprints,
    which differ after step 0's update (the lr fault), do: parting by the update, not by sampling."""
    fingerprints = {**SETTINGS, "rlprobe_config.param_fingerprints": True}
    a = train(tmp_path / "a", None, **fingerprints)
    b = train_on_second_device(tmp_path / "b", ["sampling-seed@1", "lr"], **fingerprints)
    summary = rlprobe.compare(a, b, tmp_path / "out", reports=False)
    assert (summary["first_divergence"]["key"], summary["first_divergence"]["step"]) == ("responses", 1)
    parting = summary["parting"]
    assert (parting["step"], parting["cause"]) == (1, "update")
    assert parting["evidence"][-1].startswith("the parameter fingerprints of model 'actor' differ after the update "
                                              "of step 0")
    assert "sampling under rounding noise" not in summary["suspect"]
    assert "the update of step 0 differs for model 'actor'" in summary["suspect"]

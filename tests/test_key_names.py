"""The one table of trainers' key names (rlprobe/key_names.csv): capture, check and compare read a saved
key one way, OpenRLHF's ambiguous `action_log_probs` is decided as the table says, and a user's key_map
reaches the single-run rules of a comparison too. Real dumps, real comparisons."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlprobe
import rlprobe.checks
from rlprobe.key_names import canonical_names, rows, sample_id_keys


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("RLPROBE_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _run(path: Path, steps: list[dict]) -> Path:
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        for values in steps:
            probe.save(values)
            probe.step()
    return path


def _lp(shift: float = 0.0) -> np.ndarray:
    return (np.linspace(-3.0, -0.5, 20, dtype=np.float32) + np.float32(shift)).reshape(4, 5)


def test_a_name_has_one_canonical_key_unless_its_rows_say_when():
    seen: dict[str, list[dict]] = {}
    for row in rows():
        seen.setdefault(row["name"], []).append(row)
    for name, found in seen.items():
        defaults = [r for r in found if not r["when_saved"]]
        assert len({r["canonical"] for r in defaults}) == 1, name  # TRL's and verl's rows never disagree
        assert found[-1]["when_saved"] == "", f"{name}: the default row comes last"
    # the entries that were in only one of the old tables (check's, compare's) are in the one table
    table = canonical_names()
    assert {k: table[k] for k in ("per_token_kl", "entropys", "entropies", "kl_penalty", "completion_mask",
                                  "old_log_probe", "scores", "action_mask")} == {
        "per_token_kl": "kl", "entropys": "entropy", "entropies": "entropy", "kl_penalty": "kl",
        "completion_mask": "response_mask", "old_log_probe": "old_log_prob", "scores": "rewards",
        "action_mask": "response_mask"}
    assert sample_id_keys() == ("prompts", "input_ids", "prompt_token_ids", "queries", "query_ids", "prompt_ids")


def test_openrlhf_action_log_probs_is_decided_by_the_keys_saved_beside_it():
    assert canonical_names(["action_log_probs", "base_action_log_probs"])["action_log_probs"] == "old_log_prob"
    assert canonical_names(["action_log_probs"])["action_log_probs"] == "old_log_prob"
    loss = canonical_names(["action_log_probs", "old_action_log_probs"])
    assert (loss["action_log_probs"], loss["old_action_log_probs"]) == ("log_prob", "old_log_prob")
    assert canonical_names(["action_log_probs", "old_action_log_probs"],
                           {"action_log_probs": "old_log_prob"})["action_log_probs"] == "old_log_prob"  # a map wins


def test_the_experience_is_read_as_old_log_prob_by_check_and_compare_alike(tmp_path):
    """Check's old table read action_log_probs as log_prob, compare's as old_log_prob: one verdict read
    the key two ways. Now both read the Experience's log-probs as the rollout-time old_log_prob."""
    experience = {"action_log_probs": _lp(), "base_action_log_probs": _lp(-0.1), "rollout_log_probs": _lp()}
    a = _run(tmp_path / "a", [experience, experience])
    b = _run(tmp_path / "b", [experience, {**experience, "action_log_probs": _lp(0.25)}])
    summary = rlprobe.compare(a, b, tmp_path / "o")
    assert summary["suspect"].startswith("action_log_probs (as old_log_prob) diverges first at step 1")
    steps = rlprobe.checks.check_dump(b, only=("rollout_vs_recompute",)).tables["token_steps"].to_pylist()
    assert {r["pair"] for r in steps} == {"rollout_vs_old"}
    assert [round(r["max_abs"], 4) for r in sorted(steps, key=lambda r: r["step"])] == [0.0, 0.25]
    assert set(summary["rollout_vs_trainer"]) == {"B"}  # the comparison's single-run rule reads it so too


def test_the_loss_inputs_read_action_log_probs_as_the_current_log_prob(tmp_path):
    loss = {"action_log_probs": _lp(), "old_action_log_probs": _lp()}
    a = _run(tmp_path / "a", [loss])
    b = _run(tmp_path / "b", [{**loss, "action_log_probs": _lp(0.5)}])
    summary = rlprobe.compare(a, b, tmp_path / "o")
    assert summary["suspect"].startswith("action_log_probs (as log_prob) diverges first at step 0")
    result = rlprobe.checks.check_dump(b, only=("on_policy",))
    assert result.results["status"].to_pylist() == ["fail"]  # log_prob != old_log_prob where on-policy
    assert [r["step"] for r in summary["on_policy_recompute"]["B"]] == [0] and "A" not in summary["on_policy_recompute"]


def test_a_key_map_reaches_the_single_run_rules_of_the_comparison(tmp_path):
    """--key-map my_lp=log_prob made compare read my_lp as log_prob while its single-run rules (check's
    table) did not know the name: now the on-policy rule reads it too."""
    a = _run(tmp_path / "a", [{"my_lp": _lp(), "my_old": _lp()}])
    b = _run(tmp_path / "b", [{"my_lp": _lp(0.5), "my_old": _lp()}])
    summary = rlprobe.compare(a, b, tmp_path / "o", key_map={"my_lp": "log_prob", "my_old": "old_log_prob"})
    assert summary["suspect"].startswith("my_lp (as log_prob) diverges first at step 0")
    assert [r["step"] for r in summary["on_policy_recompute"]["B"]] == [0]
    assert rlprobe.compare(a, b, tmp_path / "p")["on_policy_recompute"] == {}  # without the map: no rule applies


def test_a_prompt_key_of_the_table_gives_samples_in_capture_and_is_read_as_prompts_in_compare(tmp_path):
    responses = np.ones((2, 3), np.int64)
    a = _run(tmp_path / "a", [{"queries": np.arange(8).reshape(2, 4), "responses": responses}])
    b = _run(tmp_path / "b", [{"queries": np.arange(8).reshape(2, 4) + 1, "responses": responses}])
    samples = rlprobe.open(a).arrow("sample")  # capture: the table's sample_id keys identify the samples
    assert sorted(set(samples["key"].to_pylist())) == ["queries", "responses"] and samples.num_rows == 4
    summary = rlprobe.compare(a, b, tmp_path / "o")
    assert summary["suspect"].startswith("queries (as prompts) diverges first at step 0")

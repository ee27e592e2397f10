"""Trainers' key names (rlprobe/comparison/key_aliases.py), the KL penalty rule and what the verdict
says after a module dump was compared (rlprobe/comparison/modules.py), on real dumps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.comparison.key_aliases import builtin_rows, key_order_table, parse_key_map
from rlprobe.comparison.modules import follow_up
from rlprobe.errors import ProbeError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("RLPROBE_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _run(path: Path, values: dict) -> Path:
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save(values)
        probe.step()
    return path


BATCH = {"prompt_ids": np.arange(8).reshape(2, 4), "completion_ids": np.arange(6).reshape(2, 3),
         "ref_per_token_logps": np.full((2, 3), -1.0, np.float32)}


def test_trl_names_get_the_canonical_rule_and_keep_the_saved_name(tmp_path):
    a = _run(tmp_path / "a", BATCH)
    b = _run(tmp_path / "b", {**BATCH, "ref_per_token_logps": np.full((2, 3), -1.5, np.float32)})
    summary = rlprobe.compare(a, b, tmp_path / "o")
    assert summary["first_divergence"]["key"] == "ref_per_token_logps"
    assert summary["suspect"].startswith("ref_per_token_logps (as ref_log_prob) diverges first at step 0")
    assert "(prompts, responses identical) -> the reference model's forward" in summary["suspect"]
    assert summary["next_config"]["rlprobe_config"]["stages"] == ["reference_compute_log_prob"]
    assert summary["warnings"] == []


def test_key_map_names_a_key_of_the_data_flow_and_without_it_a_warning(tmp_path):
    a = _run(tmp_path / "a", {"my_lp": np.zeros(3, np.float32)})
    b = _run(tmp_path / "b", {"my_lp": np.ones(3, np.float32)})
    plain = rlprobe.compare(a, b, tmp_path / "plain")
    assert "the code that produces 'my_lp'" in plain["suspect"]
    assert plain["warnings"][0].startswith("no saved key is in rlprobe's data flow (saved: my_lp)")
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "-o", str(tmp_path / "m"), "--quiet",
                                       "--key-map", "my_lp=log_prob"])
    assert result.exit_code == 0, result.output
    assert "my_lp (as log_prob) diverges first" in result.output and "the actor's forward during the update" in \
        result.output
    assert "no saved key is in rlprobe's data flow" not in result.output
    plain_cli = CliRunner().invoke(main, ["compare", str(a), str(b), "-o", str(tmp_path / "p"), "--quiet"])
    assert "warning: no saved key is in rlprobe's data flow" in plain_cli.output
    bad = CliRunner().invoke(main, ["compare", str(a), str(b), "-o", str(tmp_path / "x"), "--key-map", "my_lp"])
    assert bad.exit_code == 2 and "expected SAVED=CANONICAL" in bad.output


def test_key_map_errors_name_the_entry():
    with pytest.raises(ProbeError, match=r"key_map: a=logprobz: 'logprobz' is not a key of the data flow"):
        parse_key_map({"a": "logprobz"}, "key_map:")
    assert parse_key_map(["old_log_probs=old_log_prob"]) == {"old_log_probs": "old_log_prob"}


def test_the_builtin_table_covers_every_trainer_and_a_user_map_wins():
    trainers = {r["trainer"] for r in builtin_rows()}
    assert trainers == {"TRL", "verl", "OpenRLHF", "MindSpeed-RL", "any"}  # any: spellings of every trainer
    order = {n: c for n, c in zip(*(key_order_table()[col].to_pylist() for col in ("name", "canonical")))}
    assert order["old_per_token_logps"] == "old_log_prob" and order["base_action_log_probs"] == "ref_log_prob"
    assert order["rollout_log_probs"] == "rollout_log_prob" and order["old_log_probs"] == "old_log_prob"
    remapped = {n: c for n, c in zip(*(key_order_table(key_map={"rewards": "token_level_scores"})[col].to_pylist()
                                       for col in ("name", "canonical")))}
    assert remapped["rewards"] == "token_level_scores"


def test_kl_penalty_with_identical_inputs_points_at_the_coefficient(tmp_path):
    base = {"kl": np.full(3, 0.1, np.float32), "token_level_scores": np.array([0, 0, 1], np.float32),
            "token_level_rewards": np.array([-0.005, -0.005, 0.995], np.float32)}
    a = _run(tmp_path / "a", base)
    b = _run(tmp_path / "b", {**base, "token_level_rewards": np.array([-0.01, -0.01, 0.99], np.float32)})
    summary = rlprobe.compare(a, b, tmp_path / "o")
    assert summary["first_divergence"]["key"] == "token_level_rewards"
    assert "(token_level_scores, kl identical) -> the KL penalty's application" in summary["suspect"]
    assert "KL coefficient" in summary["advice"] and "capture the inputs" not in summary["advice"]
    # without kl captured the advice is to capture it
    c = _run(tmp_path / "c", {k: v for k, v in base.items() if k != "kl"})
    d = _run(tmp_path / "d", {"token_level_scores": base["token_level_scores"],
                              "token_level_rewards": np.array([-0.01, -0.01, 0.99], np.float32)})
    summary = rlprobe.compare(c, d, tmp_path / "o2")
    assert summary["advice"].startswith("capture kl as key data too")


def test_a_compared_module_dump_is_not_advised_again_and_a_matching_model_is_fine(tmp_path):
    """Two real module dumps (examples/ppo, critic_compute_values at step 0) that match everywhere."""
    from rlprobe.demo import load_config, load_example_module

    example = load_example_module()
    cfg = {"ppo.steps": 1, "rlprobe_config.stages": ["critic_compute_values"], "rlprobe_config.step_end": 0}
    a = example.train(load_config(cfg), str(tmp_path / "a"))
    b = example.train(load_config(cfg), str(tmp_path / "b"))
    tables, summary = _compare_dumps(a, b)
    assert summary["module_first_divergence"] is None and tables["modules"].num_rows > 0
    advised = {"suspect": "values diverges first at step 0 -> the critic's forward (value estimates)",
               "advice": "dump the critic's modules for this step",
               "next_config": {"rlprobe_config": {"stages": ["critic_compute_values"], "step_start": 0}}}
    follow_up(advised, tables["modules"])
    assert advised["next_config"] is None and advised["model_fine"] == {"stage": "critic_compute_values", "step": 0}
    assert "every module of the model in critic_compute_values at step 0 matches" in advised["suspect"]
    assert advised["advice"].startswith("the model of critic_compute_values computes the same from the same inputs")
    elsewhere = {"suspect": "s", "advice": "dump", "next_config": {"rlprobe_config": {
        "stages": ["critic_compute_values"], "step_start": 3}}}
    follow_up(elsewhere, tables["modules"])  # step 3 was not dumped: the advice stands
    assert elsewhere["advice"] == "dump" and elsewhere["next_config"] is not None


def _compare_dumps(a, b):
    from rlprobe.comparison.run import compare_dumps
    from rlprobe.lake.reader import open_dump

    return compare_dumps(open_dump(a), open_dump(b))

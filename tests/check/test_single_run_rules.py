"""Each check's rule on small dumps written here with rlprobe.Probe (numpy values): what it names,
when it is not applicable, statistics-only dumps, msprobe dumps and unreadable ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.errors import DumpReadError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msprobe"


def statuses(result) -> dict[str, str]:
    return {r["check"]: r["status"] for r in result.results.to_pylist()}


def write(path: Path, steps: list[list[dict]], config: dict | None = None, **probe_kwargs) -> Path:
    """A dump: steps[s] is the list of save() calls of step s."""
    with rlprobe.Probe(path, flush_interval=0, **probe_kwargs) as probe:
        if config is not None:
            probe.save_config(config)
        for calls in steps:
            for call in calls:
                probe.save(call)
            probe.step()
    return path


def logp(seed: int, shape=(4, 6)) -> np.ndarray:
    return -np.random.default_rng(seed).random(shape, dtype=np.float32) * 3


def test_a_planted_nan_is_named_by_key_step_rank_micro_step_index_and_element(tmp_path):
    clean = {"advantages": np.zeros((4, 6), np.float32), "loss": np.float32(0.5)}
    bad = np.zeros((4, 6), np.float32)
    bad[2, 3] = np.nan
    dump = write(tmp_path / "d", [[clean, clean], [clean, clean], [clean, {"advantages": [np.ones(2), bad]}]])
    result = rlprobe.check(dump)
    assert result.exit_code == 1 and statuses(result)["nonfinite"] == "fail"
    first = next(r for r in result.results.to_pylist() if r["check"] == "nonfinite")["first"]
    assert "name=advantages, step=2, rank=0, micro_step=1, index=1, nan_count=1" in first
    assert first.endswith("element=(2, 3)")


def test_a_nan_loss_fails_loss_finite_and_names_the_scalar(tmp_path):
    with rlprobe.Probe(tmp_path / "d", flush_interval=0) as probe:
        for step, value in enumerate([1.0, float("inf")]):
            probe.log_metrics({"actor/pg_loss": value})
            probe.step()
    result = rlprobe.check(tmp_path / "d")
    assert statuses(result)["loss_finite"] == "fail"
    assert result.rows["loss_finite"].to_pylist()[0]["name"] == "actor/pg_loss"
    assert result.rows["loss_finite"].to_pylist()[0]["step"] == 1


def test_checks_whose_keys_are_absent_are_not_applicable_not_errors(tmp_path):
    dump = write(tmp_path / "d", [[{"responses": np.arange(12).reshape(3, 4), "old_log_prob": None}]])
    result = rlprobe.check(dump)
    assert result.exit_code == 0
    got = statuses(result)
    assert got.pop("nonfinite") == "pass"
    assert set(got.values()) == {"not_applicable"}
    notes = {r["check"]: r["note"] for r in result.results.to_pylist()}
    assert notes["on_policy"] == "no log_prob saved"  # old_log_prob saved as None counts as absent
    assert notes["grpo_advantages"] == "no advantages saved"


def test_on_policy_compares_the_first_micro_batch_of_generating_steps_only(tmp_path):
    a, b = logp(0), logp(1)
    steps = [[{"log_prob": a, "old_log_prob": a}, {"log_prob": b, "old_log_prob": a}],  # micro 1: after an update
             [{"log_prob": b, "old_log_prob": a}],                                     # step 1: on-policy, differs
             [{"log_prob": logp(2, (4, 7)), "old_log_prob": a}]]                       # other shapes: never compared
    result = rlprobe.check(write(tmp_path / "d", steps))
    rows = result.rows["on_policy"].to_pylist()
    assert [(r["step"], r["level"]) for r in rows] == [(1, "tokens")]
    assert rows[0]["max_abs_diff"] == pytest.approx(float(np.abs(b.astype(np.float64) - a).max()))
    # TRL generating every 2 steps (steps_per_generation 4 x num_iterations 1 / accumulation 2): step 1 reuses step 0's
    cfg = {"steps_per_generation": 4, "num_iterations": 1, "gradient_accumulation_steps": 2}
    result = rlprobe.check(write(tmp_path / "e", steps, cfg))
    assert result.info["generation_every"] == 2 and statuses(result)["on_policy"] == "pass"


def test_on_policy_tolerance_follows_the_dtype(tmp_path):
    import torch

    a = torch.tensor(logp(0))
    nudged = a + 1e-4  # within bf16's tolerance, far outside float32's
    steps = [[{"log_prob": nudged.to(torch.bfloat16), "old_log_prob": a.to(torch.bfloat16)}],
             [{"log_prob": nudged, "old_log_prob": a}]]
    result = rlprobe.check(write(tmp_path / "d", steps))
    assert [(r["step"], r["log_prob_dtype"]) for r in result.rows["on_policy"].to_pylist()] == [(1, "float32")]


def test_statistics_only_dumps_get_statistics_level_checks_and_a_note(tmp_path):
    old = logp(0)
    steps = [[{"rollout_log_prob": old, "old_log_prob": old}], [{"rollout_log_prob": old + 0.01, "old_log_prob": old}]]
    result = rlprobe.check(write(tmp_path / "d", steps, stats_only=True))
    rows = result.rows["rollout_vs_recompute"].to_pylist()
    assert [(r["step"], r["level"]) for r in rows] == [(1, "statistics")]
    assert rows[0]["mean_abs"] == pytest.approx(0.01, rel=1e-4)
    assert any("need tensors" in n for n in result.notes)
    assert statuses(result)["grpo_advantages"] == "not_applicable"


def test_grpo_advantages_per_saved_group_ids_and_per_config_group_size(tmp_path):
    adv = np.array([1.0, -1.0, 0.5, -0.5, 2.0, -1.0], np.float32)  # the last group sums to 1
    groups = np.array([0, 0, 1, 1, 2, 2])
    result = rlprobe.check(write(tmp_path / "d", [[{"advantages": adv, "group_ids": groups}]]))
    rows = result.rows["grpo_advantages"].to_pylist()
    assert [(r["group_id"], r["advantage_sum"], r["group_source"]) for r in rows] == [("2", 1.0, "saved group_ids")]
    result = rlprobe.check(write(tmp_path / "e", [[{"advantages": adv[:4]}]], {"grpo": {"num_generations": 2}}))
    assert statuses(result)["grpo_advantages"] == "pass" and result.info["group_size"] == 2
    for i, size in enumerate((0, -2, 2.5)):  # no group size: taken as -2 or 2 (rounded) before
        result = rlprobe.check(write(tmp_path / f"f{i}", [[{"advantages": adv[:4]}]], {"grpo": {"num_generations": size}}))
        assert result.info["group_size"] is None and statuses(result)["grpo_advantages"] == "not_applicable"


def test_kl_first_step_is_detected_from_equal_log_probs_without_a_declaration(tmp_path):
    a = logp(0)
    steps = [[{"old_log_prob": a, "ref_log_prob": a.copy(), "kl": np.full((4, 6), 1e-3, np.float32)}]]
    result = rlprobe.check(write(tmp_path / "d", steps))
    assert result.rows["kl_first_step"].to_pylist()[0]["reference_start"] == "detected"
    steps = [[{"old_log_prob": a, "ref_log_prob": a + 1, "kl": np.ones((4, 6), np.float32)}]]
    result = rlprobe.check(write(tmp_path / "e", steps))
    assert statuses(result)["kl_first_step"] == "not_applicable"


def test_warnings_do_not_fail_the_run(tmp_path):
    steps = [[{"entropy": np.float32(2.0), "rewards": np.float32(0.1), "kl": np.float32(0.0)}],
             [{"entropy": np.float32(0.1), "rewards": np.float32(0.9), "kl": np.float32(0.5)}]]
    result = rlprobe.check(write(tmp_path / "d", steps))
    got = statuses(result)
    assert got["entropy_collapse"] == "warn" and got["reward_up_kl_explodes"] == "warn"
    assert result.exit_code == 0


def test_an_msprobe_dump_is_checked(tmp_path):
    result = rlprobe.check(FIXTURES / "keydata" / "run_b", out=tmp_path / "o")
    got = statuses(result)
    assert result.exit_code == 0 and got["nonfinite"] == "pass" and got["loss_finite"] == "pass"
    assert got["on_policy"] == "not_applicable"


def test_an_unreadable_dump_exits_3_with_a_clear_message(tmp_path):
    r = CliRunner().invoke(main, ["check", str(tmp_path / "missing")])
    assert r.exit_code == 3 and "does not exist" in r.output
    (tmp_path / "file").write_text("x")
    r = CliRunner().invoke(main, ["check", str(tmp_path / "file")])
    assert r.exit_code == 3 and "is a file" in r.output
    dump = write(tmp_path / "d", [[{"loss": np.float32(1.0)}]])
    part = next((dump / "stats" / "key_data").rglob("*.parquet"))
    part.write_bytes(b"not parquet")
    with pytest.raises(DumpReadError, match=part.name):
        rlprobe.check(dump)
    r = CliRunner().invoke(main, ["check", str(dump)])
    assert r.exit_code == 3 and part.name in r.output


def test_only_the_named_checks_run_as_the_two_run_verdict_asks(tmp_path):
    a = logp(0)
    dump = write(tmp_path / "d", [[{"log_prob": a + 1, "old_log_prob": a, "loss": np.float32(np.nan)}]])
    result = rlprobe.checks.check_dump(dump, only=("on_policy", "rollout_vs_recompute"))
    assert statuses(result) == {"on_policy": "fail", "rollout_vs_recompute": "not_applicable"}
    assert result.rows["on_policy"].num_rows == 1
    with pytest.raises(ValueError, match="unknown check"):
        rlprobe.checks.check_dump(dump, only=("nope",))


def test_check_command_reads_keys_through_key_map(tmp_path):
    """rlprobe check --key-map reads a trainer's own names as the comparison's --key-map does: without it
    the run's my_lp/my_old are no log-probs the rules know (on_policy not applicable, exit 0)."""
    write(tmp_path / "run", [[{"my_lp": np.full((2, 3), -0.5, np.float32), "my_old": np.full((2, 3), -1.0, np.float32)}]])
    runner = CliRunner()
    plain = runner.invoke(main, ["check", str(tmp_path / "run"), "--json"])
    assert plain.exit_code == 0, plain.output
    mapped = runner.invoke(main, ["check", str(tmp_path / "run"), "--json",
                                  "--key-map", "my_lp=log_prob", "--key-map", "my_old=old_log_prob"])
    assert mapped.exit_code == 1, mapped.output
    failed = [c["check"] for c in json.loads(mapped.output)["checks"] if c["status"] == "fail"]
    assert failed == ["on_policy"]  # log_prob != old_log_prob on-policy
    bad = runner.invoke(main, ["check", str(tmp_path / "run"), "--key-map", "my_lp"])
    assert bad.exit_code == 2 and "expected SAVED=CANONICAL" in bad.output

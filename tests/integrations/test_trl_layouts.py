"""TRL GRPO under two micro-batch layouts of one global batch (gradient accumulation 4 x batch 2 against
2 x 4), captured by attach: the loss is compared as the step's value (TRL divides each micro-batch's
loss by the accumulation steps, so their sum is the step's loss) and module dumps, matched call by call,
are not compared (docs/compare.md, "Runs with different layouts")."""

from __future__ import annotations

import pytest

import rlprobe
from rlprobe.integrations.trl import summed_keys

# 2 steps, the update's module dump in both runs (its calls are micro-batches of 2 in A, 4 in B)
STEPS = {"grpo.max_steps": 2, "rlprobe_config.step_end": 1, "rlprobe_config.stages": ["actor_update"]}
FOUR_BY_TWO = {"grpo.per_device_train_batch_size": 2, "grpo.gradient_accumulation_steps": 4}  # the config: 4 x 2
WITHIN_ROUNDING = {"match", "close", "stats_only_match", "stats_only_close", "absent_in_both"}
NOTE = "module dumps not compared: the runs' micro-batch layouts differ (4 x 2 vs 2 x 4)"


@pytest.fixture(scope="module")
def compared(trl_runs, tmp_path_factory):
    a = trl_runs.get("layout_4x2", **STEPS, **FOUR_BY_TWO)
    b = trl_runs.get("layout_2x4", **STEPS)
    # a real loss fault under the other layout: an entropy bonus in the loss (0 in A), visible at step 0
    fault = trl_runs.get("layout_2x4_entropy_coef", **STEPS, **{"grpo.entropy_coef": 0.01})
    out = tmp_path_factory.mktemp("trl_layouts")
    return {"a": a, "b": b, "out": out, "same": rlprobe.compare(a, b, out / "same"),
            "fault": rlprobe.compare(a, fault, out / "fault")}


def _loss_rows(folder) -> list[dict]:
    import pyarrow.parquet as pq

    return [r for r in pq.read_table(folder / "key_data.parquet").to_pylist() if r["key"] == "loss"]


def test_grpo_declares_its_loss_summed_and_rloo_and_the_reward_trainer_do_not(compared):
    from trl import GRPOTrainer, RewardTrainer, RLOOTrainer

    assert rlprobe.open(compared["a"]).manifest["summed_keys"] == ["loss"]
    # transformers' loss_is_scaled_for_ga: GRPO scales in compute_loss, RLOO and RewardTrainer leave it to the Trainer
    assert (summed_keys(GRPOTrainer), summed_keys(RLOOTrainer), summed_keys(RewardTrainer)) == (["loss"], [], [])


def test_the_loss_is_compared_as_the_steps_sum_and_agrees(compared):
    summary = compared["same"]
    assert summary["layout"]["a"] == {"ranks": 1, "micro_batches": 4, "micro_batch_size": 2}
    assert summary["layout"]["b"] == {"ranks": 1, "micro_batches": 2, "micro_batch_size": 4}
    rows = _loss_rows(compared["out"] / "same")
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["status"] in ("stats_only_match", "stats_only_close"), r
        assert "the sum over each rank's micro-batches (summed_keys), the mean over ranks (A: 4 rows, B: 2 rows)" \
            in r["message"]
        assert r["mean_a"] == pytest.approx(r["mean_b"], rel=1e-5)
    # every key of step 0 agrees within rounding; whatever the update then makes of the rounding, the loss is
    # not blamed for a layout
    import pyarrow.parquet as pq

    step0 = {r["status"] for r in pq.read_table(compared["out"] / "same" / "key_data.parquet").to_pylist()
             if r["step"] == 0}
    assert step0 <= WITHIN_ROUNDING, step0
    first = summary["first_divergence"]
    assert first is None or (first["step"] >= 1 and first["key"] != "loss"), first
    assert "the loss computation" not in (summary["suspect"] or "")


def test_module_dumps_under_another_layout_are_not_compared(compared):
    for summary in (compared["same"], compared["fault"]):
        assert summary["layout"]["modules"] == NOTE
        assert summary["layout"]["note"].endswith("compared per sample; " + NOTE)
        assert summary["module_first_divergence"] is None and "modules" not in summary["compared"]


def test_the_console_says_module_dumps_are_not_compared(compared):
    from tests.cli_runs import cli

    code, output = cli("compare", compared["a"], compared["b"], "-o", compared["out"] / "cli")
    assert code == 0 and f"note: layout differs: A 4 micro-batches x 1 rank, B 2 x 1; compared per sample; {NOTE}" \
        in output


def test_a_loss_fault_under_another_layout_names_the_loss(compared):
    summary = compared["fault"]
    first = summary["first_divergence"]
    assert (first["key"], first["step"], first["status"]) == ("loss", 0, "stats_only_mismatch")
    assert "the loss computation for 'loss'" in summary["suspect"]
    assert "entropy_coef" in summary["suspect"]
    # the advised module dump would not be compared under these layouts: the advice says so
    assert summary["next_config"]["rlprobe_config"]["stages"] == ["actor_update"]
    assert summary["advice"].endswith("take the advised dump with both runs on one micro-batch layout")


def test_weights_that_differ_by_amplified_rounding_are_named_so_not_a_changed_update(compared):
    """Adam turns the near-zero gradients of the key biases (softmax ignores a shift of every key) and the few
    gradient elements whose sign is rounding into full steps of lr: the weights after update 0 differ beyond
    rounding in those parameters only, every solid gradient updated within rounding."""
    summary = compared["same"]
    noise = summary["update_noise"]
    assert (noise["monitor"], noise["update"], noise["probe_step"]) == ("actor", 0, 0)
    gradients = summary["param_first_difference"]["gradients"]
    assert gradients["differing"] == noise["params"] == noise["near_zero"] + noise["sign_flipped"] > 0
    assert gradients["differing_solid"] == gradients["differing_missing"] == 0
    assert noise["params"] < noise["compared"] / 2  # most parameters updated within rounding
    assert "k_proj" in noise["first_param"]
    assert "rounding noise amplified by the optimizer: after update 0 of model 'actor'" in summary["suspect"]
    assert "the update of step 0 differs" not in summary["suspect"]
    assert "the loss computation" not in summary["suspect"]
    assert "--control" in summary["advice"]
    # a real fault of the loss is still the loss at step 0, before any update
    assert summary["first_divergence"]["step"] >= 1 and compared["fault"]["update_noise"] is None

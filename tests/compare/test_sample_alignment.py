"""Runs with different layouts compared per sample (rlprobe/comparison/sample_alignment.py)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

import rlprobe
from rlprobe.comparison.run import compare_dumps
from rlprobe.errors import ProbeError
from rlprobe.lake.reader import open_dump
from ppo_runs import train, train_two_ranks

WITHIN_ROUNDING = {"match", "stats_only_match", "stats_only_close"}
TINY = {"ppo.steps": 2, "rlprobe_config.grads_dump": False, "rlprobe_config.metrics_dump": False}


def _train(out: Path, fault: str | None = None, **overrides) -> Path:
    return train(out, fault, **{**TINY, **overrides})


def _two_ranks(out: Path) -> Path:
    return train_two_ranks(out, **TINY)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    return {
        "m2": _train(root / "m2"),
        "m4": _train(root / "m4", **{"ppo.micro_batches": 4}),
        "m4_adv": _train(root / "m4_adv", "advantage-bug", **{"ppo.micro_batches": 4}),
        "m4_seed": _train(root / "m4_seed", "sampling-seed", **{"ppo.micro_batches": 4}),
        "r2": _two_ranks(root / "r2"),
    }


def _compare(a: Path, b: Path):
    return compare_dumps(open_dump(a), open_dump(b))


def _statuses(tables) -> set[str]:
    return set(tables["key_data"]["status"].to_pylist())


def test_two_vs_four_micro_batches_agree_with_a_layout_note(runs):
    tables, summary = _compare(runs["m2"], runs["m4"])
    assert summary["first_divergence"] is None
    assert summary["layout"]["per_sample"] is True
    assert summary["layout"]["note"] == ("layout differs: A 2 micro-batches x 1 rank, B 4 x 1; "
                                         "compared per sample")
    assert _statuses(tables) <= WITHIN_ROUNDING
    # per-micro-batch scalars as their step value: the example backpropagates loss / micro_batches, so the mean
    losses = [r for r in tables["key_data"].to_pylist() if r["key"] in ("loss", "pg_loss", "vf_loss", "kl_loss")]
    assert len(losses) == 4 * 2
    for r in losses:
        assert "the mean over every rank and micro-batch (A: 2 rows, B: 4 rows)" in r["message"]
        assert r["mean_a"] == pytest.approx(r["mean_b"], rel=1e-5, abs=1e-7)
    # per sample: 16 samples a step for each batch key, e.g. responses
    rows = tables["key_data"].filter(np.array(tables["key_data"]["key"].to_pylist()) == "responses")
    assert rows.num_rows == 2 * 16
    assert summary["pairs_compared"] > 0  # step 1's values differ in rounding: gathered from the .npy files


def test_one_vs_two_ranks_agree(runs):
    tables, summary = _compare(runs["m2"], runs["r2"])
    assert summary["layout"]["a"] == {"ranks": 1, "micro_batches": 2, "micro_batch_size": 8}
    assert summary["layout"]["b"] == {"ranks": 2, "micro_batches": 2, "micro_batch_size": 4}
    assert summary["first_divergence"] is None, summary["first_divergence"]
    assert _statuses(tables) <= WITHIN_ROUNDING


def test_a_planted_fault_is_found_across_layouts(runs):
    tables, summary = _compare(runs["m2"], runs["m4_adv"])
    first = summary["first_divergence"]
    assert (first["key"], first["step"], first["status"]) == ("advantages", 0, "mismatch")
    assert not _statuses(tables) & {"shape_mismatch", "only_in_a", "only_in_b"}


def test_a_sampling_fault_stays_responses_differ(runs):
    tables, summary = _compare(runs["m2"], runs["m4_seed"])
    first = summary["first_divergence"]
    assert (first["key"], first["step"], first["status"]) == ("responses", 0, "mismatch")
    assert not _statuses(tables) & {"shape_mismatch", "only_in_a", "only_in_b"}  # prompts identify samples


def test_equal_layouts_keep_row_matching(runs):
    tables, summary = _compare(runs["m2"], runs["m2"])
    assert summary["layout"]["per_sample"] is False and summary["layout"]["note"] is None
    assert summary["first_divergence"] is None
    assert tables["key_data"].num_rows == open_dump(runs["m2"]).arrow("key_data").num_rows  # a row per saved row


# -- capture ---------------------------------------------------------------------------------
def _grpo(path: Path, order: list[int], micro: int, stats_only: bool = False, bump: float = 0.0) -> Path:
    """A GRPO-like step: 3 prompts x 2 generations, saved in `order` over `micro` calls."""
    prompts = np.repeat(np.arange(12, dtype=np.int64).reshape(3, 4), 2, axis=0)
    logp = (np.arange(6 * 5, dtype=np.float32).reshape(6, 5) - 7) / 3
    logp[5, 0] += bump
    with rlprobe.Probe(path, framework="numpy", stats_only=stats_only) as probe:
        for chunk in np.array_split(np.asarray(order), micro):
            probe.save({"prompts": prompts[chunk], "log_prob": logp[chunk], "loss": np.float32(1.0)})
        probe.step()
    return path


def test_repeated_prompts_are_told_apart_by_occurrence(tmp_path):
    a = _grpo(tmp_path / "a", list(range(6)), 2)
    b = _grpo(tmp_path / "b", list(range(6)), 3)
    samples = open_dump(a).arrow("sample").to_pandas()
    logp = samples[samples.key == "log_prob"].sort_values(["micro_step", "row"])
    assert logp.occurrence.tolist() == [0, 1, 0, 1, 0, 1]  # the second generation of each prompt
    assert logp["sample"].nunique() == 3
    tables, summary = _compare(a, b)
    assert summary["layout"]["per_sample"] and summary["first_divergence"] is None
    c = _grpo(tmp_path / "c", list(range(6)), 3, bump=1.0)  # generation 2 of prompt 3 differs
    _, summary = _compare(a, c)
    assert summary["first_divergence"]["key"] == "log_prob"
    assert "#2" in summary["first_divergence"]["message"]


def test_statistics_only_dumps_are_aligned_by_row_statistics(tmp_path):
    a = _grpo(tmp_path / "a", list(range(6)), 2, stats_only=True)
    b = _grpo(tmp_path / "b", list(range(6)), 3, stats_only=True)
    tables, summary = _compare(a, b)
    assert summary["first_divergence"] is None and summary["layout"]["per_sample"]
    assert _statuses(tables) == {"stats_only_match"}
    c = _grpo(tmp_path / "c", list(range(6)), 3, stats_only=True, bump=1e-3)
    _, summary = _compare(a, c)
    assert summary["first_divergence"]["status"] == "stats_only_mismatch"


def test_explicit_sample_ids_align_a_shuffled_order(tmp_path):
    values = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    order = list(range(8))
    random.Random(0).shuffle(order)
    for name, rows in (("a", list(range(8))), ("b", order)):
        with rlprobe.Probe(tmp_path / name, framework="numpy") as probe:
            for chunk in (rows[:4], rows[4:]):
                probe.save({"values": values[chunk]}, sample_ids=[f"s{i}" for i in chunk],
                           group_ids=[str(i // 2) for i in chunk])
            probe.step()
    tables, summary = _compare(tmp_path / "a", tmp_path / "b")
    assert summary["first_divergence"] is None
    assert "sit at another rank, micro-batch or row in B" in summary["layout"]["note"]
    samples = open_dump(tmp_path / "b").arrow("sample").to_pandas()
    assert sorted(samples.sample_id) == [f"s{i}" for i in range(8)]
    assert dict(zip(samples.sample_id, samples.group_id))["s5"] == "2"


def test_bad_sample_ids_are_refused_naming_the_call_and_keep_earlier_data(tmp_path):
    with rlprobe.Probe(tmp_path / "d", framework="numpy") as probe:
        probe.save({"prompts": np.zeros((2, 3), np.int64)})
        probe.step()
        with pytest.raises(ProbeError, match=r"rank 0 step 1: sample_ids has 3 ids but key 'prompts' has 4 rows"):
            probe.save({"prompts": np.zeros((4, 3), np.int64)}, sample_ids=[1, 2, 3])
        with pytest.raises(ProbeError, match=r"step 1: sample_ids holds '7' more than once in this call"):
            probe.save({"x": np.zeros((3, 2))}, sample_ids=[7, 8, 7])
        with pytest.raises(ProbeError, match=r"step 1: sample_ids has 2 ids but no tensor of this call has 2 rows "
                                             r"\(leading dimensions: 'x': 3\)"):
            probe.save({"x": np.zeros((3, 2))}, sample_ids=[1, 2])
        with pytest.raises(ProbeError, match=r"step 1: group_ids has 1 ids but the batch has 3 rows"):
            probe.save({"x": np.zeros((3, 2))}, sample_ids=[1, 2, 3], group_ids=["g"])
        with pytest.raises(ProbeError, match=r"step 1: save\(group_ids=...\) needs sample_ids"):
            probe.save({"x": np.zeros((3, 2))}, group_ids=["g", "g", "h"])
        with pytest.raises(ProbeError, match=r"sample_ids\[1\] is float 2.5; expected an int or a string"):
            probe.save({"x": np.zeros((3, 2))}, sample_ids=[1, 2.5, 3])
    dump = open_dump(tmp_path / "d")
    assert dump.arrow("key_data")["step"].to_pylist() == [0]  # nothing of the refused calls, step 0 kept
    assert dump.arrow("sample").num_rows == 2


# -- per-micro-batch scalars: the step's value ----------------------------------------------
def _accumulated(path: Path, micro: int, summed: bool = True, coef: float = 1.0) -> Path:
    """8 samples in `micro` micro-batches, each saving the loss as a trainer that scales it for gradient
    accumulation does (TRL GRPO's dapo loss: the micro-batch's token sum over the step's token count)."""
    prompts = np.arange(8 * 3, dtype=np.int64).reshape(8, 3)
    per_sample = np.linspace(-0.7, 1.3, 8, dtype=np.float32)
    with rlprobe.Probe(path, framework="numpy", summed_keys=["loss"] if summed else []) as probe:
        for step in range(2):
            for chunk in np.array_split(np.arange(8), micro):
                probe.save({"prompts": prompts[chunk],
                            "loss": np.float32(coef * per_sample[chunk].sum() / 8 * (step + 1))})
            probe.step()
    return path


def _loss_rows(tables) -> list[dict]:
    return [r for r in tables["key_data"].to_pylist() if r["key"] == "loss"]


def test_a_summed_loss_is_compared_as_the_steps_sum(tmp_path):
    a, b = _accumulated(tmp_path / "a", 2), _accumulated(tmp_path / "b", 4)
    assert open_dump(a).manifest["summed_keys"] == ["loss"]
    tables, summary = _compare(a, b)
    assert summary["first_divergence"] is None
    rows = _loss_rows(tables)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["status"] in ("stats_only_match", "stats_only_close")
        assert ("the sum over each rank's micro-batches (summed_keys), the mean over ranks (A: 2 rows, B: 4 rows)"
                in r["message"])
        # the step's loss: the mean of the per-sample losses (times the step's factor), not a micro-batch's
        assert r["mean_a"] == pytest.approx(np.linspace(-0.7, 1.3, 8).mean() * (r["step"] + 1), rel=1e-6)
        assert r["mean_a"] == pytest.approx(r["mean_b"], rel=1e-6)


def test_a_loss_not_declared_summed_is_compared_as_its_mean(tmp_path):
    """The run's own declaration decides its aggregate: scaled losses compared as means differ by the
    accumulation counts (here 2 against 4), and the message says how each run was aggregated."""
    a, b = _accumulated(tmp_path / "a", 2), _accumulated(tmp_path / "b", 4, summed=False)
    _, summary = _compare(a, b)
    first = summary["first_divergence"]
    assert (first["key"], first["step"], first["status"]) == ("loss", 0, "stats_only_mismatch")
    assert ("A the sum over each rank's micro-batches (summed_keys), the mean over ranks (2 rows), "
            "B the mean over every rank and micro-batch (4 rows)") in first["message"]


def test_a_changed_loss_coefficient_under_another_layout_names_the_loss(tmp_path):
    a, b = _accumulated(tmp_path / "a", 2), _accumulated(tmp_path / "b", 4, coef=1.001)
    _, summary = _compare(a, b)
    first = summary["first_divergence"]
    assert (first["key"], first["step"], first["status"]) == ("loss", 0, "stats_only_mismatch")
    assert first["norm_rel_err"] > 10 * first["rtol"]
    assert "the loss computation for 'loss'" in summary["suspect"]


def test_a_malformed_summed_keys_in_a_manifest_is_an_error_naming_the_file(tmp_path):
    import json

    a, b = _accumulated(tmp_path / "a", 2), _accumulated(tmp_path / "b", 4)
    manifest = b / "rlprobe.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "summed_keys": "loss"}))
    _, summary = _compare(a, b)
    assert summary["read_errors"] == [
        f"run B: {manifest}: summed_keys is 'loss'; expected a list of key names: every key of this run is "
        "compared as its mean over the step's micro-batches"]


def test_summed_keys_must_be_a_list_of_key_names(tmp_path):
    for bad in ("loss", ["loss", 3], [""]):
        with pytest.raises(ProbeError, match=r"summed_keys=.*: expected a list of key names \(non-empty strings\)"):
            rlprobe.Probe(tmp_path / "d", framework="numpy", summed_keys=bad)
    assert not (tmp_path / "d").exists()  # refused before anything is written


# -- module dumps under another layout -------------------------------------------------------
def _staged(path: Path, order: list[int], micro: int) -> Path:
    """8 samples' update in `micro` micro-batches taken in `order`, each a module dump call of a tiny LM."""
    import torch

    from tiny_models import tiny_lm

    model = tiny_lm(layers=1)
    ids = torch.randint(0, 11, (8, 5), generator=torch.Generator().manual_seed(0))
    with rlprobe.Probe(path) as probe:
        for chunk in np.array_split(np.asarray(order), micro):
            with probe.stage("actor_update", model=model):
                out = model(ids[chunk])
            probe.save({"prompts": ids[chunk], "loss": out.float().mean()})
        probe.step()
    return path


def test_module_dumps_under_another_layout_are_not_compared(tmp_path):
    a = _staged(tmp_path / "a", list(range(8)), 2)
    tables, summary = _compare(a, _staged(tmp_path / "b", list(range(8)), 4))
    note = "module dumps not compared: the runs' micro-batch layouts differ (2 x 4 vs 4 x 2)"
    assert summary["layout"]["modules"] == note and summary["layout"]["note"].endswith("; " + note)
    assert summary["module_first_divergence"] is None and "modules" not in tables
    assert summary["first_divergence"] is None  # the key data agree per sample
    # equal counts, other samples in each micro-batch: calls matched by position would hold other samples
    _, summary = _compare(a, _staged(tmp_path / "c", [4, 5, 6, 7, 0, 1, 2, 3], 2))
    assert summary["layout"]["modules"] == ("module dumps not compared: the runs' micro-batches hold other samples "
                                            "(8 sample rows sit at another rank, micro-batch or row in B)")
    # the same layout: compared call by call, as always
    tables, summary = _compare(a, _staged(tmp_path / "d", list(range(8)), 2))
    assert "modules" not in summary["layout"] and tables["modules"].num_rows > 0
    assert summary["module_first_divergence"] is None

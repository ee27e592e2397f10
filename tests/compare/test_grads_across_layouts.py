"""Gradients of runs with different layouts (rlprobe/comparison/grads.py, docs/grads.md "Runs with
different layouts"): real PPO runs of the bundled example with the gradient monitor on, 2 vs 4
micro-batches and 1 vs 2 gloo ranks with the same global batch."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from rlprobe.comparison.grads import compare_grads
from rlprobe.comparison.run import compare_dumps
from rlprobe.lake.reader import open_dump
from rlprobe.comparison.options import CompareOptions
from ppo_runs import train, train_two_ranks

RUN = {"ppo.steps": 2, "rlprobe_config.grads_dump": True, "rlprobe_config.metrics_dump": False}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grad_layouts")
    return {
        "m2": train(root / "m2", **RUN),
        "m4": train(root / "m4", **RUN, **{"ppo.micro_batches": 4}),
        "m4_lr": train(root / "m4_lr", "lr", **RUN, **{"ppo.micro_batches": 4}),
        "r2": train_two_ranks(root / "r2", **RUN),
        "r2_adv": train_two_ranks(root / "r2_adv", "advantage-bug", **RUN),
    }


def _compare(a: Path, b: Path):
    return compare_dumps(open_dump(a), open_dump(b))


@pytest.mark.parametrize("other", ["m4", "r2"])
def test_a_fine_layout_pair_has_no_gradient_divergence(runs, other):
    tables, summary = _compare(runs["m2"], runs[other])
    assert summary["first_divergence"] is None
    assert summary["grad_first_flagged"] is None, summary["grad_first_flagged"]
    assert summary["suspect"] is None
    assert summary["advice"].startswith("the compared key data agree within the layout tolerance")
    assert "and so do the gradients compared: layout differs" in summary["advice"]
    assert summary["layout"]["grads"]["rank_a"] == summary["layout"]["grads"]["rank_b"] == 0
    grads = tables["grads"]
    assert set(grads["rank"].to_pylist()) == {0}  # B's rank 1 is covered by the layout note, not only in B
    assert set(grads["status"].to_pylist()) == {"compared", "stats_only"}  # actor L1, critic L0
    assert not any(grads["flagged"].to_pylist())
    # the rounding a layout change brings is real: signs of near-zero elements and norms differ a little
    assert 0 < pc.max(grads["norm_rel_diff"]).as_py() < 1e-5
    compared = grads.filter(pc.equal(grads["status"], "compared"))
    assert pc.min(compared["similarity"]).as_py() < 1.0  # which a per-parameter bar of 0.97 flagged
    steps = tables["grad_steps"]
    assert all(s > 0.99 for s in steps["weighted_similarity"].drop_null().to_pylist())


def test_the_other_ranks_are_counted_in_the_layout_note(runs):
    tables, summary = _compare(runs["m2"], runs["r2"])
    grads_layout = summary["layout"]["grads"]
    rows_rank1 = open_dump(runs["r2"]).arrow("grad").filter(pc.equal(pc.field("rank"), 1)).num_rows
    assert rows_rank1 > 0
    assert grads_layout == {"rank_a": 0, "rank_b": 0, "rows_covered_a": 0, "rows_covered_b": rows_rank1}
    assert f"the {rows_rank1} gradient rows of the other ranks are covered by this note" in summary["layout"]["note"]
    # the weights after each step, too: every rank holds the same
    fingerprints_rank1 = open_dump(runs["r2"]).arrow("param").filter(pc.equal(pc.field("rank"), 1)).num_rows
    assert fingerprints_rank1 > 0 and summary["layout"]["params"]["rows_covered_b"] == fingerprints_rank1
    assert "fingerprints: rank 0 of A against rank 0 of B" in summary["layout"]["note"]
    params = tables["params"]
    assert set(params["rank"].to_pylist()) == {0} and set(params["status"].to_pylist()) <= {"match", "close"}


def test_a_rank_only_one_run_holds_is_compared_with_the_other_run_s_first_rank(runs):
    tables, summary = compare_dumps(open_dump(runs["m2"]), open_dump(runs["r2"]), CompareOptions(ranks=[1]))
    assert summary["layout"]["grads"] == {"rank_a": 0, "rank_b": 1, "rows_covered_a": 0, "rows_covered_b": 0}
    assert "A holds none of ranks [1]: its rank 0 stands in for them" in summary["layout"]["note"]
    grads = tables["grads"]
    assert grads.num_rows and set(grads["status"].to_pylist()) == {"compared", "stats_only"}  # none only in B
    assert summary["grad_first_flagged"] is None
    assert set(tables["params"]["status"].to_pylist()) <= {"match", "close"}
    # key data: B's rank-1 samples against the same samples on A's rank 0
    key_data = tables["key_data"]
    assert key_data.num_rows and summary["first_divergence"] is None
    assert set(key_data["rank"].to_pylist()) == {0} and set(key_data["status"].to_pylist()) <= {"match", "close"}
    tables, summary = compare_dumps(open_dump(runs["m2"]), open_dump(runs["r2_adv"]), CompareOptions(ranks=[1]))
    assert (summary["grad_first_flagged"]["monitor"], summary["grad_first_flagged"]["step"]) == ("actor", 0)


def test_an_lr_fault_across_micro_batches_is_flagged_at_optimizer_step_1(runs):
    _, summary = _compare(runs["m2"], runs["m4_lr"])
    flagged = summary["grad_first_flagged"]
    assert (flagged["monitor"], flagged["rank"], flagged["step"]) == ("actor", 0, 1)  # step 0 had the same weights
    assert "weighted similarity dropped" in flagged["reason"]
    assert flagged["compared"].startswith("layouts differ: rank 0 of each run compared")
    assert (summary["first_divergence"]["key"], summary["first_divergence"]["step"]) == ("responses", 1)


def test_an_advantage_fault_across_ranks_is_flagged_at_optimizer_step_0(runs):
    tables, summary = _compare(runs["m2"], runs["r2_adv"])
    flagged = summary["grad_first_flagged"]
    assert (flagged["monitor"], flagged["step"]) == ("actor", 0)
    assert "weighted similarity" in flagged["reason"] and "< 0.9900 at the first step" in flagged["reason"]
    critic = tables["grads"].filter(pc.equal(tables["grads"]["monitor"], "critic"))  # L0: statistics only
    reasons = [r for r in critic.filter(pc.equal(critic["step"], 0))["flag_reason"].to_pylist() if r]
    assert reasons and all("> layout tolerance 0.000122 (float32)" in r for r in reasons)


def test_the_layout_similarity_bar_is_a_threshold(runs):
    layout = {"note": "layout differs: A 2 micro-batches x 1 rank, B 4 x 1; compared per sample"}
    _, flagged = compare_grads(open_dump(runs["m2"]), open_dump(runs["m4"]), layout=layout,
                               layout_similarity_min=1.0)
    assert flagged is not None and (flagged["monitor"], flagged["step"]) == ("actor", 0)
    assert "< 1.0000 at the first step" in flagged["reason"]


def test_a_pipeline_sets_the_layout_similarity_bar(runs, tmp_path):
    import json

    from rlprobe.comparison.grads import DEFAULTS
    from rlprobe.pipeline.runner import run_pipeline
    from rlprobe.pipeline.spec import load_pipeline
    from rlprobe.pipeline.spec_models import GradsCompare

    assert GradsCompare().model_dump() == DEFAULTS  # a spec that names no threshold keeps compare_grads' own
    flagged = {}
    for name, grads in (("default", ""), ("strict", "compare:\n  grads: {layout_similarity_min: 1.0}\n")):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(f"version: 1\nname: t\nruns:\n  a: {runs['m2']}\n  b: {runs['m4']}\noutput: ./{name}\n"
                        f"report: {{xlsx: false, csv: false}}\n{grads}", encoding="utf-8")
        run_pipeline(load_pipeline(spec))
        flagged[name] = json.loads((tmp_path / name / "summary.json").read_text())["grad_first_flagged"]
    assert flagged["default"] is None
    assert flagged["strict"] is not None and "< 1.0000 at the first step" in flagged["strict"]["reason"]


def test_equal_layouts_keep_exact_matching(runs):
    tables, summary = _compare(runs["m4"], runs["m4_lr"])
    assert summary["layout"]["note"] is None and "grads" not in summary["layout"]
    # with equal layouts step 0's gradients are bitwise equal, and the lr fault shows at step 1 as before
    grads = tables["grads"]
    step0 = grads.filter(pc.and_(pc.equal(grads["step"], 0), pc.equal(grads["status"], "compared")))
    assert set(step0["similarity"].to_pylist()) == {1.0}
    assert summary["grad_first_flagged"]["step"] == 1
    assert "compared" not in summary["grad_first_flagged"]

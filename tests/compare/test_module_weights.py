"""The weights at module dumps compared (rlprobe/comparison/modules.py, docs/modules.md "Weights at the
call"): a model whose weights differ is named with its first differing parameter and no module is blamed;
weights within rounding agree; a dump without weights still compares."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from tiny_models import tiny_lm, token_ids

import rlprobe
from rlprobe.comparison.modules import compare_module_weights, model_of
from rlprobe.comparison.tolerance import Tolerance

STAGE = "reference_compute_log_prob"


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Unperturbed runs must agree bit for bit (tests/compare/test_modules.py says why one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(path, perturb=None, *, weights=True, steps=2):
    model = tiny_lm(layers=2)
    with rlprobe.Probe(path) as probe:
        for step in range(steps):
            if perturb is not None and step == 1:
                perturb(model)  # before step 1's forward: its weights differ there, step 0 agrees
            with probe.stage(STAGE, model=model, weights=weights), torch.no_grad():
                model(token_ids(step))
            probe.step()
    return path


def add_to(name: str, by: float):
    def perturb(model):
        with torch.no_grad():
            model.get_submodule(name).weight.add_(by)
    return perturb


def one_ulp(name: str):
    """The weights of `name` moved by one float32 unit in the last place: what another device's update leaves."""
    def perturb(model):
        with torch.no_grad():
            w = model.get_submodule(name).weight
            w.copy_(torch.nextafter(w, torch.full_like(w, np.inf)))
    return perturb


def test_weights_that_differ_are_named_and_no_module_is_blamed(tmp_path):
    a, b = run(tmp_path / "a"), run(tmp_path / "b", add_to("layers.1.mlp.0", 1e-2))
    summary = rlprobe.compare(a, b, tmp_path / "out", reports=False)
    first = summary["module_first_divergence"]  # the first module whose output differs, inputs equal ...
    assert (first["step"], first["module"], first["inputs_match"]) == (1, "layers.1.mlp.0", True)
    weights = first["weights"]  # ... ran with other weights: not its computation
    assert (weights["stage"], weights["step"], weights["parameter"], weights["status"]) == \
        (STAGE, 1, "layers.1.mlp.0.weight", "differs")
    assert weights["rel_err"] > weights["rtol"] == 2.0**-23 * 128
    assert summary["module_weights_first_difference"] == weights
    assert summary["module_suspect"].startswith(
        "the weights of 'reference' differ at step 1 (first parameter 'layers.1.mlp.0.weight'")
    assert "no module is blamed" in summary["module_suspect"]
    assert "computation diverges" not in summary["module_suspect"]
    assert summary["suspect"] == summary["module_suspect"]  # no key data: the module dump's verdict
    rows = pq.read_table(tmp_path / "out" / "module_weights.parquet").to_pylist()
    differing = {(r["step"], r["parameter"]) for r in rows if r["status"] != "match"}
    assert differing == {(1, "layers.1.mlp.0.weight")}  # the bias and every other module's weights match


def test_a_module_computing_differently_from_equal_weights_is_still_blamed(tmp_path):
    def miscompute(model):
        model.layers[1].mlp[0].register_forward_hook(lambda module, args, out: out + 1e-2)
    a, b = run(tmp_path / "a"), run(tmp_path / "b", miscompute)
    summary = rlprobe.compare(a, b, tmp_path / "out", reports=False)
    assert summary["module_first_divergence"]["module"] == "layers.1.mlp.0"
    assert "weights" not in summary["module_first_divergence"]
    assert summary["module_weights_first_difference"] is None
    assert "its inputs match and its output differs -> this module's computation diverges" in summary["suspect"]


def test_weights_one_ulp_apart_are_close_and_bitwise_tolerance_sees_them(tmp_path):
    a, b = run(tmp_path / "a"), run(tmp_path / "b", one_ulp("layers.0.mlp.2"))
    weights, firsts = compare_module_weights(rlprobe.open(a), rlprobe.open(b))
    moved = [r for r in weights.to_pylist() if r["status"] != "match"]
    assert {(r["step"], r["parameter"], r["status"]) for r in moved} == {(1, "layers.0.mlp.2.weight", "close")}
    assert 0 < moved[0]["rel_err"] <= moved[0]["rtol"] and firsts == []
    _, strict = compare_module_weights(rlprobe.open(a), rlprobe.open(b),
                                       tolerance=Tolerance(rtol=0.0, atol=0.0))
    assert [(f["step"], f["parameter"], f["status"]) for f in strict] == [(1, "layers.0.mlp.2.weight", "differs")]


def test_weights_in_another_dtype_are_named_as_such(tmp_path):
    a, b = run(tmp_path / "a"), run(tmp_path / "b", lambda model: model.to(torch.float64))
    _, firsts = compare_module_weights(rlprobe.open(a), rlprobe.open(b))
    first = firsts[0]
    assert (first["parameter"], first["status"], first["dtype_a"], first["dtype_b"]) == \
        ("emb.weight", "dtype_mismatch", "float32", "float64")


def test_dumps_without_weights_still_compare(tmp_path):
    """Dumps written before the weights were recorded (or with weights=False): module verdicts as before."""
    a = run(tmp_path / "a", weights=False)
    b = run(tmp_path / "b", add_to("layers.1.mlp.0", 1e-2), weights=False)
    summary = rlprobe.compare(a, b, tmp_path / "out", reports=False)
    assert summary["module_first_divergence"]["module"] == "layers.1.mlp.0"
    assert "module_weights_first_difference" not in summary
    assert "this module's computation diverges" in summary["module_suspect"]
    assert not (tmp_path / "out" / "module_weights.parquet").exists()
    # one run with weights, the other without: its rows are only in one run, which names nothing
    c = run(tmp_path / "c", add_to("layers.1.mlp.0", 1e-2))
    mixed = rlprobe.compare(a, c, tmp_path / "mixed", reports=False)
    assert mixed["module_weights_first_difference"] is None
    assert "this module's computation diverges" in mixed["module_suspect"]


@pytest.mark.parametrize("stage, model", [("actor_compute_log_prob", "actor"), ("critic_update", "critic"),
                                          ("reward_compute", "reward"), ("my_stage", "my_stage")])
def test_the_model_of_a_stage(stage, model):
    assert model_of(stage) == model


def test_weights_that_differ_while_every_output_agrees_are_still_named(tmp_path):
    """A weight no forward of the dump reads (a layer its parent never calls) moved: outputs agree, the
    weights do not, and the verdict says so rather than 'no divergence'."""
    def unused(model):
        model.spare = torch.nn.Linear(2, 2)  # hooked, never called
        with torch.no_grad():
            model.spare.weight.add_(1.0)

    def spare(model):
        model.spare = torch.nn.Linear(2, 2)
    a = run(tmp_path / "a", spare)
    b = run(tmp_path / "b", unused)
    summary = rlprobe.compare(a, b, tmp_path / "out", reports=False)
    assert summary["module_first_divergence"] is None
    assert summary["module_weights_first_difference"]["parameter"] == "spare.weight"
    assert summary["suspect"].startswith("the weights of 'reference' differ at step 1 (first parameter 'spare.weight'")
    assert summary["advice"].startswith("the module dumps' outputs agree, but the weights they ran with differ")

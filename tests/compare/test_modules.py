"""Module-level comparison: the first diverging layer, its inputs, tolerances and the reports."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from openpyxl import load_workbook

import rlprobe
from rlprobe.comparison.modules import compare_modules
from tiny_models import tiny_lm, token_ids


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Two unperturbed runs must agree bit for bit. With several threads the BLAS may pick how many
    to use at run time (fewer on a loaded machine), which splits the sums differently and changed
    attention's last bits between runs A and B: one thread keeps the runs equal, as the tests mean."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(path, perturb=None, *, tensors=False, stage="reference_compute_log_prob", update=False,
        dtype=torch.float32, steps=2, save_loss=True):
    model = tiny_lm(layers=3).to(dtype)
    if perturb is not None:
        perturb(model)
    with rlprobe.Probe(path) as probe:
        for step in range(steps):
            with probe.stage(stage, model=model, steps="1", tensors=tensors):
                out = model(token_ids(step))
                if update:
                    out.float().square().mean().backward()
            if save_loss:
                probe.save({"loss": out.float().mean()})
            probe.step()
    return path


def bump(name: str, by: float = 1e-3):
    """A layer that computes differently from the same weights and inputs (a faulty kernel): `by` added to
    its output (the first item of a tuple), its weights untouched."""
    def perturb(model):
        def hook(module, args, output):
            return (output[0] + by, *output[1:]) if isinstance(output, tuple) else output + by
        model.get_submodule(name).register_forward_hook(hook)
    return perturb


def bump_weights(name: str, by: float = 1e-3):
    """Other weights: `by` added to every weight of `name` (a learning rate or an update that differed)."""
    def perturb(model):
        with torch.no_grad():
            model.get_submodule(name).weight.add_(by)
    return perturb


@pytest.mark.parametrize("tensors", [False, True], ids=["stats", "tensors"])
def test_perturbed_layer_is_named_with_matching_inputs(tmp_path, tensors):
    a = run(tmp_path / "a", tensors=tensors)
    b = run(tmp_path / "b", bump("layers.1.mlp.0"), tensors=tensors)
    modules, first = compare_modules(rlprobe.open(a), rlprobe.open(b))
    assert first["module"] == "layers.1.mlp.0" and first["io"] == "output" and first["inputs_match"] is True
    assert (first["stage"], first["step"], first["rank"], first["call"], first["direction"]) == \
           ("reference_compute_log_prob", 1, 0, 0, "forward")
    assert first["status"] == ("mismatch" if tensors else "stats_only_mismatch")
    rows = modules.to_pylist()
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)  # run A's execution order
    before = [r for r in rows if r["seq"] < first["seq"]]
    assert {r["module"] for r in before} >= {"emb", "layers.0", "layers.0.mlp.2", "layers.1.ln", "layers.1.attn"}
    assert {r["status"] for r in before} == {"match" if tensors else "stats_only_match"}
    later = {r["module"] for r in rows if r["status"] not in ("match", "stats_only_match")}
    assert {"layers.1.mlp", "layers.1", "layers.2", "head", ""} <= later
    if tensors:
        bad = next(r for r in rows if r["is_first_divergence"])
        assert bad["max_abs_err"] > 0 and bad["same_pct"] < 100


def test_identical_runs_have_no_module_divergence(tmp_path):
    modules, first = compare_modules(rlprobe.open(run(tmp_path / "a")), rlprobe.open(run(tmp_path / "b")))
    assert first is None and modules.num_rows > 0
    assert set(modules.column("status").to_pylist()) == {"stats_only_match"}


def test_backward_divergence_in_an_update_stage(tmp_path):
    # the head's bias changes only the forward output; the embedding gradient is the deepest backward row
    a = run(tmp_path / "a", stage="actor_update", update=True)
    b = run(tmp_path / "b", bump("head", 1e-3), stage="actor_update", update=True)
    modules, first = compare_modules(rlprobe.open(a), rlprobe.open(b))
    assert first["module"] == "head" and first["direction"] == "forward" and first["inputs_match"] is True
    backward = [r for r in modules.to_pylist() if r["direction"] == "backward"]
    assert backward and {r["io"] for r in backward} == {"grad_input", "grad_output"}
    assert any(r["status"] == "stats_only_mismatch" for r in backward)


def test_input_divergence_points_outside_hooked_modules(tmp_path):
    a = run(tmp_path / "a")
    b = run(tmp_path / "b")
    # run C feeds different tokens: the root's and the embedding's inputs differ
    model = tiny_lm(layers=3)
    with rlprobe.Probe(tmp_path / "c") as probe:
        for step in range(2):
            with probe.stage("reference_compute_log_prob", model=model, steps="1"):
                model(token_ids(step + 7))
            probe.step()
    _, first = compare_modules(rlprobe.open(a), rlprobe.open(tmp_path / "c"))
    assert first["module"] == "emb" and first["io"] == "input" and first["inputs_match"] is False
    _, same = compare_modules(rlprobe.open(a), rlprobe.open(b))
    assert same is None


def test_bf16_statistics_use_a_dtype_tolerance(tmp_path):
    def tiny(model):  # changes a few bits of the last layer's output, far below bf16's resolution of its stats
        with torch.no_grad():
            model.head.bias[0] += 2 ** -7 * abs(float(model.head.bias[0]))
    a = run(tmp_path / "a", dtype=torch.bfloat16)
    b = run(tmp_path / "b", tiny, dtype=torch.bfloat16)
    modules, first = compare_modules(rlprobe.open(a), rlprobe.open(b))
    head = next(r for r in modules.to_pylist() if r["module"] == "head" and r["io"] == "output")
    assert head["hash_a"] != head["hash_b"]
    assert head["status"] == "stats_only_close" and "rtol 0.03125" in head["message"]  # bfloat16: 4 eps
    _, strict = compare_modules(rlprobe.open(a), rlprobe.open(b), stats_rtol=0.0)
    assert strict["module"] == "head" and strict["inputs_match"] is True


def test_only_in_one_run_is_reported(tmp_path):
    a = run(tmp_path / "a", steps=2)
    model = tiny_lm(layers=3)
    with rlprobe.Probe(tmp_path / "b") as probe:
        probe.step()
        with probe.stage("reference_compute_log_prob", model=model):
            model.emb(token_ids(1))  # run B calls only the embedding
        probe.step()
    modules, first = compare_modules(rlprobe.open(a), rlprobe.open(tmp_path / "b"))
    statuses = set(modules.column("status").to_pylist())
    assert "only_in_a" in statuses and first["status"] == "only_in_a" and first["module"] != "emb"


def test_compare_writes_modules_parquet_summary_and_sheet(tmp_path):
    a = run(tmp_path / "a", tensors=True)
    b = run(tmp_path / "b", bump("layers.2.attn", 1e-2), tensors=True)
    summary = rlprobe.compare(a, b, tmp_path / "out")
    first = summary["module_first_divergence"]
    assert first["module"] == "layers.2.attn" and first["inputs_match"] is True and first["io"] == "output"
    assert "its inputs match" in summary["module_suspect"]
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["module_first_divergence"]["module"] == "layers.2.attn"
    table = pq.read_table(tmp_path / "out" / "modules.parquet")
    assert {"stage", "step", "rank", "module", "call", "direction", "io", "index", "seq", "status",
            "max_abs_err", "same_pct"} <= set(table.column_names)
    assert "file_a" not in table.column_names
    book = load_workbook(tmp_path / "out" / "report.xlsx", read_only=True)
    assert "Modules" in book.sheetnames
    sheet = book["Modules"]
    grid = [[c.value for c in row] for row in sheet.iter_rows()]
    assert "module" in grid[0] and len(grid) == table.num_rows + 1
    marked = [row for row in grid[1:] if row[grid[0].index("first divergence")]]
    assert len(marked) == 1 and marked[0][grid[0].index("module")] == "layers.2.attn"
    md = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert summary["first_divergence"] is not None  # the loss differs too: the verdict is the key data's
    assert "**Module dumps:** " in md and "layers.2.attn" in md


def test_compare_without_module_dumps_leaves_modules_out(tmp_path):
    for name in ("a", "b"):
        with rlprobe.Probe(tmp_path / name) as probe:
            probe.save({"loss": torch.tensor(1.0)})
    summary = rlprobe.compare(tmp_path / "a", tmp_path / "b", tmp_path / "out")
    assert summary["module_first_divergence"] is None
    assert not (tmp_path / "out" / "modules.parquet").exists()


def test_module_divergence_is_the_verdict_without_key_data(tmp_path):
    a = run(tmp_path / "a", tensors=True, save_loss=False)
    b = run(tmp_path / "b", bump("layers.1.mlp.0"), tensors=True, save_loss=False)
    summary = rlprobe.compare(a, b, tmp_path / "out")
    assert summary["first_divergence"] is None
    assert summary["suspect"] == summary["module_suspect"] and "layers.1.mlp.0" in summary["suspect"]
    assert summary["advice"].startswith("no key data were compared but the module dumps part ways")
    md = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert md.startswith("## rlprobe: ❌ first module divergence: reference_compute_log_prob step 1, rank 0, "
                         "'layers.1.mlp.0' call 0 forward — mismatch")

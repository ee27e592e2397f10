"""The spec's compare.grads thresholds and compare.modules.stage reach the comparisons."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlprobe.pipeline.runner import run_pipeline
from rlprobe.pipeline.spec import load_pipeline


def _run(tmp_path: Path, a: Path, b: Path, compare: str, name: str = "out") -> dict:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"version: 1\nname: t\nruns:\n  a: {a}\n  b: {b}\noutput: ./{name}\n"
                    f"report: {{xlsx: false, csv: false}}\n{compare}", encoding="utf-8")
    run_pipeline(load_pipeline(spec))
    return json.loads((tmp_path / name / "summary.json").read_text())


def test_grad_thresholds_from_the_spec_decide_the_flags(fixtures_dir, tmp_path):
    grad = fixtures_dir / "msprobe" / "grad"
    default = _run(tmp_path, grad / "run_a", grad / "run_b", "", "default")
    assert default["grad_first_flagged"]["step"] == 2  # the defaults (0.97, 0.03) flag step 2
    lax = _run(tmp_path, grad / "run_a", grad / "run_b",
               "compare:\n  grads: {first_step_min: 0.0, max_drop: 1.0}\n", "lax")
    assert lax["grad_first_flagged"] is None
    steps = pq.read_table(tmp_path / "lax" / "grad_steps.parquet").to_pylist()
    assert steps and not any(s["flagged"] for s in steps)


def test_module_stage_from_the_spec_selects_the_stage(tmp_path):
    pytest.importorskip("torch")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
    try:
        from test_modules import bump, run
    finally:
        sys.path.pop(0)
    a = run(tmp_path / "a")
    b = run(tmp_path / "b", bump("head", 1e-3))  # the head's output moved beyond rounding
    every = _run(tmp_path, a, b, "", "every")
    assert every["module_first_divergence"]["stage"] == "reference_compute_log_prob"
    chosen = _run(tmp_path, a, b, "compare:\n  modules: {stage: reference_compute_log_prob}\n", "chosen")
    assert chosen["module_first_divergence"] == every["module_first_divergence"]
    other = _run(tmp_path, a, b, "compare:\n  modules: {stage: actor_update}\n", "other")
    assert other["module_first_divergence"] is None
    assert not (tmp_path / "other" / "modules.parquet").exists() or \
        pq.read_table(tmp_path / "other" / "modules.parquet").num_rows == 0


def test_pipeline_writes_the_gradient_outputs_of_rlprobe_compare(fixtures_dir, tmp_path):
    """report.xlsx sheets, similarities.csv and the gradient plots, as `rlprobe compare` writes them."""
    import openpyxl

    grad = fixtures_dir / "msprobe" / "grad"
    spec = tmp_path / "g.yaml"
    spec.write_text(f"version: 1\nname: g\nruns:\n  a: {grad / 'run_a'}\n  b: {grad / 'run_b'}\noutput: ./out\n"
                    "report: {plot_every_param: true}\n", encoding="utf-8")
    run_pipeline(load_pipeline(spec))
    out = tmp_path / "out"
    expected = (grad / "expected" / "rank0" / "similarities.csv").read_bytes()
    assert (out / "grads" / "rank0" / "similarities.csv").read_bytes() == expected
    sheets = openpyxl.load_workbook(out / "report.xlsx", read_only=True).sheetnames
    assert {"Grads", "Grad flags", "Grad similarity"} <= set(sheets)
    assert (out / "plots" / "grad_similarity.png").exists() and (out / "plots" / "grad_worst_params.png").exists()
    assert len(list((out / "plots" / "grad_params").glob("*.png"))) == len(expected.splitlines()) - 2


def test_a_select_that_names_nothing_the_runs_hold_fails_the_spec(fixtures_dir, tmp_path):
    from rlprobe.pipeline.runner import EXIT_SPEC, PipelineError

    runs = fixtures_dir / "msprobe" / "keydata"
    with pytest.raises(PipelineError, match=r"bad\.yaml: select: selected key\(s\) nosuch saved by neither run") as e:
        _run(tmp_path, runs / "run_a", runs / "run_b", "select: {keys: 'log_prob,nosuch'}\n", "bad")
    assert e.value.exit_code == EXIT_SPEC
    assert not (tmp_path / "bad").exists()

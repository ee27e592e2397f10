"""A control run's noise envelope (issue 41, item 2; docs/across-devices.md, "A control run"). Run A is the PPO
example on this CPU; run B the same run on a device whose matmul inputs are rounded to 14 mantissa bits
(tests/second_device.py: errors beyond float32's tolerance, so without a control B's noise alone is a
divergence); control run C the same device with another reduction order (noise of the same kind, drawn
apart). With C, B's noise is no divergence beyond rounding, and a fault planted on B's device is named with
the key, step and suspect a comparison on one device names (tests/compare/test_second_device.py's)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

import rlprobe
from ppo_runs import train
from rlprobe.comparison.control_run import FACTOR
from rlprobe.comparison.options import CompareOptions
from rlprobe.errors import ControlRunError, ProbeError
from second_device import train_on_second_device

SETTINGS = {"ppo.steps": 2, "rlprobe_config.grads_dump": False, "rlprobe_config.param_fingerprints": False}
DEVICE = {"mantissa_bits": 14, "order_seed": 1}  # run B's device
CONTROL = {"mantissa_bits": 14, "order_seed": 2}  # the control's: the same device, another reduction order
# fault -> (key, step, words of the suspect) on one device (tests/compare/test_second_device.py's EXPECTED)
EXPECTED = {"advantage-bug": ("advantages", 0, "not a model"),
            "ref-bf16": ("ref_log_prob", 0, "reference model's forward")}
SOURCE = f"control run x{FACTOR:g}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("control_run")
    made = {"a": train(root / "a", None, **SETTINGS),
            "b": train_on_second_device(root / "b", None, DEVICE, **SETTINGS),
            "c": train_on_second_device(root / "c", None, CONTROL, **SETTINGS),
            # a "control" whose sampling parted from A's at step 0: no noise-only control at all
            "parted": train_on_second_device(root / "parted", "sampling-seed", CONTROL, **SETTINGS)}
    for fault in EXPECTED:
        made[fault] = train_on_second_device(root / fault, fault, DEVICE, **SETTINGS)
    return made


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rlprobe.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_the_noise_of_b_exceeds_the_float32_tolerance_without_a_control(runs, tmp_path):
    proc = _cli("compare", runs["a"], runs["b"], "-o", tmp_path / "o", "--quiet", "--fail-on-diff")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    first = summary["first_divergence"]
    assert first["status"] == "mismatch" and first["tolerance_source"] == "float32 default"
    assert first["norm_rel_err"] > first["rtol"]  # beyond float32's tolerance, a few of its units
    assert summary["control"] is None and "envelope" not in summary["keys"][0]  # nothing changes without one


def test_a_control_run_makes_the_same_noise_no_divergence_beyond_rounding(runs, tmp_path):
    out = tmp_path / "o"
    proc = _cli("compare", runs["a"], runs["b"], "-o", out, "--quiet", "--fail-on-diff", "--control", runs["c"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no divergence beyond rounding" in proc.stdout and f"control run {runs['c']}" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    control = summary["control"]
    assert control["path"] == str(runs["c"]) and control["factor"] == FACTOR and control["parted"] is None
    assert summary["first_divergence"] is None
    assert not summary.get("warnings")
    for row in control["envelope"]:
        assert row["envelope"] == pytest.approx(FACTOR * row["control_rel_err"], rel=1e-12)
    # the keys the dtype tolerance alone called divergent are those the envelope judged
    judged = {k["key"]: k for k in summary["keys"] if k["tolerance_source"] == SOURCE}
    assert judged and all(k["envelope"] > k["rtol"] for k in judged.values())
    assert all(k["tolerance_source"] != SOURCE and k["envelope"] is None for k in summary["keys"]
               if k["key"] in ("prompts", "responses"))  # tokens stay exact
    rows = pq.read_table(out / "key_data.parquet").to_pylist()
    assert {r["status"] for r in rows} <= {"match", "close"}
    tolerance = {k["key"]: (k["rtol"], k["atol"]) for k in summary["keys"]}

    def beyond_dtype_tolerance(r):
        rtol, atol = tolerance[r["key"]]
        scale = max(abs(r[c]) for c in ("min_a", "max_a", "min_b", "max_b"))
        return r["max_abs_err"] > atol + rtol * scale

    beyond = [r for r in rows if r["max_abs_err"] is not None and beyond_dtype_tolerance(r)]
    assert beyond and all(r["status"] == "close" and "within the control run's noise: max|a-b|/max|a| " in r["message"]
                          for r in beyond)
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "**Control run:**" in md and SOURCE in md


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_planted_fault_is_named_as_on_one_device_with_the_control(runs, tmp_path, fault):
    key, step, words = EXPECTED[fault]
    summary = rlprobe.compare(runs["a"], runs[fault], tmp_path / "out", reports=False, control=runs["c"])
    first = summary["first_divergence"]
    assert (first["key"], first["step"]) == (key, step), first
    assert words in summary["suspect"], summary["suspect"]
    rows = pq.read_table(tmp_path / "out" / "key_data.parquet").to_pylist()
    fault_rows = [r for r in rows if r["key"] == key and r["step"] == step and r["status"] == "mismatch"]
    envelope = {(e["key"], e["step"]): e["envelope"] for e in summary["control"]["envelope"]}
    # the fault's error is far beyond its envelope, which is the control's noise (B's device rounds alike)
    assert fault_rows and all(r["norm_rel_err"] > 10 * envelope[(key, step)] for r in fault_rows)
    # the noise of both keys on B's device is beyond float32's tolerance: the envelope judged the row
    assert first["tolerance_source"] == SOURCE and "beyond the control run's noise" in first["message"]


def test_the_advantage_bug_is_judged_against_the_envelope(runs, tmp_path):
    """advantages' noise on B's device is beyond float32's tolerance: the envelope is its bound, and the
    first divergence's message gives the error against it."""
    summary = rlprobe.compare(runs["a"], runs["advantage-bug"], tmp_path / "out", reports=False, control=runs["c"])
    first = summary["first_divergence"]
    assert first["tolerance_source"] == SOURCE and first["envelope"] > first["rtol"]
    assert f"> envelope {first['envelope']:.3g} ({FACTOR:g} x the control's" in first["message"]


def test_a_control_whose_tokens_parted_is_not_used_and_said_so(runs, tmp_path):
    proc = _cli("compare", runs["a"], runs["b"], "-o", tmp_path / "o", "--quiet", "--fail-on-diff",
                "--control", runs["parted"])
    assert proc.returncode == 1, proc.stdout + proc.stderr  # B's noise is judged by the dtype tolerance again
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    parted = summary["control"]["parted"]
    assert (parted["key"], parted["step"]) == ("responses", 0)
    assert summary["control"]["envelope"] == []  # steps from 0 on: none
    assert any("no noise-only control" in w and "step 0" in w for w in summary["warnings"])
    assert "no noise-only control" in proc.stdout
    assert summary["first_divergence"]["tolerance_source"] == "float32 default"


def test_a_control_run_of_identical_bits_leaves_the_dtype_tolerances(runs, tmp_path):
    """A deterministic rerun (C = A bit for bit) has no noise: B is judged as without a control."""
    without = rlprobe.compare(runs["a"], runs["b"], tmp_path / "without", reports=False)
    same = rlprobe.compare(runs["a"], runs["b"], tmp_path / "same", reports=False, control=runs["a"])
    assert {e["envelope"] for e in same["control"]["envelope"]} == {0.0}
    assert same["first_divergence"] == without["first_divergence"]


def test_the_options_object_carries_the_control(runs, tmp_path):
    options = CompareOptions.build(control=runs["c"])
    summary = rlprobe.compare(runs["a"], runs["b"], tmp_path / "o", reports=False, options=options)
    assert summary["control"]["path"] == str(runs["c"]) and summary["first_divergence"] is None
    with pytest.raises(ProbeError, match="control must be the path of a control run's dump"):
        CompareOptions(control=3)


def _other_keys_dump(path):
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save({"foo": np.arange(4, dtype=np.float32)})
        probe.step()
    return path


def test_a_control_that_is_missing_no_dump_or_of_other_keys_is_named(runs, tmp_path):
    missing = tmp_path / "nowhere"
    proc = _cli("compare", runs["a"], runs["b"], "-o", tmp_path / "o1", "--quiet", "--control", missing)
    assert proc.returncode == 3
    assert f"control run {missing}: dump {missing} does not exist" in proc.stderr
    assert "expected a dump of the baseline's code rerun with noise only" in proc.stderr
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(ControlRunError, match=f"control run {a_file}: dump {a_file} is a file"):
        rlprobe.compare(runs["a"], runs["b"], tmp_path / "o2", reports=False, control=a_file)
    other = _other_keys_dump(tmp_path / "other")
    with pytest.raises(ControlRunError, match=rf"control run {other}: no key data in common with run A .*"
                                              rf"the control foo"):
        rlprobe.compare(runs["a"], runs["b"], tmp_path / "o3", reports=False, control=other)
    assert not (tmp_path / "o3").exists()  # nothing published


def test_a_control_whose_key_data_cannot_be_read_is_named_with_its_part(runs, tmp_path):
    import shutil

    broken = shutil.copytree(runs["c"], tmp_path / "broken")
    part = next((broken / "stats/key_data/rank=0").glob("part-*.parquet"))
    part.write_bytes(b"PAR1 garbage")
    with pytest.raises(ControlRunError, match=rf"control run {broken}: no key data in common with run A "
                                              rf".*in the selection; run B: {part}: unreadable Parquet part"):
        rlprobe.compare(runs["a"], runs["b"], tmp_path / "o", reports=False, control=broken)


def _pipeline(tmp_path, runs: dict, name: str = "p") -> "object":
    from rlprobe.pipeline.spec import load_pipeline

    listed = "".join(f"  {k}: {v}\n" for k, v in runs.items())
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"version: 1\nname: t\nruns:\n{listed}output: ./{name}\nreport: {{xlsx: false, csv: false}}\n",
                    encoding="utf-8")
    return load_pipeline(spec)


def test_a_pipeline_takes_the_control_as_its_third_run(runs, tmp_path):
    from rlprobe.pipeline.runner import run_pipeline

    result = run_pipeline(_pipeline(tmp_path, {"baseline": runs["a"], "candidate": runs["b"], "control": runs["c"]}))
    assert result.exit_code == 0
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["run_a"] == str(runs["a"]) and summary["run_b"] == str(runs["b"])
    assert summary["control"]["path"] == str(runs["c"]) and summary["first_divergence"] is None
    assert summary["pipeline"]["runs"]["control"] == str(runs["c"])


def test_a_pipeline_s_bad_control_or_third_run_is_named(runs, tmp_path):
    from rlprobe.pipeline.spec import SpecError

    with pytest.raises(SpecError, match="three runs need one named 'control'"):
        _pipeline(tmp_path, {"baseline": runs["a"], "candidate": runs["b"], "other": runs["c"]})
    with pytest.raises(SpecError, match=r"runs\.control: dump .*nowhere does not exist") as e:
        _pipeline(tmp_path, {"baseline": runs["a"], "candidate": runs["b"], "control": tmp_path / "nowhere"}, "q")
    assert e.value.exit_code == 3

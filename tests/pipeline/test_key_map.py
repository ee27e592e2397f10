"""A pipeline's `key_map:` (docs/compare.md, "Key names") end to end: `rlprobe pipeline run` over two
dumps saved under a trainer's own key names, and bad entries named with the YAML file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import rlprobe

SPEC = """version: 1
name: trl_names
runs:
  a: {a}
  b: {b}
output: {out}
key_map:
  old_logps: old_log_prob   # this trainer's own spelling
"""


def _trl_run(path: Path, shift: float = 0.0) -> Path:
    """A GRPO-like step saved under TRL's names (prompt_ids, completion_ids, ref_per_token_logps:
    the built-in table) and one that is not in it (old_logps)."""
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        for step in range(2):
            probe.save({"prompt_ids": np.arange(8).reshape(2, 4) + step,
                        "completion_ids": np.arange(6).reshape(2, 3) + step,
                        "old_logps": np.full((2, 3), -1.0, np.float32) + (shift if step == 1 else 0.0),
                        "ref_per_token_logps": np.full((2, 3), -1.25, np.float32)})
            probe.step()
    return path


def test_key_map_names_the_data_flow_key_and_stage(tmp_path, write_yaml, cli):
    a, b = _trl_run(tmp_path / "a"), _trl_run(tmp_path / "b", shift=0.5)
    spec = write_yaml(tmp_path / "trl.yaml", SPEC.format(a=a, b=b, out=tmp_path / "out"))
    result = cli("pipeline", "run", spec)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert (summary["first_divergence"]["key"], summary["first_divergence"]["step"]) == ("old_logps", 1)
    assert summary["suspect"].startswith("old_logps (as old_log_prob) diverges first at step 1")
    assert ("(prompts, responses identical) -> the actor's forward when computing log-probs of the rollouts"
            in summary["suspect"])
    assert summary["next_config"]["rlprobe_config"]["stages"] == ["actor_compute_log_prob"]
    assert summary["warnings"] == []
    assert result.exit_code == 0, result.output
    assert "first divergence: old_logps at step 1" in result.output
    assert "old_logps (as old_log_prob) diverges first" in (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    # without the entry the same runs get the weak verdict: no stage, no next config
    write_yaml(spec, SPEC.format(a=a, b=b, out=tmp_path / "plain").replace("  old_logps: old_log_prob", "  {}")
               .replace("key_map:\n  {}", "key_map: {}"))
    cli("pipeline", "run", spec)
    plain = json.loads((tmp_path / "plain" / "summary.json").read_text(encoding="utf-8"))
    assert "the code that produces 'old_logps'" in plain["suspect"] and plain["next_config"] is None


def test_a_bad_key_map_entry_is_named_with_file_and_line(tmp_path, write_yaml, cli):
    text = SPEC.format(a=tmp_path, b=tmp_path, out=tmp_path / "out") + "  ref_logps: logprobz\n"
    spec = write_yaml(tmp_path / "bad.yaml", text)
    result = cli("pipeline", "run", spec)
    assert result.exit_code == 2
    assert f"{spec}:9: key_map.ref_logps: 'logprobz' is not a key of the data flow; expected one of prompts" \
        in result.output
    assert not (tmp_path / "out").exists()  # nothing is written for a spec that cannot run
    empty = write_yaml(tmp_path / "empty.yaml", text.replace("  ref_logps: logprobz\n", "  '': prompts\n"))
    result = cli("pipeline", "run", empty)
    assert result.exit_code == 2 and f"{empty}:7: key_map: " in result.output
    assert "expected SAVED=CANONICAL, both non-empty" in result.output


def test_the_check_stage_reads_the_keys_through_key_map_too(tmp_path, write_yaml, cli):
    """A pipeline's key_map: made its comparison read my_lp as log_prob, but its check: stage did not
    (no rule applied, the run passed): now both read the run's keys one way."""
    with rlprobe.Probe(tmp_path / "run", rank=0, world_size=1) as probe:
        probe.save({"my_lp": np.full((2, 3), -0.5, np.float32), "my_old": np.full((2, 3), -1.0, np.float32)})
        probe.step()
    spec = write_yaml(tmp_path / "check.yaml", f"version: 1\nname: one\nruns: {{run: {tmp_path / 'run'}}}\n"
                      f"output: {tmp_path / 'out'}\ncheck: {{plots: false}}\n"
                      "key_map: {my_lp: log_prob, my_old: old_log_prob}\n")
    result = cli("pipeline", "run", spec)
    assert result.exit_code == 1, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert summary["check"]["run"]["failed"] == ["on_policy"]  # log_prob != old_log_prob on-policy

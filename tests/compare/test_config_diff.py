"""The config diff (rlprobe/comparison/config_diff.py): real PPO runs of examples/ppo/tiny_ppo.py that
differ in one config setting, through rlprobe.compare, the CLI and a pipeline's config_differs gate."""

from __future__ import annotations

import json
import subprocess
import sys

import openpyxl
import pytest

import rlprobe
from rlprobe.comparison.config_diff import causes, diff_configs, patterns_table
from rlprobe.demo import load_config, load_example_module
from rlprobe.lake.reader import open_dump


# each run's config overrides, in one place: a run is trained by whichever test asks for it first (xdist
# spreads this module's tests over workers), so a name must mean the same run whoever asks
RUNS = {
    "base": {},
    "temperature": {"ppo.temperature": 0.7},
    "critic_lr": {"ppo.critic_lr": 0.003},
    "note": {"notes.comment": "second run"},
    "elsewhere": {"rlprobe_config.dump_path": "/somewhere/else"},
    "no_config": {"rlprobe_config.configurations_dump": False},
}


@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory):
    """name (of RUNS) -> dump of a 2-step PPO run with its config overrides (trained once per module)."""
    root = tmp_path_factory.mktemp("ppo_config")
    example = load_example_module()
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = example.train(load_config({"ppo.steps": 2, **RUNS[name]}), str(root / name))
        return made[name]
    return get


def test_a_changed_temperature_is_named_as_the_cause_of_the_responses(ppo_runs, tmp_path):
    summary = rlprobe.compare(ppo_runs("base"), ppo_runs("temperature"), tmp_path / "o")
    assert (summary["first_divergence"]["key"], summary["first_divergence"]["step"]) == ("responses", 0)
    assert summary["config_diff"] == [{"path": "ppo.temperature", "value_a": "1.0", "value_b": "0.7",
                                       "family": "sampling", "ranks": [0]}]
    assert summary["suspect"].startswith("config: sampling setting changed: ppo.temperature: A=1.0, B=0.7 -> "
                                         "responses diverges first at step 0")
    assert [c["path"] for c in summary["config_cause"]] == ["ppo.temperature"]
    md = (tmp_path / "o" / "summary.md").read_text(encoding="utf-8")
    assert "### Config diff" in md and "`ppo.temperature: A=1.0, B=0.7 (sampling)`" in md
    sheet = openpyxl.load_workbook(tmp_path / "o" / "report.xlsx", read_only=True)["Summary"]
    rows = [[c for c in row if c is not None] for row in sheet.iter_rows(values_only=True)]
    at = rows.index(["config diff"])
    assert rows[at + 1] == ["path", "value_a", "value_b", "family"]
    assert rows[at + 2] == ["ppo.temperature", "1.0", "0.7", "sampling"]
    saved = json.loads((tmp_path / "o" / "summary.json").read_text(encoding="utf-8"))
    assert saved["config_diff"] == summary["config_diff"]


def test_a_changed_critic_learning_rate_explains_values_after_the_first_update(ppo_runs, tmp_path):
    summary = rlprobe.compare(ppo_runs("base"), ppo_runs("critic_lr"), tmp_path / "o")
    assert (summary["first_divergence"]["key"], summary["first_divergence"]["step"]) == ("values", 1)
    assert "learning rate changed: ppo.critic_lr: A=0.001, B=0.003 -> values diverges first at step 1" in \
        summary["suspect"]
    # a learning rate cannot explain a divergence at step 0, before any update
    diff = diff_configs(open_dump(ppo_runs("base")), open_dump(ppo_runs("critic_lr")))
    assert causes(diff, {"canonical_key": "values", "step": 0}) == []
    assert [r["path"] for r in causes(diff, {"canonical_key": "values", "step": 1})] == ["ppo.critic_lr"]


def test_a_change_that_does_not_fit_the_divergence_is_listed_but_not_blamed(ppo_runs):
    diff = diff_configs(open_dump(ppo_runs("base")), open_dump(ppo_runs("temperature")))
    assert causes(diff, {"canonical_key": "advantages", "step": 0}) == []  # sampling explains responses, not GAE
    assert [r["path"] for r in causes(diff, {"canonical_key": "old_log_prob", "step": 0})] == ["ppo.temperature"]


def test_a_pair_that_differs_only_in_config_agrees_and_the_gate_names_the_path(ppo_runs, tmp_path):
    a, b = ppo_runs("base"), ppo_runs("note")
    summary = rlprobe.compare(a, b, tmp_path / "o")
    assert summary["first_divergence"] is None and summary["suspect"] is None
    assert summary["config_diff"] == [{"path": "notes.comment", "value_a": None, "value_b": '"second run"',
                                       "family": None, "ranks": [0]}]
    assert summary["config_cause"] == []
    spec = tmp_path / "p.yaml"
    spec.write_text(f"version: 1\nname: cfg\nruns: {{a: {a}, b: {b}}}\noutput: {tmp_path / 'p'}\n"
                    "gates:\n  - {name: config_differs, sql: sql/gates/config_differs.sql}\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "rlprobe.cli", "pipeline", "run", str(spec)],
                          capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "config differs: notes.comment: A=(absent), B=\"second run\"" in done.stdout
    assert "gate config_differs: FAIL (1 rows)" in done.stdout
    # the pipeline's ignore list makes the gate pass
    spec.write_text(spec.read_text(encoding="utf-8") + "compare: {config: {ignore: [notes.*]}}\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "rlprobe.cli", "pipeline", "run", str(spec)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "config: the saved configs agree (1 ignored path(s) differ)" in done.stdout


def test_output_paths_are_ignored_unless_asked_for(ppo_runs, tmp_path):
    a, b = ppo_runs("base"), ppo_runs("elsewhere")
    summary = rlprobe.compare(a, b, tmp_path / "o")
    assert summary["config_diff"] == [] and summary["config_ignored"] == 1
    done = subprocess.run([sys.executable, "-m", "rlprobe.cli", "compare", str(a), str(b), "-o", str(tmp_path / "c"),
                           "--quiet", "--no-default-config-ignore"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert 'config differs: rlprobe_config.dump_path: A="./rlprobe_dump", B="/somewhere/else"' in done.stdout
    done = subprocess.run([sys.executable, "-m", "rlprobe.cli", "compare", str(a), str(ppo_runs("note")), "-o",
                           str(tmp_path / "d"), "--quiet", "--config-ignore", "comment"],
                          capture_output=True, text=True)
    assert "config: the saved configs agree (1 ignored path(s) differ)" in done.stdout


def test_a_run_without_config_is_a_warning(ppo_runs, tmp_path):
    a = ppo_runs("no_config")
    summary = rlprobe.compare(a, ppo_runs("base"), tmp_path / "o")
    assert summary["config_diff"] == []
    assert any(w.startswith("run A saved no config") for w in summary["warnings"])


def test_family_patterns_match_every_trainer_s_names(ppo_runs):
    """One table for TRL, verl and OpenRLHF names (config_families.yaml), by the SQL that uses it."""
    import duckdb
    import pyarrow as pa

    from rlprobe.lake.sql_runner import sql_text

    paths = {"args.learning_rate": "learning_rate", "actor_rollout_ref.actor.optim.lr": "learning_rate",
             "actor_learning_rate": "learning_rate", "ppo.critic_lr": "learning_rate", "args.beta": "kl",
             "algorithm.kl_ctrl.kl_coef": "kl", "init_kl_coef": "kl", "actor_rollout_ref.rollout.temperature":
             "sampling", "args.top_p": "sampling", "args.epsilon": "clip", "actor.clip_ratio": "clip",
             "args.per_device_train_batch_size": "batch", "args.gradient_accumulation_steps": "batch",
             "args.num_iterations": "batch", "actor.entropy_coeff": "entropy", "args.bf16": "precision",
             "models.reference.dtypes": "precision", "args.adam_epsilon": "learning_rate", "args.optim": "learning_rate",
             "args.logging_steps": None, "args.output_dir": None}
    con = duckdb.connect()
    rows = pa.table({"rank": [0] * len(paths), "path": list(paths), "value": ["1"] * len(paths)})
    con.register("configs_a", rows)
    con.register("configs_b", rows.set_column(2, "value", pa.array(["2"] * len(paths))))
    con.register("config_patterns", patterns_table())
    query = f"SELECT path, family, ignored FROM ({sql_text('config_diff.sql')})"
    found = {r[0]: (r[1], r[2]) for r in con.execute(query).fetchall()}
    assert {p: f for p, (f, _) in found.items()} == paths
    assert found["args.output_dir"][1] is True and found["args.logging_steps"][1] is False

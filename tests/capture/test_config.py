"""rlprobe.from_config: the training-config switch, and the advice loop from summary.next_config."""

from __future__ import annotations

import os
import timeit
from types import SimpleNamespace

import duckdb
import pytest
import torch

import rlprobe
from rlprobe.capture.config import ConfiguredProbe, DisabledProbe, parse_config
from rlprobe.capture.stages import NULL_STAGE
from tiny_models import tiny_lm, token_ids


def train(probe, steps: int = 3):
    """A training loop that calls every probe method unconditionally."""
    actor, ref = tiny_lm(layers=1), tiny_lm(seed=1, layers=1)
    probe.save_config({"lr": 1e-6})
    for step in range(steps):
        with probe.stage("actor_compute_log_prob", model=actor), torch.no_grad():
            actor(token_ids(step))
        with probe.stage("reference_compute_log_prob", model=ref), torch.no_grad():
            ref_out = ref(token_ids(step))
        with probe.stage("actor_update", model=actor):
            actor(token_ids(step)).sum().backward()
        probe.save({"ref_log_prob": ref_out.mean()})
        probe.log_metrics({"loss": 1.0})
        probe.step()
    probe.close()


def module_rows(dump) -> list[tuple]:
    return duckdb.sql(f"SELECT DISTINCT stage, step FROM read_parquet('{dump}/stats/module/**/*.parquet') "
                      "ORDER BY ALL").fetchall()


def test_switch_off_writes_no_files_and_costs_nothing(tmp_path):
    for cfg in ({"msprobe_config": {"msprobe": False, "dump_path": str(tmp_path / "d"), "key_data_dump": True}},
                {"rlprobe_config": {"enable": False, "dump_path": str(tmp_path / "d"), "reference_dump": True}},
                {"rlprobe_config": {"dump_path": str(tmp_path / "d")}},  # on, but nothing selected
                {"other": 1}):
        probe = rlprobe.from_config(cfg)
        assert isinstance(probe, DisabledProbe)
        assert probe.stage("actor_update", model=None) is NULL_STAGE
        train(probe)
    assert not (tmp_path / "d").exists()
    probe = DisabledProbe()
    per_call = min(timeit.repeat(lambda: probe.stage("actor_update", model=None), number=10_000, repeat=3)) / 10_000
    assert per_call < 5e-6  # a method call and a constant: nothing installed, nothing allocated


def test_msprobe_config_keys_as_is_yaml_text(tmp_path):
    text = f"""
actor_rollout_ref: {{}}
msprobe_config:
  msprobe: true
  dump_path: "{tmp_path / 'd'}"
  key_data_dump: false
  configurations_dump: true
  actor_train_dump: false
  reference_dump: true
  step_start: 1
  step_end: 1
"""
    probe = rlprobe.from_config(text)
    assert isinstance(probe, ConfiguredProbe)
    train(probe)
    assert module_rows(tmp_path / "d") == [("reference_compute_log_prob", 1)]
    assert (tmp_path / "d" / "configurations.json").exists()
    assert not (tmp_path / "d" / "stats" / "key_data").exists()  # key_data_dump off: save() did nothing
    assert not (tmp_path / "d" / "stats" / "scalar").exists()


def test_actor_train_dump_and_key_data_from_an_object_with_attributes(tmp_path):
    section = SimpleNamespace(msprobe=True, dump_path=str(tmp_path / "d"), key_data_dump=True,
                              actor_train_dump=True, step_start=0, step_end=1)
    probe = rlprobe.from_config(SimpleNamespace(msprobe_config=section))
    train(probe)
    assert module_rows(tmp_path / "d") == [("actor_compute_log_prob", 0), ("actor_compute_log_prob", 1),
                                           ("actor_update", 0), ("actor_update", 1)]
    assert rlprobe.open(tmp_path / "d").arrow("key_data").num_rows == 3
    assert not (tmp_path / "d" / "configurations.json").exists()


def test_yaml_file_and_stages_list(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(f"rlprobe_config:\n  dump_path: {tmp_path / 'd'}\n  stages: [actor_update]\n  tensors: true\n")
    probe = rlprobe.from_config(str(path))
    train(probe, steps=2)
    assert module_rows(tmp_path / "d") == [("actor_update", 0), ("actor_update", 1)]
    assert (tmp_path / "d" / "tensors" / "module" / "stage=actor_update").is_dir()


def test_next_config_from_a_summary_dumps_exactly_that_stage_and_step(tmp_path):
    def ref_run(path, perturb: bool):
        ref = tiny_lm(seed=1, layers=1)
        if perturb:
            with torch.no_grad():
                ref.head.bias.add_(0.5)
        with rlprobe.Probe(path) as probe:
            for step in range(4):
                ids = token_ids(step)
                probe.save({"prompts": ids, "responses": ids})
                with torch.no_grad():
                    out = ref(ids) if step >= 2 or not perturb else tiny_lm(seed=1, layers=1)(ids)
                probe.save({"ref_log_prob": out.mean(-1)})
                probe.step()

    ref_run(tmp_path / "a", False)
    ref_run(tmp_path / "b", True)
    summary = rlprobe.compare(tmp_path / "a", tmp_path / "b", tmp_path / "out", reports=False)
    next_config = summary["next_config"]
    assert next_config["rlprobe_config"]["stages"] == ["reference_compute_log_prob"]
    assert next_config["rlprobe_config"]["step_start"] == 2
    next_config["rlprobe_config"]["dump_path"] = str(tmp_path / "next")
    probe = rlprobe.from_config(next_config)
    train(probe, steps=4)
    assert module_rows(tmp_path / "next") == [("reference_compute_log_prob", 2)]
    assert rlprobe.open(tmp_path / "next").arrow("key_data").num_rows == 4


def test_bad_configs_name_the_key():
    with pytest.raises(rlprobe.ProbeError, match="unknown key.*'dump_pth'"):
        parse_config({"rlprobe_config": {"dump_pth": "x"}})
    with pytest.raises(rlprobe.ProbeError, match=r"msprobe_config.step_start: expected int"):
        parse_config({"msprobe_config": {"step_start": "2"}})
    with pytest.raises(rlprobe.ProbeError, match="step_end 1 is before step_start 3"):
        parse_config({"rlprobe_config": {"step_start": 3, "step_end": 1}})
    with pytest.raises(rlprobe.ProbeError, match="not valid YAML"):
        parse_config("rlprobe_config: [unclosed\n")
    with pytest.raises(rlprobe.ProbeError, match="cannot read the config file"):
        parse_config(os.path.join("no", "such.yaml"))
    assert parse_config({"msprobe_config": {}}).enabled is False  # MindSpeed-RL's default
    assert parse_config({"rlprobe_config": {}}).enabled is True


def test_summed_keys_from_the_config_go_to_the_run_manifest(tmp_path):
    cfg = {"rlprobe_config": {"dump_path": str(tmp_path / "d"), "key_data_dump": True, "summed_keys": ["loss"]}}
    rlprobe.from_config(cfg).close()
    assert rlprobe.open(tmp_path / "d").manifest["summed_keys"] == ["loss"]
    rlprobe.from_config({"rlprobe_config": {"dump_path": str(tmp_path / "e"), "key_data_dump": True}}).close()
    assert rlprobe.open(tmp_path / "e").manifest["summed_keys"] == []  # none: every key compared as its mean
    with pytest.raises(rlprobe.ProbeError, match=r"rlprobe_config.summed_keys: expected list, got str 'loss'"):
        parse_config({"rlprobe_config": {"summed_keys": "loss"}})
    with pytest.raises(rlprobe.ProbeError, match=r"summed_keys=\['loss', 1\]: expected a list of key names"):
        rlprobe.from_config({"rlprobe_config": {"dump_path": str(tmp_path / "f"), "key_data_dump": True,
                                                "summed_keys": ["loss", 1]}})


def test_flush_interval_from_the_config(tmp_path):
    cfg = {"rlprobe_config": {"dump_path": str(tmp_path / "d"), "key_data_dump": True, "flush_interval": 0}}
    probe = rlprobe.from_config(cfg)
    assert probe.probe.writer.flush_interval == 0.0
    probe.save({"x": torch.ones(3)})
    probe.step()
    probe.probe.writer.wait_idle()  # interval 0: committed as the step ends, before any flush
    assert rlprobe.open(tmp_path / "d").rank_manifests[0]["committed_steps"] == [0]
    probe.close()
    default = rlprobe.from_config({"rlprobe_config": {"dump_path": str(tmp_path / "e"), "key_data_dump": True}})
    assert default.probe.writer.flush_interval == 1.0  # the Probe's default
    default.close()
    with pytest.raises(rlprobe.ProbeError, match=r"rlprobe_config.flush_interval: expected float, got str"):
        parse_config({"rlprobe_config": {"flush_interval": "1s"}})
    with pytest.raises(rlprobe.ProbeError, match=r"flush_interval=-1: expected seconds"):
        rlprobe.from_config({"rlprobe_config": {"dump_path": str(tmp_path / "f"), "key_data_dump": True,
                                                "flush_interval": -1}})

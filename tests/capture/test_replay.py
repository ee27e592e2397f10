"""Probe(replay_from=BASELINE).replay(data): the baseline's rollout tensors at this step, rank and
micro-step, in the live value's type and device (rlprobe/capture/replay.py, docs/replay.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import rlprobe
from rlprobe.errors import ProbeError


def rollout(step: int, micro: int) -> dict:
    """A baseline's rollout of one micro-batch: responses whose length differs per micro-step."""
    g = torch.Generator().manual_seed(100 * step + micro)
    return {"prompts": torch.randint(0, 50, (2, 4), generator=g),
            "responses": torch.randint(0, 50, (2, 3 + micro), generator=g),
            "response_mask": torch.rand(2, 3 + micro, generator=g) > 0.3,
            "rewards": torch.randn(2, generator=g).to(torch.bfloat16),
            "scores": np.random.default_rng(step * 7 + micro).standard_normal(2).astype(np.float16)}


@pytest.fixture
def baseline(tmp_path):
    path = tmp_path / "baseline"
    with rlprobe.Probe(path) as probe:
        for step in range(2):
            for micro in range(2):
                probe.save(rollout(step, micro))
            probe.step()
    return path


def live(micro: int = 0) -> dict:
    """This run's own values: other tokens, another length, the same layouts."""
    return {"prompts": torch.full((2, 4), 7), "responses": torch.full((2, 9), 7),
            "response_mask": torch.ones(2, 9, dtype=torch.bool), "rewards": torch.zeros(2, dtype=torch.bfloat16),
            "scores": np.zeros(2, np.float16)}


def test_replay_returns_the_baseline_tensors_of_each_step_and_micro_step_bitwise(baseline, tmp_path):
    with rlprobe.Probe(tmp_path / "b", replay_from=baseline) as probe:
        for step in range(2):
            for micro in range(2):
                got = probe.replay(live())
                want = rollout(step, micro)
                for key in ("prompts", "responses", "response_mask", "rewards"):
                    assert isinstance(got[key], torch.Tensor) and got[key].dtype == want[key].dtype, key
                    assert torch.equal(got[key].view(torch.int16) if key == "rewards" else got[key],
                                       want[key].view(torch.int16) if key == "rewards" else want[key]), key
                assert isinstance(got["scores"], np.ndarray) and got["scores"].dtype == np.float16
                assert got["scores"].tobytes() == want["scores"].tobytes()
                probe.save(got)  # the save takes the micro-step the replay read
            probe.step()
    replayed, base = rlprobe.open(tmp_path / "b"), rlprobe.open(baseline)
    for micro in range(2):
        assert np.array_equal(replayed.tensor("responses", 1, 0, micro), base.tensor("responses", 1, 0, micro))


def test_replay_reads_the_micro_step_the_next_save_of_each_key_gets(baseline, tmp_path):
    with rlprobe.Probe(tmp_path / "b", replay_from=baseline) as probe:
        probe.save({"prompts": torch.zeros(2, 4, dtype=torch.int64)})  # prompts: micro-step 0 taken
        got = probe.replay({"prompts": torch.zeros(2, 4, dtype=torch.int64),
                            "responses": torch.zeros(2, 1, dtype=torch.int64)})
        assert torch.equal(got["prompts"], rollout(0, 1)["prompts"])
        assert torch.equal(got["responses"], rollout(0, 0)["responses"])
        assert torch.equal(probe.replay({"responses": torch.zeros(2, 1, dtype=torch.int64)}, micro_step=1)["responses"],
                           rollout(0, 1)["responses"])


def test_replay_off_returns_the_live_values_themselves(tmp_path):
    data = live()
    with rlprobe.Probe(tmp_path / "b") as probe:
        assert probe.replay(data) is data
    assert "replay_from" not in json.loads((tmp_path / "b" / "rlprobe.json").read_text())


def test_the_run_manifest_records_the_baseline(baseline, tmp_path):
    with rlprobe.Probe(tmp_path / "b", replay_from=baseline):
        pass
    record = json.loads((tmp_path / "b" / "rlprobe.json").read_text())["replay_from"]
    assert record == {"path": str(baseline.resolve()), "run_id": rlprobe.open(baseline).manifest["run_id"]}


def test_a_missing_row_names_key_step_rank_and_micro_step(baseline, tmp_path):
    with rlprobe.Probe(tmp_path / "b", replay_from=baseline) as probe:
        with pytest.raises(ProbeError, match=r"key 'responses' step 0 rank 0 micro_step 2: the baseline has no row "
                                             r"of it; it holds 'responses' at micro_step\(s\) 0, 1 of step 0"):
            probe.replay({"responses": torch.zeros(2, 1, dtype=torch.int64)}, micro_step=2)
        with pytest.raises(ProbeError, match=r"key 'values' step 0 rank 0 micro_step 0: .*holds no 'values'"):
            probe.replay({"values": torch.zeros(2)})
        probe.step(), probe.step()
        with pytest.raises(ProbeError, match=r"key 'prompts' step 2 rank 0 micro_step 0: .*at step\(s\) 0, 1 of rank 0"):
            probe.replay({"prompts": torch.zeros(2, 4, dtype=torch.int64)})


def test_a_layout_that_does_not_fit_names_both_layouts(baseline, tmp_path):
    with rlprobe.Probe(tmp_path / "b", replay_from=baseline) as probe:
        with pytest.raises(ProbeError, match=r"key 'responses' step 0 rank 0 micro_step 0: .*baseline int64 \[2, 3\], "
                                             r"live float32 \[2, 3\]"):
            probe.replay({"responses": torch.zeros(2, 3)})
        with pytest.raises(ProbeError, match=r"key 'prompts' .*baseline int64 \[2, 4\], live int64 \[8\]"):
            probe.replay({"prompts": torch.zeros(8, dtype=torch.int64)})
        with pytest.raises(ProbeError, match=r"key 'prompts' .*needs the live value.*got list"):
            probe.replay({"prompts": [1, 2]})


def test_a_baseline_without_tensors_is_refused_at_probe(tmp_path):
    stats = tmp_path / "stats"
    with rlprobe.Probe(stats, stats_only=True) as probe:
        probe.save({"responses": torch.zeros(2, 3, dtype=torch.int64)})
    (tmp_path / "plain").mkdir()
    cases = [(stats, "is statistics-only"), (tmp_path / "plain", "is not a dump"),
             (tmp_path / "missing", "does not exist")]
    for source, what in cases:
        with pytest.raises(ProbeError, match=f"replay_from='{source}': .*{what}"):
            rlprobe.Probe(tmp_path / "b", replay_from=source)
        assert not (tmp_path / "b").exists()  # refused before anything was written


def test_a_baseline_without_this_rank_is_refused_at_probe(baseline, tmp_path):
    with pytest.raises(ProbeError, match=r"holds no tensor files for rank 1 \(0 key-data rows"):
        rlprobe.Probe(tmp_path / "b", replay_from=baseline, rank=1, world_size=2)


def test_a_bad_baseline_loses_nothing_of_the_dump_it_would_append_to(baseline, tmp_path):
    run = tmp_path / "run"
    with rlprobe.Probe(run) as probe:
        probe.save({"loss": torch.tensor(1.5)})
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with pytest.raises(ProbeError, match="is the probe's own dump directory"):
        rlprobe.Probe(run, mode="overwrite", replay_from=run)
    with pytest.raises(ProbeError, match="statistics-only|does not exist"):
        rlprobe.Probe(run, mode="append", replay_from=tmp_path / "missing")
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    assert float(rlprobe.open(run).tensor("loss", 0)) == 1.5


def test_from_config_replays_from_the_config_s_baseline(baseline, tmp_path):
    cfg = {"rlprobe_config": {"dump_path": str(tmp_path / "b"), "key_data_dump": True, "replay_from": str(baseline)}}
    with rlprobe.from_config(cfg) as probe:
        assert torch.equal(probe.replay(live())["responses"], rollout(0, 0)["responses"])
    off = rlprobe.from_config({"rlprobe_config": {"enable": False}})
    data = live()
    assert off.replay(data) is data


@pytest.mark.parametrize("section, message", [
    ({"key_data_dump": True, "replay_from": 3}, r"rlprobe_config.replay_from: expected str, got int 3"),
    ({"key_data_dump": True, "replay_from": ""}, r"rlprobe_config.replay_from: expected the baseline dump's directory"),
    ({"replay_from": "base", "grads_dump": True}, r"rlprobe_config.replay_from needs key_data_dump: true"),
    ({"enable": False, "key_data_dump": True, "replay_from": "base"}, r"replay_from is set but the section is "
                                                                      r"switched off \(enable: false\)"),
])
def test_bad_replay_configs_name_the_field(section, message):
    with pytest.raises(ProbeError, match=message):
        rlprobe.from_config({"rlprobe_config": section})


def test_an_msprobe_baseline_replays_its_tokens_in_the_live_integer_dtype(tmp_path):
    # msprobe stores int64 tokens as float32 and records no dtype: they come back as the live value's integers
    source = Path(__file__).resolve().parents[1] / "fixtures" / "msprobe" / "keydata" / "run_a"
    with rlprobe.Probe(tmp_path / "b", replay_from=source) as probe:
        got = probe.replay({"responses": torch.zeros(1, 1, dtype=torch.int64), "log_prob": torch.zeros(1, 1)},
                           micro_step=1)
    stored = rlprobe.open(source).tensor("responses", 0, 0, 1)
    assert stored.dtype == np.float32 and got["responses"].dtype == torch.int64
    assert np.array_equal(got["responses"].numpy(), stored)
    assert got["log_prob"].dtype == torch.float32
    assert got["log_prob"].numpy().tobytes() == rlprobe.open(source).tensor("log_prob", 0, 0, 1).tobytes()


def test_low_precision_floats_come_back_bit_for_bit(tmp_path):
    values = {"bf16": torch.randn(3, 5, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16),
              "fp16": torch.randn(4, generator=torch.Generator().manual_seed(2)).half(),
              "fp8": torch.randn(6, generator=torch.Generator().manual_seed(3)).to(torch.float8_e4m3fn)}
    with rlprobe.Probe(tmp_path / "a") as probe:
        probe.save(values)
    with rlprobe.Probe(tmp_path / "b", replay_from=tmp_path / "a") as probe:
        got = probe.replay({k: torch.zeros(1, dtype=torch.float32).reshape([1] * v.dim()) for k, v in values.items()})
    for key, want in values.items():
        assert got[key].dtype == want.dtype, key  # the baseline's dtype, not the live float32
        assert got[key].view(torch.uint8).tolist() == want.view(torch.uint8).tolist(), key


def test_python_numbers_and_numpy_scalars_come_back_as_such(tmp_path):
    with rlprobe.Probe(tmp_path / "a") as probe:
        probe.save({"loss": 1.25, "count": 7, "scale": np.float32(0.5)})
    with rlprobe.Probe(tmp_path / "b", replay_from=tmp_path / "a") as probe:
        got = probe.replay({"loss": 0.0, "count": 0, "scale": np.float32(0)})
    assert got == {"loss": 1.25, "count": 7, "scale": np.float32(0.5)}
    assert type(got["loss"]) is float and type(got["count"]) is int and type(got["scale"]) is np.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_value_gets_the_baseline_on_its_own_device(baseline, tmp_path):
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    with rlprobe.Probe(tmp_path / "b", replay_from=baseline) as probe:
        got = probe.replay({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in live().items()})
    assert got["responses"].device == device and got["rewards"].device == device
    assert torch.equal(got["responses"].cpu(), rollout(0, 0)["responses"])

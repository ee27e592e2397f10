"""rlprobe.compat.msprobe.SingleSave: msprobe's call shape, an rlprobe dump underneath."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlprobe
from rlprobe.compat.msprobe import SingleSave


@pytest.fixture(autouse=True)
def _close_all():
    yield
    SingleSave.close()


def test_single_save_writes_rlprobe_dump_with_msprobe_step_semantics(tmp_path):
    SingleSave(str(tmp_path / "d"), fmk="pytorch")
    SingleSave.save_config({"algorithm": "grpo"})
    for step in range(2):
        for micro in range(3):
            SingleSave.save({"response": torch.full((2, 3), step * 10 + micro), "pair": [torch.ones(1), torch.zeros(1)]})
        SingleSave.save({"kl_loss": torch.tensor(0.1 * step)})
        SingleSave.step()
    SingleSave.close()
    d = rlprobe.open(tmp_path / "d")
    assert d.complete and d.configs()[0] == {"algorithm": "grpo"}
    kd = d.key_data().collect()
    assert kd.filter(kd["key"] == "response").height == 6
    assert d.tensor("response", 1, 0, 2).tolist() == [[12] * 3] * 2
    assert d.tensor("response", 1, 0, 2).dtype == np.int64
    assert d.tensor("pair", 0, 0, 1, "1").tolist() == [0.0]
    assert kd.filter(kd["key"] == "kl_loss")["micro_step"].to_list() == [0, 0]
    assert set(kd["framework"].to_list()) == {"torch"}


def test_second_dump_path_really_switches(tmp_path):
    SingleSave(str(tmp_path / "a"))
    SingleSave.save({"x": torch.ones(2)})
    SingleSave(str(tmp_path / "b"))
    SingleSave.save({"y": torch.zeros(2)})
    SingleSave.close()
    assert rlprobe.open(tmp_path / "a").key_data().collect()["key"].to_list() == ["x"]
    assert rlprobe.open(tmp_path / "b").key_data().collect()["key"].to_list() == ["y"]


def test_mindspore_fmk(tmp_path):
    import mindspore as ms

    SingleSave(str(tmp_path / "m"), fmk="mindspore")
    SingleSave.save({"log_prob": ms.Tensor(np.array([-1.0, -2.0], np.float32))})
    SingleSave.close()
    kd = rlprobe.open(tmp_path / "m").key_data().collect()
    assert kd["framework"].to_list() == ["mindspore"] and kd["min"].to_list() == [-2.0]


def test_bad_use_is_explained(tmp_path):
    with pytest.raises(rlprobe.ProbeError, match="fmk"):
        SingleSave(str(tmp_path / "z"), fmk="jax")
    SingleSave.close()
    with pytest.raises(rlprobe.ProbeError, match="create one first"):
        SingleSave.save({"x": torch.ones(1)})

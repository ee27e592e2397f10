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


def test_save_ex_puts_keys_at_the_given_micro_step_and_leaves_saves_count_alone(tmp_path):
    """msprobe 8.1.2's save_ex: micro_batch=None is the folder without micro_step<M> (micro-step 0
    here), micro_batch=M that micro-step; neither moves the micro-step save() gives the key next."""
    SingleSave(str(tmp_path / "d"))
    SingleSave.save_ex({"x": torch.full((2,), 1.0)})
    SingleSave.save_ex({"x": torch.full((2,), 2.0)}, micro_batch=3)
    SingleSave.save({"x": torch.full((2,), 3.0)})
    SingleSave.save({"x": torch.full((2,), 4.0)})
    SingleSave.step()
    SingleSave.save_ex({"y": [torch.ones(1), torch.zeros(1)]}, micro_batch=1)
    SingleSave.close()
    kd = rlprobe.open(tmp_path / "d").key_data().collect().sort(["key", "step", "micro_step", "min"])
    rows = list(zip(kd["key"].to_list(), kd["step"].to_list(), kd["micro_step"].to_list(), kd["min"].to_list()))
    assert rows == [("x", 0, 0, 1.0), ("x", 0, 0, 3.0), ("x", 0, 1, 4.0), ("x", 0, 3, 2.0),
                    ("y", 1, 1, 0.0), ("y", 1, 1, 1.0)]


def test_data_that_is_not_a_dict_is_warned_about_and_not_saved(tmp_path):
    SingleSave(str(tmp_path / "d"))
    for call in (lambda: SingleSave.save([torch.ones(1)]), lambda: SingleSave.save_ex(torch.ones(1), micro_batch=0)):
        with pytest.warns(RuntimeWarning) as caught:
            call()
        assert [str(w.message) for w in caught] == [
            "SingleSave data type not valid, should be dict. Skip current save process."]
    SingleSave.save({"x": torch.ones(1)})  # the probe is still usable, and x is the save's first micro-step
    SingleSave.close()
    kd = rlprobe.open(tmp_path / "d").key_data().collect()
    assert list(zip(kd["key"].to_list(), kd["micro_step"].to_list())) == [("x", 0)]


@pytest.mark.parametrize("bad", [0, -1, 129, True, 2.0, "4"])
def test_single_comparator_takes_only_msprobe_process_counts(tmp_path, bad):
    from rlprobe.compat.msprobe import SingleComparator

    a, b = tmp_path / "a", tmp_path / "b"
    for path in (a, b):
        SingleSave(str(path))
        SingleSave.save({"x": torch.ones(2)})
        SingleSave.close()
    with pytest.raises(ValueError, match="process_num"):
        SingleComparator.compare(str(a), str(b), str(tmp_path / "out"), num_processes=bad)
    assert not (tmp_path / "out").exists()
    summary = SingleComparator.compare(str(a), str(b), str(tmp_path / "ok"), num_processes=128)
    assert summary["first_divergence"] is None and (tmp_path / "ok" / "x.xlsx").is_file()

"""lake/atomic.py: atomic writes into folders it remembers having made, also after they vanish."""

from __future__ import annotations

import shutil

import numpy as np

from rlprobe.lake.atomic import atomic_save_npy, atomic_write_json


def test_a_folder_removed_after_a_write_is_made_again(tmp_path):
    target = tmp_path / "dump" / "tensors" / "a.npy"
    atomic_save_npy(target, np.arange(3))
    shutil.rmtree(tmp_path / "dump")  # e.g. mode="overwrite" removing an old dump
    atomic_save_npy(target, np.arange(4))
    np.testing.assert_array_equal(np.load(target), np.arange(4))
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.npy"]  # no temporaries left


def test_json_lands_in_a_new_folder(tmp_path):
    atomic_write_json(tmp_path / "x" / "y" / "m.json", {"a": 1})
    assert (tmp_path / "x" / "y" / "m.json").read_text().replace(" ", "").replace("\n", "") == '{"a":1}'

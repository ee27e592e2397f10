"""lake/atomic.py: atomic writes into folders it remembers having made, also after they vanish."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest

from rlprobe.lake.atomic import AtomicFolder, atomic_save_npy, atomic_write_json


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


def test_npy_bytes_are_those_of_np_save_for_every_layout(tmp_path):
    """atomic_save_npy writes a cached header and the data with one writev: the file must be
    byte for byte what np.save writes for the C-ordered array (0-d, empty, bool, F-ordered,
    strided, 64 dimensions)."""
    import io

    arrays = [np.arange(5), np.zeros((8, 8), np.float32), np.array(3.5), np.zeros((0, 3)), np.ones((2, 3), bool),
              np.arange(12).reshape(3, 4).T, np.arange(10)[::2], np.zeros((2,), np.uint16), np.zeros((1,) * 64)]
    for i, array in enumerate(arrays + arrays):  # the second time from the header cache
        target = tmp_path / f"a{i}.npy"
        size = atomic_save_npy(target, array)
        expected = io.BytesIO()
        np.save(expected, np.asarray(array, order="C"))
        assert target.read_bytes() == expected.getvalue(), array.shape
        assert size == len(expected.getvalue())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_folders_are_made_again_after_a_deeper_one_vanished(tmp_path):
    """The writer remembers folders; one removed (mode="append" dropping an uncommitted step)
    is made again together with the folders below it."""
    atomic_save_npy(tmp_path / "t" / "step=1" / "rank=0" / "a.npy", np.arange(2))
    shutil.rmtree(tmp_path / "t" / "step=1")
    atomic_save_npy(str(tmp_path / "t" / "step=1" / "rank=0" / "b.npy"), np.arange(3))  # a str path too
    np.testing.assert_array_equal(np.load(tmp_path / "t" / "step=1" / "rank=0" / "b.npy"), np.arange(3))


def test_a_folder_appears_complete_at_its_rename(tmp_path):
    """AtomicFolder: files go into a hidden temporary folder; commit() publishes them all at once."""
    final = tmp_path / "tensors" / "step=0" / "rank=0" / "call=0"
    folder = AtomicFolder(str(final))
    arrays = {"a.npy": np.arange(5), "b@0.npy": np.array(2.5), "c.npy": np.zeros((0, 3), np.float32)}
    for name, array in arrays.items():
        folder.save_npy(name, array)
        assert not final.exists()  # nothing visible before the rename
        (hidden,) = final.parent.iterdir()
        assert hidden.name.startswith(".call=0.tmp-")
    folder.commit()
    assert sorted(p.name for p in final.parent.iterdir()) == ["call=0"]
    assert sorted(p.name for p in final.iterdir()) == sorted(arrays)
    for name, array in arrays.items():
        expected = io.BytesIO()
        np.save(expected, array)
        assert (final / name).read_bytes() == expected.getvalue()
    assert folder.files == 3 and folder.nbytes == sum((final / n).stat().st_size for n in arrays)


def test_a_folder_without_files_is_not_made(tmp_path):
    folder = AtomicFolder(str(tmp_path / "call=0"))
    folder.commit()
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_be_renamed_into_place_leaves_nothing_behind(tmp_path):
    final = tmp_path / "call=0"
    final.mkdir()
    (final / "other.npy").write_bytes(b"already there")
    folder = AtomicFolder(str(final))
    folder.save_npy("a.npy", np.arange(3))
    with pytest.raises(OSError):
        folder.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["call=0"]  # the temporary folder is removed
    assert sorted(p.name for p in final.iterdir()) == ["other.npy"]  # and what was there is untouched


def test_a_file_that_fails_half_way_is_removed(tmp_path, monkeypatch):
    """A write that fails (a full disk) must not leave a part-written file to be renamed into place."""
    import rlprobe.lake.atomic as atomic

    folder = AtomicFolder(str(tmp_path / "call=0"))
    folder.save_npy("good.npy", np.arange(3))

    def fail(fd, header, data):
        import os

        os.write(fd, header)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "write_all", fail)
    with pytest.raises(OSError, match="No space"):
        folder.save_npy("bad.npy", np.arange(4))
    monkeypatch.undo()
    folder.commit()
    assert sorted(p.name for p in (tmp_path / "call=0").iterdir()) == ["good.npy"]


def test_json_files_are_a_key_a_line_and_read_back_as_json_wrote_them(tmp_path):
    """atomic_write_json(key_lines=True), as rank manifests are written: json's C encoder (no indent) for each
    value, the same data, a top-level key a line; without it, indented as before."""
    import json

    from rlprobe.lake.atomic import atomic_write_json

    cases = [{"run_id": "r", "committed_steps": list(range(3)), "rows": {"key_data": 3}, "errors": ['a "b"\n'],
              "x": float("nan"), "path": tmp_path},
             {}, [1, {"a": None}], {1: "int key", "b": 2}, "text"]
    for obj in cases:
        for key_lines in (True, False):
            atomic_write_json(tmp_path / "m.json", obj, key_lines=key_lines)
            text = (tmp_path / "m.json").read_text(encoding="utf-8")
            assert json.dumps(json.loads(text)) == json.dumps(obj, default=str)  # NaN and all
    assert text == json.dumps(cases[-1], indent=2)
    atomic_write_json(tmp_path / "m.json", cases[0], key_lines=True)
    text = (tmp_path / "m.json").read_text(encoding="utf-8")
    back = json.loads(text)
    assert back["committed_steps"] == [0, 1, 2] and back["errors"] == ['a "b"\n'] and back["path"] == str(tmp_path)
    assert back["x"] != back["x"]  # NaN, as json writes it
    assert text.splitlines()[1:3] == ['  "run_id": "r",', '  "committed_steps": [0, 1, 2],']

"""A job of small pairs reads its files in compiled code (rlprobe/checks/kernels.pyx, reduce_batch): files that are
not numpy's plain float32 layout are read by numpy in the middle of the job with the same figures, a
missing or truncated file is named, and the pair column of a long table is cut into chunks."""

from __future__ import annotations

import gc
import io
import re
import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import rlprobe
from rlprobe.checks import token_batch
from rlprobe.checks import token_tables as token_tables_module
from rlprobe.checks.inputs import stats_table
from rlprobe.checks.run import collections_paused
from rlprobe.checks.token_tables import tensor_rows, token_tables
from rlprobe.errors import DumpReadError
from rlprobe.lake import npy_header
from rlprobe.lake.reader import open_dump

from tests.lake.layouts import rewrite_record, unpack

def small_steps(path, steps=6):
    rng = np.random.default_rng(5)
    with rlprobe.Probe(path, flush_interval=0) as p:
        for _ in range(steps):
            old = -rng.random((4, 33), dtype=np.float32) * 3
            p.save({"rollout_log_prob": old + rng.normal(0, 0.02, old.shape).astype(np.float32), "old_log_prob": old,
                    "response_mask": rng.random(old.shape) > 0.25})
            p.step()
    return open_dump(path)


preload = token_batch._preload


def tensor_path(dump, key, step):
    rows = tensor_rows(stats_table(dump))
    return dump.path / next(r["tensor_file"] for k, r in rows.items() if k[0] == key and k[1] == step)


def frames(dump, workers=1):
    return {name: t.to_pandas() for name, t in token_tables(dump, stats_table(dump), 0.2, workers=workers).items()}


def tensor_row(dump, key, step):
    rows = tensor_rows(stats_table(dump))
    return next(r for k, r in rows.items() if k[0] == key and k[1] == step)


@pytest.mark.skipif(not npy_header.COMPILED_READS, reason="compiled reads are POSIX only")
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "a file a tensor"])
@pytest.mark.parametrize("layout", ["version 2.0 header", "fortran order", "uint8 mask"])
def test_files_numpy_must_read_are_read_in_the_middle_of_the_job(tmp_path, monkeypatch, layout, packed):
    """A record of a packed file (rewritten in place, the same length) or a whole file (the layout before)."""
    dump = small_steps(tmp_path / "d")
    if not packed:
        unpack(dump.path)
        dump = open_dump(dump.path)
    expected = frames(dump)
    changed = tmp_path / "changed"
    shutil.copytree(dump.path, changed)
    dump = open_dump(changed)
    key = "response_mask" if layout == "uint8 mask" else "old_log_prob"
    row = tensor_row(dump, key, 3)
    x = dump.load_row_tensor(row)
    f = io.BytesIO()
    if layout == "version 2.0 header":
        np.lib.format.write_array(f, x, version=(2, 0))
    elif layout == "fortran order":
        np.lib.format.write_array(f, np.asfortranarray(x), version=(1, 0))
    else:  # a byte a token, read in compiled code as the bool mask was
        np.lib.format.write_array(f, x.astype(np.uint8), version=(1, 0))
    if packed:
        rewrite_record(changed, row, f.getvalue())
    else:
        (changed / row["tensor_file"]).write_bytes(f.getvalue())
    preloaded = []
    monkeypatch.setattr(token_batch, "_preload", lambda *a: preloaded.append(a[1]) or preload(*a))
    monkeypatch.setattr(token_tables_module, "_reduce_parts", None)  # the job goes on: never a key at a time
    got = frames(dump)
    assert [(p.a["step"], p.pair) for p in preloaded] == ([] if layout == "uint8 mask" else [(3, "rollout_vs_old")])
    for name, frame in expected.items():
        pd.testing.assert_frame_equal(got[name], frame, check_exact=True, obj=name)


def test_a_missing_or_truncated_file_is_named(tmp_path):
    """Whole files (the layout before packed files); a packed file cut short: tests/lake/test_tensor_pack.py."""
    dump = small_steps(tmp_path / "d")
    unpack(dump.path)
    dump = open_dump(dump.path)
    path = tensor_path(dump, "rollout_log_prob", 4)
    path.write_bytes(path.read_bytes()[:-9])
    with pytest.raises(DumpReadError, match=re.escape(f"{path}: cannot read tensor")):
        frames(dump)
    path.unlink()
    with pytest.raises(DumpReadError, match=re.escape(f"{path}: cannot read tensor")):
        frames(dump)


@pytest.mark.skipif(not npy_header.COMPILED_READS, reason="compiled reads are POSIX only")
def test_files_are_opened_from_a_folder_of_the_dump_and_a_missing_folder_is_named(tmp_path):
    dump = small_steps(tmp_path / "d")
    parts = token_tables_module.pairs(tensor_rows(stats_table(dump)))
    plan = token_batch._plan([(k, [p]) for k, p in enumerate(parts)])
    names = bytes(plan.paths)
    for part in plan.parts:
        for at, folder in zip(part[5:8], part[10:13]):  # a, b, mask: the packed file's name in its rank's folder
            name = names[at:names.index(b"\0", at)].decode()
            assert "/" not in name and (dump.path / plan.folders[folder] / name).is_file()
    expected = frames(dump)
    assert len(plan.parts) == len(expected["token_steps"]) == 6 and plan.folders == ["tensors/key_data/rank=0"]
    shutil.rmtree(dump.path / plan.folders[0])  # every step's files in it
    with pytest.raises(DumpReadError, match=re.escape(f"{tensor_path(dump, 'old_log_prob', 0)}: cannot read tensor")):
        frames(dump)


def test_the_pair_column_is_cut_into_chunks_past_32_bit_offsets(monkeypatch):
    keys = [("rollout_vs_old", 1, 0), ("on_policy", 2, 1), ("rollout_vs_old", 3, 0)]
    sizes = np.array([3, 0, 2], np.int64)
    whole = token_batch._pairs(keys, sizes)
    monkeypatch.setattr(token_batch, "STRING_BYTES", 20)
    cut = token_batch._pairs(keys, sizes)
    expected = ["rollout_vs_old"] * 3 + ["rollout_vs_old"] * 2
    assert whole.num_chunks == 1 and cut.num_chunks == 3 and cut.type == pa.string()
    assert whole.to_pylist() == cut.to_pylist() == expected


def test_the_garbage_collector_is_back_as_it_was_after_the_token_phase():
    assert gc.isenabled()
    with collections_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(RuntimeError):
            with collections_paused():
                raise RuntimeError("a failing phase")
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()

"""Every failure path of capture: a clear ProbeError (or a warning), and a dump that stays readable.

Bad values and names, a dump path that is a file, read-only and full file systems, existing
runs (refused / overwrite / append), a writer killed mid-step, and misuse of the API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch

import rlprobe
from rlprobe import ProbeError


# -- helpers -----------------------------------------------------------------------------
def good(step: int, n: int = 8) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) * 0.5 + step


def make_probe(path: Path, **kw) -> rlprobe.Probe:
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return rlprobe.Probe(path, **kw)


def rows_of(path: Path) -> list[dict]:
    return rlprobe.open(path).key_data().sort("step", "key", "micro_step", "index").collect().to_dicts()


def assert_step_readable(path: Path, step: int, key: str = "x", n: int = 8) -> None:
    dump = rlprobe.open(path)
    got = dump.tensor(key, step)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, good(step, n).numpy())
    row = [r for r in rows_of(path) if r["key"] == key and r["step"] == step]
    assert len(row) == 1
    assert row[0]["max"] == float(good(step, n).max())


def tmp_names(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".") and ".tmp-" in p.name]


@pytest.fixture(autouse=True)
def _no_env_run_id(monkeypatch):
    monkeypatch.delenv("RLPROBE_RUN_ID", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


@pytest.fixture
def started(tmp_path):
    """A probe with step 0 written and flushed; closed (if still open) at teardown."""
    path = tmp_path / "dump"
    probe = make_probe(path)
    probe.save({"x": good(0)})
    probe.step()
    probe.flush()
    yield probe, path
    if not probe.closed:
        probe.close()


def finish_and_check(probe: rlprobe.Probe, path: Path, *, keys_in_step1: set[str] = frozenset({"x"})) -> None:
    """After a refused call: the probe still works, step 0 is intact, the refused call saved nothing."""
    probe.save({"x": good(1)})
    probe.step()
    probe.close()
    dump = rlprobe.open(path)
    assert dump.complete is True
    rows = rows_of(path)
    assert {(r["key"], r["step"], r["micro_step"]) for r in rows} == {("x", 0, 0), ("x", 1, 0)}
    assert_step_readable(path, 0)
    assert_step_readable(path, 1)
    assert dump.rank_manifests[0]["committed_steps"] == [0, 1]


# -- bad values and names ----------------------------------------------------------------
class Opaque:
    pass


BAD_VALUES = [
    pytest.param({"resp": "some text"}, ["'resp'", "step 1", "str"], id="string"),
    pytest.param({"resp": Opaque()}, ["'resp'", "step 1", "Opaque"], id="object"),
    pytest.param({"resp": [torch.ones(2), "oops"]}, ["'resp'", "step 1", "index '1'", "str"], id="string-in-list"),
    pytest.param({"resp": {"a": {"b": object()}}}, ["'resp'", "step 1", "index 'a.b'"], id="object-in-nested-dict"),
    pytest.param({"resp": torch.ones(2, dtype=torch.complex64)}, ["'resp'", "step 1", "complex"], id="complex-tensor"),
    pytest.param({"resp": np.array(["a", "b"])}, ["'resp'", "step 1", "dtype"], id="numpy-strings"),
    pytest.param({"resp": 3 + 4j}, ["'resp'", "step 1", "complex"], id="python-complex"),
    pytest.param({1: torch.ones(2)}, ["step 1", "key must be a string", "int"], id="int-key"),
    pytest.param({("a", "b"): torch.ones(2)}, ["step 1", "key must be a string", "tuple"], id="tuple-key"),
    pytest.param({"": torch.ones(2)}, ["step 1", "empty"], id="empty-key"),
    pytest.param({"   ": torch.ones(2)}, ["step 1", "empty"], id="blank-key"),
    pytest.param({"../x": torch.ones(2)}, ["step 1", "'../x'", "outside the dump"], id="dotdot-key"),
    pytest.param({"a/../../x": torch.ones(2)}, ["step 1", "'a/../../x'", "outside the dump"], id="inner-dotdot-key"),
    pytest.param({"..": torch.ones(2)}, ["step 1", "'..'", "outside the dump"], id="dotdot-only-key"),
    pytest.param({"/abs": torch.ones(2)}, ["step 1", "'/abs'", "outside the dump"], id="absolute-key"),
    pytest.param({"a\\..\\..\\x": torch.ones(2)}, ["step 1", "outside the dump"], id="backslash-key"),
    pytest.param({"a\x00b": torch.ones(2)}, ["step 1", "NUL"], id="nul-key"),
    pytest.param({"resp": {1: torch.ones(2)}}, ["'resp'", "step 1", "dict key must be a string", "int"],
                 id="int-dict-key-in-value"),
    pytest.param({"resp": {None: torch.ones(2)}}, ["'resp'", "step 1", "dict key must be a string"],
                 id="none-dict-key-in-value"),
    pytest.param({"resp": {"": torch.ones(2)}}, ["'resp'", "step 1", "empty"], id="empty-dict-key-in-value"),
    pytest.param({"resp": {"../x": torch.ones(2)}}, ["'resp'", "step 1", "'../x'", "outside the dump"],
                 id="dotdot-dict-key-in-value"),
]


@pytest.mark.parametrize("data, words", BAD_VALUES)
def test_bad_value_raises_and_saves_nothing(started, data, words):
    probe, path = started  # now at step 1: messages must name it
    with pytest.raises(ProbeError) as err:
        # a good leaf in the same call must not be half-saved
        probe.save({"fine": torch.ones(3), **data})
    msg = str(err.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    assert_step_readable(path, 0)
    finish_and_check(probe, path)
    assert not any(p.name.startswith("key=fine") for p in (path / "tensors" / "key_data").iterdir())


def test_bad_value_after_earlier_save_in_same_step_keeps_micro_steps(started):
    probe, path = started
    probe.save({"x": good(1)})
    with pytest.raises(ProbeError, match="'x'"):
        probe.save({"x": "not a tensor"})
    probe.save({"x": good(1) * 2})
    probe.close()
    rows = [r for r in rows_of(path) if r["step"] == 1]
    assert [r["micro_step"] for r in rows] == [0, 1]
    np.testing.assert_array_equal(rlprobe.open(path).tensor("x", 1, micro_step=1), (good(1) * 2).numpy())


def test_names_with_separators_stay_inside_the_dump(tmp_path):
    path = tmp_path / "dump"
    names = ["a/b", ".hidden", "a\\b", "x" * 300, "ключ", "sp ace"]
    with make_probe(path) as probe:
        probe.save({n: torch.full((2,), float(i)) for i, n in enumerate(names)})
        probe.save({"nested": {"p/q": torch.ones(1), ".dot": torch.zeros(1)}})
        probe.step()
    assert [p.name for p in tmp_path.iterdir()] == ["dump"]
    dump = rlprobe.open(path)
    for i, n in enumerate(names):
        np.testing.assert_array_equal(dump.tensor(n, 0), np.full((2,), float(i), np.float32))
    indexes = {r["index"] for r in rows_of(path) if r["key"] == "nested"}
    assert indexes == {"p/q", ".dot"}
    for r in rows_of(path):
        f = (path / r["tensor_file"]).resolve()
        assert f.is_relative_to(path.resolve()), f
        assert not f.name.startswith("."), f  # a dot-file would look like a temporary


def test_save_non_dict_raises(started):
    probe, path = started
    for bad in ([torch.ones(2)], torch.ones(2), "x", None):
        with pytest.raises(ProbeError, match=r"step 1.*save\(\) takes a dict"):
            probe.save(bad)
    finish_and_check(probe, path)


@pytest.mark.parametrize("value, what", [("fast", "str"), (None, "NoneType"), (torch.ones(3), "Tensor"),
                                         ([1.0], "list"), (np.ones(2), "ndarray")])
def test_log_metrics_non_number_names_the_metric(started, value, what):
    probe, path = started
    with pytest.raises(ProbeError) as err:
        probe.log_metrics({"timing/rollout": 1.5, "e2e_tps": value})
    msg = str(err.value)
    assert "'e2e_tps'" in msg and "step 1" in msg and what in msg, msg
    probe.log_metrics({"e2e_tps": torch.tensor(74.0), "n": np.float32(2.0), "ok": True})
    finish_and_check(probe, path)
    scalars = rlprobe.open(path).scalars().collect()
    # the refused call recorded nothing, not even its valid metric
    assert sorted(scalars["name"].to_list()) == ["e2e_tps", "n", "ok"]


def test_log_metrics_bad_names_and_non_dict(started):
    probe, path = started
    with pytest.raises(ProbeError, match="log_metrics"):
        probe.log_metrics([("loss", 1.0)])
    with pytest.raises(ProbeError, match="metric names"):
        probe.log_metrics({3: 1.0})
    with pytest.raises(ProbeError, match="metric names"):
        probe.log_metrics({"": 1.0})
    finish_and_check(probe, path)


def test_save_config_errors(started):
    probe, path = started
    with pytest.raises(ProbeError, match="save_config"):
        probe.save_config(["not", "a", "dict"])
    probe.save_config({"lr": 1e-5, "odd": Opaque()})  # stored with str() of what JSON cannot hold
    finish_and_check(probe, path)
    cfg = rlprobe.open(path).configs()[0]
    assert cfg["lr"] == 1e-5 and "Opaque" in cfg["odd"]


# -- use after close ---------------------------------------------------------------------
def test_closed_probe_use_raises(tmp_path):
    path = tmp_path / "dump"
    probe = make_probe(path)
    probe.save({"x": good(0)})
    probe.step()
    probe.close()
    probe.close()  # twice is fine
    calls = {
        "save": lambda: probe.save({"x": good(1)}),
        "log_metrics": lambda: probe.log_metrics({"loss": 1.0}),
        "save_config": lambda: probe.save_config({"a": 1}),
        "step": probe.step,
        "flush": probe.flush,
    }
    for name, call in calls.items():
        with pytest.raises(ProbeError, match="closed") as err:
            call()
        assert str(path) in str(err.value), (name, str(err.value))
    assert rlprobe.open(path).complete is True
    assert_step_readable(path, 0)
    assert {r["step"] for r in rows_of(path)} == {0}


def test_context_manager_closes_on_exception(tmp_path):
    path = tmp_path / "dump"
    with pytest.raises(ZeroDivisionError):
        with make_probe(path) as probe:
            probe.save({"x": good(0)})
            probe.step()
            probe.save({"x": good(1)})
            1 / 0
    assert probe.closed
    dump = rlprobe.open(path)
    assert dump.complete is True
    assert_step_readable(path, 0)
    assert_step_readable(path, 1)


# -- on_error="warn" ---------------------------------------------------------------------
def test_warn_mode_turns_errors_into_warnings(tmp_path):
    path = tmp_path / "dump"
    probe = make_probe(path, on_error="warn")
    probe.save({"x": good(0)})
    with pytest.warns(RuntimeWarning, match=r"step 0, key 'bad'.*unsupported value of type str"):
        probe.save({"bad": "text"})
    with pytest.warns(RuntimeWarning, match="'../x'"):
        probe.save({"../x": torch.ones(1)})
    with pytest.warns(RuntimeWarning, match="'loss'"):
        probe.log_metrics({"loss": "high"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # good calls stay silent
        probe.save({"y": good(0)})
        probe.log_metrics({"loss": 0.5})
        probe.step()
        probe.save({"x": good(1)})
        probe.step()
        probe.close()
    with pytest.warns(RuntimeWarning, match="closed"):
        probe.save({"x": good(2)})
    dump = rlprobe.open(path)
    assert dump.complete is True
    assert {(r["key"], r["step"]) for r in rows_of(path)} == {("x", 0), ("y", 0), ("x", 1)}
    assert_step_readable(path, 0)
    assert_step_readable(path, 1)
    assert dump.scalars().collect()["value"].to_list() == [0.5]


# -- bad dump paths ----------------------------------------------------------------------
def test_dump_path_that_is_a_file(tmp_path):
    f = tmp_path / "dump"
    f.write_text("not a directory")
    with pytest.raises(ProbeError) as err:
        make_probe(f)
    assert str(f) in str(err.value) and "file" in str(err.value)
    assert f.read_text() == "not a directory"
    # a parent that is a file
    with pytest.raises(ProbeError) as err:
        make_probe(f / "sub")
    assert str(f / "sub") in str(err.value)


def _readonly_dir(tmp_path: Path, mounts) -> Path:
    ro = tmp_path / "ro"
    if mounts(ro, "ro,size=1m"):
        return ro
    return Path("/proc/1/rlprobe-cannot-exist")  # nobody, not even root, can create this


def test_unwritable_directory(tmp_path, mounts):
    target = _readonly_dir(tmp_path, mounts) / "dump"
    with pytest.raises(ProbeError) as err:
        make_probe(target)
    msg = str(err.value)
    assert str(target) in msg and "not writable" in msg, msg
    assert not target.exists()


def test_directory_turns_read_only_mid_run(tmp_path, mounts):
    mnt = tmp_path / "mnt"
    if not mounts(mnt, "size=8m"):
        pytest.skip("cannot mount tmpfs here")
    path = mnt / "dump"
    probe = make_probe(path)
    probe.save({"x": good(0)})
    probe.step()
    probe.flush()
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    with pytest.raises(ProbeError) as err:  # the writer is asynchronous: the error surfaces at the next call
        probe.save({"x": good(1)})
        probe.step()
        probe.flush()
    msg = str(err.value)
    assert "Read-only" in msg and str(path) in msg, msg
    assert "key 'x' step 1" in msg, msg
    with pytest.raises(ProbeError):
        probe.close()  # its manifest cannot be written either: still an error, never a hang
    assert probe.closed
    assert_step_readable(path, 0)
    assert {r["step"] for r in rows_of(path)} == {0}
    assert rlprobe.open(path).complete is False  # the rank could not mark itself closed
    assert tmp_names(path) == []


# -- full disk ---------------------------------------------------------------------------
@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_full_disk(tmp_path, mounts, on_error):
    mnt = tmp_path / "small"
    if not mounts(mnt, "size=2m"):
        pytest.skip("cannot mount tmpfs here")
    path = mnt / "dump"
    n = 75_000  # 300 KB float32 tensors: a 2 MiB file system holds six of them with room to spare for stats
    probe = make_probe(path, on_error=on_error)
    failed_step = None
    message = ""
    for s in range(20):
        # the writer is asynchronous: the error surfaces at the next call, flush() at the latest
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                probe.save({"x": good(s, n), "small": torch.tensor([s, s + 1])})
                probe.log_metrics({"loss": float(s)})
                probe.step()
                probe.flush()
            except ProbeError as e:
                assert on_error == "raise"
                failed_step, message = s, str(e)
        found = [w for w in caught if issubclass(w.category, RuntimeWarning)]
        if found:
            assert on_error == "warn"
            failed_step, message = s, str(found[0].message)
        if failed_step is not None:
            break
    assert failed_step is not None, "a 2 MiB file system never filled up"
    assert failed_step >= 1
    assert "No space" in message or str(path / "tensors") in message, message
    assert f"key 'x' step {failed_step}" in message, message
    try:
        probe.close()
    except ProbeError:
        pass
    assert probe.closed

    dump = rlprobe.open(path)
    rows = rows_of(path)
    for s in range(failed_step):  # everything before the failure is intact
        assert_step_readable(path, s, n=n)
        np.testing.assert_array_equal(dump.tensor("small", s), np.array([s, s + 1]))
    bad = [r for r in rows if r["key"] == "x" and r["step"] == failed_step]
    assert len(bad) == 1, "the stats row of a tensor that could not be written is kept"
    assert bad[0]["tensor_file"] is None
    assert bad[0]["max"] == float(good(failed_step, n).max()) and bad[0]["numel"] == n
    with pytest.raises(ProbeError, match="statistics only"):
        dump.tensor("x", failed_step)
    manifest = json.loads((path / "rank0.json").read_text())
    assert any(f"step {failed_step}" in e for e in manifest["errors"]), manifest["errors"]
    assert {"kind": "key_data", "key": "x", "step": failed_step, "micro_step": 0, "index": "",
            "what": "tensor"} in manifest["lost"]
    assert dump.rank_manifests[0]["errors"] == manifest["errors"]
    assert tmp_names(path) == [], "a failed write left its temporary file behind"
    scalars = dump.scalars().collect()
    assert set(range(failed_step + 1)) <= set(scalars["step"].to_list())


# -- existing runs -----------------------------------------------------------------------
def write_run(path: Path, steps: range, key: str = "x", **kw) -> str:
    with make_probe(path, **kw) as probe:
        for s in steps:
            probe.save({key: good(s)})
            probe.log_metrics({"loss": float(s)})
            probe.step()
        return probe.run_id


def test_finished_run_is_refused(tmp_path):
    path = tmp_path / "dump"
    write_run(path, range(3))
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    with pytest.raises(ProbeError) as err:
        make_probe(path)
    msg = str(err.value)
    assert str(path) in msg and "finished run" in msg, msg
    assert "mode='overwrite'" in msg and "mode='append'" in msg, msg
    assert "steps 0-2" in msg, msg
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before
    assert rlprobe.open(path).complete is True
    for s in range(3):
        assert_step_readable(path, s)


def test_overwrite_replaces(tmp_path):
    path = tmp_path / "dump"
    old_id = write_run(path, range(4), key="old")
    new_id = write_run(path, range(2), key="new", mode="overwrite")
    assert new_id != old_id
    dump = rlprobe.open(path)
    assert dump.complete is True
    rows = rows_of(path)
    assert {(r["key"], r["step"]) for r in rows} == {("new", 0), ("new", 1)}
    assert not (path / "tensors" / "key_data" / "key=old").exists() or not any(
        (path / "tensors" / "key_data" / "key=old").rglob("*.npy"))
    assert sorted(dump.scalars().collect()["step"].to_list()) == [0, 1]
    assert dump.manifest["run_id"] == new_id
    assert dump.rank_manifests[0]["run_id"] == new_id
    assert dump.rank_manifests[0]["committed_steps"] == [0, 1]
    np.testing.assert_array_equal(dump.tensor("new", 1), good(1).numpy())
    con = dump.connect()
    assert con.execute("select count(*) from key_data where key = ?", ["old"]).fetchone()[0] == 0


def test_append_continues(tmp_path):
    path = tmp_path / "dump"
    run_id = write_run(path, range(3))
    with make_probe(path, mode="append") as probe:
        assert probe.current_step == 3
        assert probe.run_id == run_id
        probe.save({"x": good(3)})
        probe.log_metrics({"loss": 3.0})
        probe.step()
        probe.save({"x": good(4)})
        probe.step()
    dump = rlprobe.open(path)
    assert dump.complete is True
    assert dump.manifest["run_id"] == run_id
    assert dump.rank_manifests[0]["run_id"] == run_id
    assert dump.rank_manifests[0]["committed_steps"] == [0, 1, 2, 3, 4]
    assert [(r["step"], r["micro_step"]) for r in rows_of(path)] == [(s, 0) for s in range(5)]
    for s in range(5):
        assert_step_readable(path, s)
    assert sorted(dump.scalars().collect()["step"].to_list()) == [0, 1, 2, 3]
    # and a fresh mode='new' probe is still refused
    with pytest.raises(ProbeError, match="mode='append'"):
        make_probe(path)


def test_append_refuses_a_rank_of_another_format_version_and_a_manifest_that_is_no_object(tmp_path):
    """Appending to a newer rlprobe's dump wrote format 1 rows into it and set its rank manifest back to 1; a
    rank manifest holding a JSON list ended in an AttributeError."""
    path = tmp_path / "dump"
    write_run(path, range(2))
    manifest = path / "rank0.json"
    newer = manifest.read_text().replace('"format_version": 1', '"format_version": 2')
    manifest.write_text(newer)
    files = sorted((p, p.stat().st_size) for p in path.rglob("*") if p.is_file() and not p.name.startswith(".rank"))
    with pytest.raises(ProbeError, match="rank0.json is of format_version 2 and this rlprobe writes format 1"):
        make_probe(path, mode="append")
    assert manifest.read_text() == newer  # nothing written: its rows would mix two formats
    assert sorted((p, p.stat().st_size) for p in path.rglob("*") if p.is_file() and not p.name.startswith(".rank")) \
        == files
    manifest.write_text("[1, 2]")
    with pytest.raises(ProbeError, match="rank0.json cannot be read, so which steps were committed is unknown"):
        make_probe(path, mode="append")


def test_append_to_empty_directory_starts_at_zero(tmp_path):
    with make_probe(tmp_path / "dump", mode="append") as probe:
        assert probe.current_step == 0
        probe.save({"x": good(0)})
        probe.step()
    assert_step_readable(tmp_path / "dump", 0)


# -- a writer killed mid-step ------------------------------------------------------------
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    import torch
    import rlprobe

    path, how = sys.argv[1], sys.argv[2]
    probe = rlprobe.Probe(path, rank=0, world_size=1, max_inflight_bytes=1 << 26)
    for s in range(3):
        probe.save({"x": torch.arange(8, dtype=torch.float32) * 0.5 + s, "ids": torch.arange(5) * (s + 1)})
        probe.save({"x": torch.full((4,), float(s))})
        probe.log_metrics({"loss": float(s)})
        probe.step()
    if how == "exit":
        probe.flush()
        probe.save({"x": torch.full((8,), 99.0)})  # part of step 3
        os._exit(1)
    if how == "selfkill":
        probe.flush()
        probe.save({"x": torch.full((8,), 99.0)})
        probe.flush()  # step 3's partial rows reach a stats part, uncommitted
        os.kill(os.getpid(), signal.SIGKILL)
    # "kill": keep the writer busy with step 3 until the parent kills us mid-write
    big = torch.randn(2_000_000)
    for i in range(400):
        probe.save({"big": big})
    time.sleep(60)
""")


def _wait_for_committed(path: Path, steps: set[int], proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if steps <= set(json.loads((path / "rank0.json").read_text())["committed_steps"]):
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.005)
    raise AssertionError(f"steps {steps} never committed")


def _check_killed_dump(path: Path) -> None:
    dump = rlprobe.open(path)
    assert dump.complete is False
    assert dump.rank_manifests[0]["closed"] is False
    assert {0, 1, 2} <= set(dump.rank_manifests[0]["committed_steps"])
    rows = rows_of(path)
    for s in range(3):
        np.testing.assert_array_equal(dump.tensor("x", s), (np.arange(8, dtype=np.float32) * 0.5 + s))
        np.testing.assert_array_equal(dump.tensor("x", s, micro_step=1), np.full((4,), float(s), np.float32))
        ids = dump.tensor("ids", s)
        assert ids.dtype == np.int64
        np.testing.assert_array_equal(ids, np.arange(5) * (s + 1))
        assert {(r["key"], r["micro_step"]) for r in rows if r["step"] == s} == {("x", 0), ("x", 1), ("ids", 0)}
    assert sorted(set(dump.scalars().collect()["step"].to_list()))[:3] == [0, 1, 2]
    for r in rows:  # every row the reader returns points at a complete, readable file
        if r["tensor_file"] is not None:
            assert ".tmp-" not in r["tensor_file"]
            dump.tensor(r["key"], r["step"], micro_step=r["micro_step"], index=r["index"])


def _plant_temporaries(path: Path) -> None:
    """What a writer killed mid-rename leaves: hidden temporaries that no reader may pick up."""
    stats = path / "stats" / "key_data" / "rank=0"
    (stats / ".part-000077.parquet.tmp-1234-deadbeef").write_bytes(b"PAR1 half a parquet file")
    (stats / ".rank0.json.tmp-1234-deadbeef").write_bytes(b"{")
    (path / ".rank0.json.tmp-1234-cafef00d").write_bytes(b'{"closed": tr')
    # a packed file of key data is written hidden and renamed into place once (docs/dump-format.md)
    packs = path / "tensors" / "key_data" / "rank=0"
    packs.mkdir(parents=True, exist_ok=True)
    (packs / ".steps=1-2.call=0.npys.tmp-1234-deadbeef").write_bytes(b"\x93NUMPY garbage")
    # so was a save call's folder, from issue 15 to the seventh session
    t = path / "tensors" / "key_data" / "step=1" / "rank=0" / ".call=0.tmp-1234-deadbeef"
    t.mkdir(parents=True)
    (t / "x.npy").write_bytes(b"\x93NUMPY garbage")
    (t.parent / ".call=0.tmp-1234-cafef00d").mkdir()  # killed before its first file


@pytest.mark.parametrize("how", ["exit", "selfkill", "kill"])
def test_killed_writer_leaves_readable_dump(tmp_path, how):
    path = tmp_path / "dump"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), how],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if how == "kill":
            _wait_for_committed(path, {0, 1, 2}, proc)
            deadline = time.monotonic() + 20  # kill it while a big tensor is being written, if we catch one
            while time.monotonic() < deadline and not tmp_names(path / "tensors"):
                time.sleep(0.001)
            os.kill(proc.pid, signal.SIGKILL)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == (1 if how == "exit" else -signal.SIGKILL), proc.stderr.read()

    _check_killed_dump(path)
    _plant_temporaries(path)
    _check_killed_dump(path)  # temporaries are not picked up
    dump = rlprobe.open(path)
    committed = set(dump.rank_manifests[0]["committed_steps"])
    steps = dump.key_data().select("step").collect()["step"].to_list()
    assert set(steps) <= committed  # readers show committed steps only
    con = dump.connect()
    assert con.execute("select count(*) from key_data").fetchone()[0] == len(steps)
    everything = rlprobe.open(path, include_uncommitted=True)
    n_all = everything.key_data().select("key").collect().height
    assert everything.connect().execute("select count(*) from key_data").fetchone()[0] == n_all
    glob = str(path / "stats" / "key_data" / "**" / "*.parquet")
    plain = duckdb.connect().execute("select count(*) from read_parquet(?, hive_partitioning = true)", [glob]).fetchone()[0]
    assert plain == n_all  # a plain glob reads every row written, committed or not
    if how == "selfkill":  # the flushed part of the unfinished step is on disk, and not committed
        assert 3 not in committed and n_all > len(steps)
        np.testing.assert_array_equal(everything.tensor("x", 3), np.full((8,), 99.0, np.float32))
        with pytest.raises(ProbeError, match="step 3 of rank 0 is not committed"):
            dump.tensor("x", 3)

    with pytest.raises(ProbeError) as err:
        make_probe(path)
    msg = str(err.value)
    assert "unfinished" in msg and str(path) in msg and "mode='append'" in msg, msg

    # resuming with mode='append' continues after the last committed step and finishes the dump
    with make_probe(path, mode="append") as probe:
        assert probe.current_step == 3
        probe.save({"x": good(3)})
        probe.step()
    dump = rlprobe.open(path)
    assert dump.complete is True
    # the killed writer's uncommitted rows of step 3 are not kept beside the resumed run's
    step3 = [r for r in rows_of(path) if r["step"] == 3]
    assert [(r["key"], r["micro_step"]) for r in step3] == [("x", 0)], step3
    assert step3[0]["max"] == float(good(3).max())
    np.testing.assert_array_equal(dump.tensor("x", 3), good(3).numpy())
    assert tmp_names(path / "stats") == [], "close() sweeps temporaries of killed writers from its stats"

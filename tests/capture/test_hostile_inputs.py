"""Hostile capture inputs get a clear ProbeError naming the argument, key or metric (never a
traceback from deep inside), and lose nothing already written: bad paths and ranks, integers
no tensor holds, meta and sparse tensors, self-referencing values, names that flatten to one
index or cannot be written as UTF-8."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import rlprobe
from rlprobe import ProbeError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("RLPROBE_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def started(tmp_path):
    """A probe with step 0 saved and committed; closed (if still open) at teardown."""
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1)
    probe.save({"x": torch.arange(4, dtype=torch.float32)})
    probe.log_metrics({"loss": 0.5})
    probe.step()
    probe.flush()
    yield probe, path
    if not probe.closed:
        probe.close()


def _finish_and_check(probe, path, extra_keys=()):
    """The refused call saved nothing; the probe goes on; step 0 is intact."""
    probe.save({"x": torch.arange(4, dtype=torch.float32) + 1})
    probe.step()
    probe.close()
    dump = rlprobe.open(path)
    assert dump.complete is True
    assert dump.rank_manifests[0]["committed_steps"] == [0, 1]
    assert dump.rank_manifests[0]["lost"] == [] and dump.rank_manifests[0]["errors"] == []
    rows = dump.key_data().collect().sort("step", "key")
    assert rows.select("key", "step").rows() == sorted([("x", 0), ("x", 1), *extra_keys], key=lambda r: (r[1], r[0]))
    np.testing.assert_array_equal(dump.tensor("x", 0), np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(dump.tensor("x", 1), np.arange(4, dtype=np.float32) + 1)
    assert dump.scalars().collect()["value"].to_list() == [0.5]


# -- Probe arguments and the environment ------------------------------------------------------
@pytest.mark.parametrize("kwargs, env, words", [
    pytest.param({"path": None}, {}, ["path=None", "str or os.PathLike"], id="path-none"),
    pytest.param({"path": ""}, {}, ["path=''", "non-empty"], id="path-empty"),
    pytest.param({"path": 3}, {}, ["path=3"], id="path-int"),
    pytest.param({}, {"RANK": "abc"}, ["RANK='abc'", "whole number", "rank="], id="env-rank"),
    pytest.param({}, {"RANK": "1", "WORLD_SIZE": "two"}, ["WORLD_SIZE='two'"], id="env-world"),
    pytest.param({}, {"RANK": "4", "WORLD_SIZE": "4"}, ["rank=4, world_size=4", "RANK, WORLD_SIZE",
                                                         "0 <= rank < world_size"], id="env-rank-too-big"),
    pytest.param({"rank": 2, "world_size": 2}, {}, ["rank=2, world_size=2", "0 <= rank < world_size"],
                 id="rank-equals-world"),
    pytest.param({"rank": -1, "world_size": 2}, {}, ["rank=-1", "0 <= rank"], id="negative-rank"),
    pytest.param({"rank": 0, "world_size": 0}, {}, ["world_size=0", "world_size >= 1"], id="zero-world"),
    pytest.param({"rank": True, "world_size": 2}, {}, ["rank=True", "whole number"], id="bool-rank"),
    pytest.param({"rank": "0", "world_size": 2}, {}, ["rank='0'", "whole number"], id="str-rank"),
    pytest.param({"rank": 0, "world_size": 1.0}, {}, ["world_size=1.0", "whole number"], id="float-world"),
    pytest.param({"rank": 0, "world_size": 1, "start_step": -3}, {}, ["start_step=-3"], id="negative-start"),
])
def test_bad_probe_arguments_are_refused_before_anything_is_written(tmp_path, monkeypatch, kwargs, env, words):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    kwargs = {"path": tmp_path / "dump", **kwargs}
    with pytest.raises(ProbeError) as err:
        rlprobe.Probe(**kwargs)
    message = str(err.value)
    for w in words:
        assert w in message, (w, message)
    assert list(tmp_path.iterdir()) == []


def test_numpy_integers_are_fine_as_rank_and_world_size(tmp_path):
    with rlprobe.Probe(tmp_path / "dump", rank=np.int64(1), world_size=np.int32(2)) as probe:
        assert (probe.rank, probe.world_size) == (1, 2) and type(probe.rank) is int


def test_a_dump_of_rank_minus_one_alone_is_not_complete(tmp_path):
    """Older versions accepted rank -1: such a dump, with no rank 0, never reads as complete."""
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save({"x": torch.ones(2)})
    manifest = json.loads((path / "rank0.json").read_text())
    (path / "rank0.json").unlink()
    (path / "rlprobe.json").unlink()
    (path / "rank-1.json").write_text(json.dumps({**manifest, "rank": -1}))
    assert rlprobe.open(path).complete is False


# -- values -----------------------------------------------------------------------------------
def _self_list():
    items = [torch.ones(1)]
    items.append(items)
    return items


def _self_dict():
    d = {"a": torch.ones(1)}
    d["me"] = {"again": d}
    return d


def _sparse_csr():
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore")
        return torch.eye(3).to_sparse_csr()


def _deep(n):
    value = torch.ones(1)
    for _ in range(n):
        value = [value]
    return value


@pytest.mark.parametrize("value, words", [
    pytest.param(2 ** 70, ["'bad'", "step 1", "1180591620717411303424", "64 bits"], id="int-2**70"),
    pytest.param(-(2 ** 63) - 1, ["'bad'", "64 bits"], id="int-below-int64"),
    pytest.param([1, 2 ** 2000], ["'bad'", "index '1'", "2001 bits", "64 bits"], id="huge-int-in-list"),
    pytest.param(torch.ones(3, device="meta"), ["'bad'", "meta tensor", "no data"], id="meta-tensor"),
    pytest.param(torch.ones(3).to_sparse(), ["'bad'", "sparse_coo", "to_dense()"], id="sparse-coo"),
    pytest.param(_sparse_csr(), ["'bad'", "sparse_csr", "to_dense()"], id="sparse-csr"),
    pytest.param(_self_list(), ["'bad'", "index '1'", "contains itself"], id="self-referencing-list"),
    pytest.param(_self_dict(), ["'bad'", "index 'me.again'", "contains itself"], id="self-referencing-dict"),
    pytest.param(_deep(100), ["'bad'", "nested more than 32 levels"], id="too-deep"),
    pytest.param({"a.b": torch.ones(2), "a": {"b": torch.zeros(2)}},
                 ["bad['a.b'] and bad['a']['b']", "index 'a.b'", "rename one"], id="dotted-name-clash"),
    pytest.param({"0": {"b": torch.ones(2)}, "0.b": torch.zeros(2)},
                 ["bad['0']['b'] and bad['0.b']", "index '0.b'"], id="dict-list-style-clash"),
    pytest.param({"ok": torch.ones(1), "k\udcff": torch.ones(1)}, ["'bad'", "dict key 'k\\udcff'", "UTF-8"],
                 id="surrogate-dict-key"),
])
def test_bad_values_name_the_key_and_save_nothing_of_the_call(started, value, words):
    probe, path = started
    with pytest.raises(ProbeError) as err:
        probe.save({"fine": torch.ones(2), "bad": value})
    message = str(err.value)
    for w in words:
        assert w in message, (w, message)
    _finish_and_check(probe, path)


def test_a_key_with_a_lone_surrogate_is_refused_by_save_and_the_step_commits_its_other_rows(started):
    """The key used to pass save() and break close() with a UnicodeEncodeError naming no key,
    losing the step's other rows while listing the step as committed."""
    probe, path = started
    probe.save({"y": torch.full((2,), 3.0)})
    with pytest.raises(ProbeError) as err:
        probe.save({"bad\udcff": torch.ones(2), "other": torch.zeros(2)})
    assert "key 'bad\\udcff'" in str(err.value) and "step 1" in str(err.value) and "UTF-8" in str(err.value)
    with pytest.raises(ProbeError, match=r"metric name 'l\\udcffoss'"):
        probe.log_metrics({"l\udcffoss": 1.0})
    with pytest.raises(ProbeError, match=r"stage name 'st\\udcffage'"):
        probe.stage("st\udcffage", model=torch.nn.Linear(2, 2))
    _finish_and_check(probe, path, extra_keys=[("y", 1)])


@pytest.mark.parametrize("name", ["a:b", "c:d:e", "http://x", "ratio:clipped"])
def test_names_with_a_colon_are_plain_names(tmp_path, name):
    """`a:b` was refused as "would write outside the dump directory"; it is stored as
    a_b~<hash>.npy, inside the dump, like any name with characters unsafe in paths."""
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save({name: torch.full((2,), 5.0)})
    dump = rlprobe.open(path)
    np.testing.assert_array_equal(dump.tensor(name, 0), np.full((2,), 5.0, np.float32))
    (row,) = dump.key_data().collect().to_dicts()
    assert row["key"] == name and ":" not in row["tensor_file"]
    assert (path / row["tensor_file"]).resolve().is_relative_to(path.resolve())


@pytest.mark.parametrize("name", ["C:\\x", "c:/x"])
def test_windows_absolute_paths_are_still_refused(started, name):
    probe, path = started
    with pytest.raises(ProbeError, match="outside the dump"):
        probe.save({name: torch.ones(1)})
    _finish_and_check(probe, path)


def test_64_bit_integers_at_the_edges_are_saved_exactly(tmp_path):
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save({"top": 2 ** 64 - 1, "bottom": -(2 ** 63), "int64_top": 2 ** 63 - 1})
    dump = rlprobe.open(path)
    assert dump.tensor("top", 0).dtype == np.uint64 and int(dump.tensor("top", 0)) == 2 ** 64 - 1
    assert dump.tensor("bottom", 0).dtype == np.int64 and int(dump.tensor("bottom", 0)) == -(2 ** 63)
    assert int(dump.tensor("int64_top", 0)) == 2 ** 63 - 1


# -- metrics ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value, words", [
    pytest.param(2 ** 2000, ["metric 'bad'", "2001 bits", "float64"], id="int-2**2000"),
    pytest.param(-(2 ** 1100), ["metric 'bad'", "1101 bits"], id="negative-huge-int"),
    pytest.param(torch.tensor(2.0, device="meta"), ["metric 'bad'", "cannot read", "meta"], id="meta-scalar"),
    pytest.param(np.array(2 ** 1500, dtype=object), ["metric 'bad'", "1501 bits"], id="object-array-huge-int"),
])
def test_metrics_no_float64_holds_are_refused_naming_the_metric(started, value, words):
    probe, path = started
    with pytest.raises(ProbeError) as err:
        probe.log_metrics({"fine": 1.0, "bad": value})
    message = str(err.value)
    for w in words:
        assert w in message, (w, message)
    _finish_and_check(probe, path)


def test_infinite_and_nan_metrics_are_kept(tmp_path):
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.log_metrics({"inf": float("inf"), "nan": float("nan"), "big": 2 ** 1000})
    values = dict(rlprobe.open(path).scalars().collect().select("name", "value").rows())
    assert values["inf"] == float("inf") and values["nan"] != values["nan"] and values["big"] == float(2 ** 1000)


# -- a row that is lost is never committed ----------------------------------------------------
def test_a_step_whose_rows_could_not_be_written_is_never_committed(tmp_path, monkeypatch):
    """A writer job that fails (here statistics of one tensor, by fault injection) loses that
    row: the step is recorded as incomplete and lost in rank0.json, never committed, hidden by
    readers, and removed when the run is resumed."""
    from rlprobe.capture import key_data_rows

    real = key_data_rows.host_statistics_columns

    def failing(arrays):  # the stacked statistics of a call fail: the writer retries one by one
        if any(values.size and np.all(values == 13.0) for values in arrays):
            raise MemoryError("injected")
        return real(arrays)

    monkeypatch.setattr(key_data_rows, "host_statistics_columns", failing)
    # the fault is injected into this process: the writer thread does the work (the writer
    # process's failures: tests/capture/test_writer_process.py)
    monkeypatch.setenv("RLPROBE_WRITER_PROCESS", "0")
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1)
    probe.save({"x": torch.zeros(2)})
    probe.step()
    probe.save({"x": torch.ones(2), "y": torch.full((2,), 13.0)})
    with pytest.raises(ProbeError, match=r"key 'y' step 1 micro_step 0: could not compute statistics"):
        probe.step()  # the writer's error comes back here when its job is done by then, else at flush()
        probe.flush()
    probe.save({"x": torch.full((2,), 2.0)})
    probe.step()
    probe.close()
    manifest = json.loads((path / "rank0.json").read_text())
    assert manifest["committed_steps"] == [0, 2]
    assert manifest["incomplete_steps"] == [1]
    assert {"kind": "key_data", "key": "y", "step": 1, "micro_step": 0, "index": "", "what": "row"} in manifest["lost"]
    dump = rlprobe.open(path)
    assert sorted(dump.key_data().collect()["step"].to_list()) == [0, 2]
    assert sorted(rlprobe.open(path, include_uncommitted=True).key_data().collect()["step"].to_list()) == [0, 1, 2]
    monkeypatch.undo()
    with rlprobe.Probe(path, rank=0, world_size=1, mode="append") as again:  # step 1's half is removed
        assert again.current_step == 3
    everything = rlprobe.open(path, include_uncommitted=True).key_data().collect()
    assert sorted(everything["step"].to_list()) == [0, 2]
    assert not (path / "tensors" / "key_data" / "key=x" / "step=1").exists() or \
        not any((path / "tensors" / "key_data" / "key=x" / "step=1").iterdir())
    assert json.loads((path / "rank0.json").read_text())["incomplete_steps"] == []


def test_a_row_no_part_can_hold_is_lost_alone(tmp_path):
    """Rank writer level: a buffered row Arrow refuses (validation in save() keeps such rows
    out) is recorded as lost with its step, and the other rows and steps are still committed."""
    from rlprobe.lake.layout import DumpLayout
    from rlprobe.lake.rank_writer import RankWriter

    path = tmp_path / "dump"
    path.mkdir()
    sink = RankWriter(DumpLayout(path), 0, 1, "run", {"framework": "numpy"})
    sink.add_row("scalar", {"step": 0, "name": "loss", "value": 1.0, "wall_time": 0.0})
    sink.add_row("scalar", {"step": 1, "name": "bad\udcff", "value": 2.0, "wall_time": 0.0})
    sink.add_row("scalar", {"step": 1, "name": "loss", "value": 3.0, "wall_time": 0.0})
    sink.end_step(0)
    sink.end_step(1)
    errors = sink.flush()
    assert len(errors) == 1 and "scalar row name 'bad\\udcff' of step 1" in errors[0], errors
    assert sink.manifest["committed_steps"] == [0] and sink.manifest["incomplete_steps"] == [1]
    sink.add_row("scalar", {"step": 2, "name": "loss", "value": 4.0, "wall_time": 0.0})
    sink.end_step(2)
    assert sink.flush() == []
    assert sink.close() == []
    assert sink.manifest["committed_steps"] == [0, 2]
    table = rlprobe.open(path, include_uncommitted=True).arrow("scalar")
    assert sorted(table["value"].to_pylist()) == [1.0, 3.0, 4.0]
    assert sorted(rlprobe.open(path).arrow("scalar")["value"].to_pylist()) == [1.0, 4.0]  # step 1 is incomplete


def test_views_with_torch_negative_bit_are_saved_with_their_values(tmp_path):
    """The imaginary part of a conjugated complex tensor is a real view with torch's negative bit set, which
    numpy() and a dtype view refuse: saved with the values it reads as (float32, and float16 from chalf)."""
    z = torch.tensor([1 + 2j, -3 - 4j, 5 + 0.5j], dtype=torch.complex64)
    neg32 = z.conj().imag
    neg16 = z.to(torch.complex32).conj().imag
    ids = torch.arange(3)
    assert neg32.is_neg() and neg16.is_neg()
    with rlprobe.Probe(tmp_path / "d", rank=0, world_size=1) as probe:
        probe.save({"neg32": neg32, "neg16": neg16, "plain": torch.ones(3)}, sample_ids=ids)
        probe.step()
    dump = rlprobe.open(tmp_path / "d")
    np.testing.assert_array_equal(dump.tensor("neg32", 0), np.array([-2.0, 4.0, -0.5], np.float32))
    np.testing.assert_array_equal(dump.tensor("neg16", 0), np.array([-2.0, 4.0, -0.5], np.float16))
    rows = {r["key"]: r for r in dump.key_data().collect().to_dicts()}
    assert rows["neg32"]["min"] == -2.0 and rows["neg32"]["max"] == 4.0
    assert ids.numpy().tolist() == [0, 1, 2]  # the caller's ids are left as they were

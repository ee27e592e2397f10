"""A rank's earlier data is found by its stats and tensors too, not only by its rank<R>.json:
with the manifest deleted, mode new and append are refused and overwrite clears the old data,
so no old row ever points at a .npy the new run wrote."""

from __future__ import annotations

import numpy as np
import pytest

import rlprobe
from rlprobe import ProbeError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("RLPROBE_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _old_run(path, rank: int = 1, world_size: int = 2):
    with rlprobe.Probe(path, rank=rank, world_size=world_size) as probe:
        for s in range(3):
            probe.save({"x": np.full(4, 100.0 + s, np.float32)})
            probe.log_metrics({"loss": float(s)})
            probe.step()


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.name.startswith(".rank"))


@pytest.mark.parametrize("mode", ["new", "append"])
def test_a_deleted_rank_manifest_does_not_hide_the_ranks_data(tmp_path, mode):
    path = tmp_path / "dump"
    _old_run(path)
    (path / "rank1.json").unlink()
    before = _tree(path)
    with pytest.raises(ProbeError) as err:
        rlprobe.Probe(path, rank=1, world_size=2, mode=mode)
    message = str(err.value)
    assert "rank 1" in message and "rank1.json" in message and "stats/key_data/rank=1" in message, message
    assert "mode='overwrite'" in message, message
    assert _tree(path) == before  # nothing written, nothing removed
    rows = rlprobe.open(path, include_uncommitted=True).key_data().collect()
    assert sorted(rows["max"].to_list()) == [100.0, 101.0, 102.0]


def test_tensors_alone_are_found_too(tmp_path):
    """A writer killed before its first part left tensors (and, here, no manifest)."""
    path = tmp_path / "dump"
    _old_run(path)
    (path / "rank1.json").unlink()
    for kind in ("key_data", "scalar"):
        for f in (path / "stats" / kind / "rank=1").iterdir():
            f.unlink()
    with pytest.raises(ProbeError, match=r"tensors/key_data/rank=1\b"):
        rlprobe.Probe(path, rank=1, world_size=2)


def test_overwrite_clears_a_rank_without_its_manifest(tmp_path):
    path = tmp_path / "dump"
    _old_run(path)
    _old_run(path, rank=0)  # another rank's data stays
    (path / "rank1.json").unlink()
    with rlprobe.Probe(path, rank=1, world_size=2, mode="overwrite") as probe:
        probe.save({"x": np.full(4, -7.0, np.float32)})
        probe.step()
    dump = rlprobe.open(path, include_uncommitted=True)
    rows = dump.key_data().collect().sort("rank", "step")
    assert rows.select("rank", "step", "max").rows() == [(0, 0, 100.0), (0, 1, 101.0), (0, 2, 102.0), (1, 0, -7.0)]
    np.testing.assert_array_equal(dump.tensor("x", 0, rank=1), np.full(4, -7.0, np.float32))
    np.testing.assert_array_equal(dump.tensor("x", 2, rank=0), np.full(4, 102.0, np.float32))
    assert [p.name for p in (path / "tensors" / "key_data" / "rank=1").iterdir()] == ["steps=0-0.call=0.npys"]
    assert sorted(dump.scalars().collect().filter(rank=1)["step"].to_list()) == []
    assert dump.rank_manifests[1]["committed_steps"] == [0]


def test_rank_zero_overwrite_clears_higher_ranks_found_only_by_their_stats(tmp_path):
    path = tmp_path / "dump"
    _old_run(path, rank=0, world_size=3)
    _old_run(path, rank=2, world_size=3)
    (path / "rank2.json").unlink()
    with rlprobe.Probe(path, rank=0, world_size=2, mode="overwrite") as probe:
        probe.save({"x": np.zeros(4, np.float32)})
        probe.step()
    assert not (path / "stats" / "key_data" / "rank=2").exists()
    assert not list((path / "tensors").rglob("rank=2"))
    assert rlprobe.open(path, include_uncommitted=True).key_data().collect()["rank"].to_list() == [0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["new", "append"])
def test_a_fifo_in_place_of_the_rank_manifest_is_refused_not_waited_on(tmp_path, mode):
    """Probe() reads an earlier rank<R>.json through lake/regular_files.py: a FIFO there (opening it for
    reading waits for a writer) is refused with the run's message, never opened the blocking way."""
    from tests.lake.fifos import fifo_in_place_of, finishes

    _old_run(tmp_path / "d")
    fifo = fifo_in_place_of(tmp_path / "d" / "rank1.json")

    def probe_there():
        rlprobe.Probe(tmp_path / "d", rank=1, world_size=2, mode=mode)

    with pytest.raises(ProbeError, match="cannot be read" if mode == "append" else "already holds"):
        finishes(probe_there, [fifo])

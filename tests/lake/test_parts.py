"""Stats parts: one per flush, merged in the background so few remain; killed merges double-count nothing."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

import rlprobe
from rlprobe.lake.layout import parse_part
from rlprobe.lake.parts import FANOUT

STEPS = 200
# FANOUT - 1 parts a tier at most, and as many tiers as a part of STEPS flushes needs
MAX_LIVE_PARTS = (FANOUT - 1) * (int(math.log(STEPS, FANOUT)) + 1)
KEY_ROWS_PER_STEP = 6  # 2 micro steps x (a, b.0, b.1)
KINDS = ("key_data", "scalar")


def _save_step(probe: rlprobe.Probe, step: int, rank: int = 0) -> None:
    for micro in range(2):
        base = 1000 * rank + 10 * step + micro
        probe.save({"a": np.full(3, base, np.float32), "b": [np.arange(2) + base, np.float64(base)]})
    probe.log_metrics({"loss": step / 10 + rank, "tps": float(step)})


def _part_files(directory: Path) -> list[Path]:
    return sorted(f for f in directory.iterdir() if f.suffix == ".parquet")


def _scalar(con, query: str):
    rows = con.sql(query).fetchall()
    assert len(rows) == 1, (query, rows)
    return rows[0][0]


def _check_rows(dump, steps_done: int, ranks=(0,)) -> None:
    """Every saved row is there exactly once, with the values that were saved."""
    kd = dump.key_data().collect()
    assert kd.height == KEY_ROWS_PER_STEP * steps_done * len(ranks)
    assert kd.select("key", "step", "rank", "micro_step", "index").n_unique() == kd.height
    a = kd.filter(pl.col("key") == "a").sort("rank", "step", "micro_step")
    expected = [1000 * r + 10 * s + m for r in ranks for s in range(steps_done) for m in range(2)]
    assert a["max"].to_list() == [float(v) for v in expected]
    sc = dump.scalars().collect()
    assert sc.height == 2 * steps_done * len(ranks)
    assert sc.select("step", "name", "rank").n_unique() == sc.height


@pytest.mark.parametrize("ranks", [(0,), (0, 1)], ids=["one-rank", "two-ranks-one-dir"])
def test_part_count_stays_small_and_close_leaves_one(tmp_path: Path, ranks):
    path = tmp_path / "dump"
    probes = {r: rlprobe.Probe(path, rank=r, world_size=len(ranks), stats_only=(r == 1)) for r in ranks}
    most = {(kind, r): 0 for kind in KINDS for r in ranks}
    for step in range(STEPS):
        for r, probe in probes.items():
            _save_step(probe, step, r)
            probe.step()
            probe.flush()
        dump = rlprobe.open(path)
        for kind in KINDS:
            live = dump.parts(kind)
            assert sorted(live) == list(ranks)
            for r in ranks:
                # live parts and every parquet file on disk: merged inputs are gone, no temporaries left
                on_disk = _part_files(path / "stats" / kind / f"rank={r}")
                assert len(live[r]) <= MAX_LIVE_PARTS, (kind, r, step, live[r])
                assert len(on_disk) == len(live[r]), (kind, r, step, on_disk)
                most[(kind, r)] = max(most[(kind, r)], len(live[r]))
        if step % 40 == 7 or step == STEPS - 1:
            _check_rows(dump, step + 1, ranks)
    assert all(n > 1 for n in most.values())  # parts did accumulate between merges
    for probe in probes.values():
        probe.close()

    dump = rlprobe.open(path)
    assert dump.complete is True
    for kind in KINDS:
        for r in ranks:
            files = list((path / "stats" / kind / f"rank={r}").iterdir())
            assert len(files) == 1, (kind, r, files)  # exactly one part, nothing else
            part = parse_part(files[0])
            assert part is not None and (part.first, part.last) == (0, STEPS - 1)
            table = pq.read_table(files[0], partitioning=None)
            assert "rank" not in table.column_names  # partition values live only in the path
            steps = table["step"].to_numpy()
            assert np.all(np.diff(steps) >= 0), "rows not sorted by step"
            assert sorted(set(steps.tolist())) == list(range(STEPS))
            if kind == "key_data":  # flush order kept within a step: micro steps ascending per key
                df = pl.from_arrow(table)
                per = df.group_by("step", "key", "index", maintain_order=True).agg(pl.col("micro_step"))
                assert all(ms == [0, 1] for ms in per["micro_step"].to_list())
    _check_rows(dump, STEPS, ranks)
    for r in ranks:
        assert dump.rank_manifests[r]["committed_steps"] == list(range(STEPS))
        assert dump.rank_manifests[r]["rows"]["key_data"] == KEY_ROWS_PER_STEP * STEPS


def test_contract_glob_reads_every_kind_with_hive_rank(tmp_path: Path):
    """DESIGN: read_parquet('<dump>/stats/<kind>/**/*.parquet', hive_partitioning = true) works."""
    import duckdb

    path = tmp_path / "dump"
    for r in (0, 1):
        probe = rlprobe.Probe(path, rank=r, world_size=2)
        for step in range(5):
            _save_step(probe, step, r)
            probe.step()
        probe.close()
    con = duckdb.connect()
    rows = con.sql(
        "select rank, count(*) from read_parquet(?, hive_partitioning = true) group by rank order by rank",
        params=[str(path / "stats" / "key_data" / "**" / "*.parquet")],
    ).fetchall()
    assert rows == [(0, 30), (1, 30)]


def _run(path: Path, steps: range, snapshot_at: int | None = None, snapshot_to: Path | None = None,
         mode: str = "new") -> None:
    probe = rlprobe.Probe(path, mode=mode, flush_interval=0)  # one part per step: the merge cases below
    for step in steps:
        _save_step(probe, step)
        probe.step()
        if step == snapshot_at:
            probe.flush()
            for kind in KINDS:
                shutil.copytree(path / "stats" / kind / "rank=0", snapshot_to / kind)
    probe.close()


def _check_no_double_count(path: Path, steps_done: int) -> None:
    dump = rlprobe.open(path)
    _check_rows(dump, steps_done)
    con = dump.connect()
    assert _scalar(con, "select count(*) from key_data") == KEY_ROWS_PER_STEP * steps_done
    assert _scalar(con, "select count(*) from (select distinct key, step, rank, micro_step, index from key_data)") \
        == KEY_ROWS_PER_STEP * steps_done
    assert _scalar(con, "select count(*) from scalars") == 2 * steps_done
    assert _scalar(con, "select sum(value) from scalars where name = 'tps'") == float(sum(range(steps_done)))
    for kind in KINDS:
        assert len(dump.parts(kind)[0]) == 1
    # tensors still resolve to one row each
    np.testing.assert_array_equal(dump.tensor("a", 3, micro_step=1), np.full(3, 31, np.float32))


def test_killed_merge_leftovers_do_not_double_count(tmp_path: Path):
    """A merge killed after renaming its output but before deleting its inputs leaves both behind."""
    path, side = tmp_path / "dump", tmp_path / "side"
    _run(path, range(30), snapshot_at=13, snapshot_to=side)
    for kind in KINDS:
        rank_dir = path / "stats" / kind / "rank=0"
        merged = _part_files(rank_dir)
        assert len(merged) == 1
        for f in _part_files(side / kind):  # the inputs of (merges leading to) the final part come back
            shutil.copy2(f, rank_dir / f.name)
        # and the final merge's own inputs: the merged part split back into one part per flush
        table = pq.read_table(merged[0], partitioning=None)
        for step in range(14, 30):
            mask = np.asarray(table["step"].to_numpy() == step)
            pq.write_table(table.filter(mask), rank_dir / f"part-{step:06d}.parquet")
        assert len(_part_files(rank_dir)) > 10
    _check_no_double_count(path, 30)


def test_append_after_killed_merge_cleans_up(tmp_path: Path):
    path, side = tmp_path / "dump", tmp_path / "side"
    _run(path, range(10), snapshot_at=6, snapshot_to=side)
    for kind in KINDS:
        for f in _part_files(side / kind):
            shutil.copy2(f, path / "stats" / kind / "rank=0" / f.name)
    _run(path, range(10, 25), mode="append")  # a new probe continues the run
    for kind in KINDS:
        files = _part_files(path / "stats" / kind / "rank=0")
        assert len(files) == 1, files  # close merged everything and removed the covered leftovers
        assert parse_part(files[0]).first == 0
    _check_no_double_count(path, 25)
    assert rlprobe.open(path).rank_manifests[0]["committed_steps"] == list(range(25))


def test_leftover_temporary_files_are_ignored(tmp_path: Path):
    """A writer killed mid-write leaves a hidden temporary; readers never see it."""
    path = tmp_path / "dump"
    _run(path, range(4))
    rank_dir = path / "stats" / "key_data" / "rank=0"
    part = _part_files(rank_dir)[0]
    (rank_dir / f".{part.name}.tmp-123-deadbeef").write_bytes(part.read_bytes()[:40])
    (rank_dir / ".part-000009.parquet.tmp-1-abc").write_bytes(b"PAR1 garbage")
    dump = rlprobe.open(path)
    _check_rows(dump, 4)
    assert _scalar(dump.connect(), "select count(*) from key_data") == KEY_ROWS_PER_STEP * 4


def test_merges_from_memory_equal_merges_read_back(tmp_path: Path, monkeypatch):
    """Tiered merges use the tables the store wrote (cached) where they fit: same files as reading
    every part back, also when only some parts are cached."""
    import pyarrow as pa

    from rlprobe.lake import parts as parts_mod
    from rlprobe.lake.schema import schema_for

    def rows(step: int) -> list[dict]:
        return [{"monitor": "m", "param": f"p{i}", "step": step, "probe_step": step, "level": "L2",
                 "framework": "torch", "dtype": "float32", "shape": [i + 1, 2], "numel": 2 * i + 2,
                 "max": float(step), "min": -1.0, "norm": float("nan") if i == 1 else 1.5, "digest": None,
                 "digest_algo": None, "bounds": [-1.0, 0.0, 1.0], "bucket_fractions": [0.25] * 4,
                 "zero_fraction": 0.0, "sign_file": f"s{step}.npy", "sign_offset": 8 * i, "sign_numel": 2 * i + 2}
                for i in range(3)]

    def run(directory: Path, cache_bytes: int) -> dict[str, bytes]:
        monkeypatch.setattr(parts_mod, "CACHE_BYTES", cache_bytes)
        store = parts_mod.PartStore(directory)
        for step in range(37):
            store.append(pa.Table.from_pylist(rows(step), schema=schema_for("grad")))
            store.merge_tiered()
        store.merge_all()
        return {f.name: f.read_bytes() for f in _part_files(directory)}

    read_back = run(tmp_path / "a", 0)
    one_table = pa.Table.from_pylist(rows(0), schema=schema_for("grad")).nbytes
    assert run(tmp_path / "b", 1 << 30) == read_back
    assert run(tmp_path / "c", 6 * one_table) == read_back  # some parts cached, some read back
    assert pq.read_table(tmp_path / "b", partitioning=None).num_rows == 37 * 3


def test_a_merge_orders_rows_by_step_stably_whether_its_parts_came_in_order_or_not(tmp_path: Path):
    """Parts in flush order are merged as they are (already by step); a scalar logged for an earlier step
    after later ones is sorted into place, flush order kept within a step; one chunk a column either way."""
    import pyarrow as pa

    from rlprobe.lake.parts import PartStore

    def part(steps, names):
        return pa.table({"step": pa.array(steps, pa.int64()), "name": names})

    for case, parts in {
        "in order": [part([0, 0], ["a", "b"]), part([1], ["c"]), part([1, 2], ["d", "e"])],
        "late": [part([0, 2], ["a", "b"]), part([1, 1], ["c", "d"]), part([0], ["e"])],
        "chunked": [pa.concat_tables([part([3], ["a"]), part([1], ["b"])]), part([1], ["c"])],
    }.items():
        store = PartStore(tmp_path / case.replace(" ", "_"))
        store.directory.mkdir()
        for t in parts:
            store.append(t)
        store.merge_all()
        (merged,) = [pq.read_table(p.path) for p in store.live()]
        rows = list(zip(merged["step"].to_pylist(), merged["name"].to_pylist()))
        everything = [r for t in parts for r in zip(t["step"].to_pylist(), t["name"].to_pylist())]
        assert rows == sorted(everything, key=lambda r: r[0]), case  # stable: ties keep flush order
        assert all(c.num_chunks == 1 for c in merged.columns)

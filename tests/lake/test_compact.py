"""`rlprobe compact` never races a live writer: a rank whose writer process is alive is refused
(named) and left untouched, a killed or finished run is compacted, and parts that two merges
made at once are never read twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe import DumpReadError, ProbeError
from rlprobe.cli import main
from rlprobe.lake.layout import part_name
from rlprobe.lake.rank_writer import compact

REPO = Path(__file__).resolve().parents[2]

# A training process: a part per step; after `steps` steps it says so on stdout and waits for a
# line on stdin, then writes `more` steps and closes (or, with "fork", forks a child that
# outlives it and exits without closing).
WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import rlprobe

    path, steps, more, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    probe = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=0)

    def write(s):
        probe.save({"x": np.full(4, float(s), np.float32), "ids": np.arange(3) + s})
        probe.log_metrics({"loss": float(s)})
        probe.step()

    for s in range(steps):
        write(s)
    probe.flush()
    print("READY", os.getpid(), flush=True)
    if how == "fork":
        if os.fork() == 0:  # a DataLoader-like child that outlives its parent
            print("CHILD", os.getpid(), flush=True)  # once running, past the fork handlers
            time.sleep(60)
            os._exit(0)
        os._exit(1)
    sys.stdin.readline()
    for s in range(steps, steps + more):
        write(s)
    probe.close()
    print("DONE", flush=True)
""")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _start(path: Path, steps: int, more: int, how: str = "wait") -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(steps), str(more), how], env=_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(line.split()[1])


def _files(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file() and "stats" in f.parts}


def _check_rows_once(path: Path, steps: int) -> None:
    dump = rlprobe.open(path)
    kd = dump.key_data().collect()
    assert kd.height == 2 * steps
    assert kd.select("key", "step", "micro_step", "index").n_unique() == kd.height
    assert sorted(kd.filter(kd["key"] == "x")["max"].to_list()) == [float(s) for s in range(steps)]
    assert sorted(dump.scalars().collect()["step"].to_list()) == list(range(steps))
    con = dump.connect()
    assert con.execute("select count(*) from key_data").fetchone()[0] == 2 * steps


def test_compact_refuses_a_rank_whose_writer_is_alive_and_the_writer_finishes_untouched(tmp_path):
    path = tmp_path / "dump"
    proc, pid = _start(path, steps=6, more=6)
    try:
        before = _files(path)
        assert len(list((path / "stats" / "key_data" / "rank=0").glob("part-*.parquet"))) > 1
        result = compact(path)
        assert len(result["refused"]) == 1, result
        message = result["refused"][0]
        assert "rank 0" in message and f"pid {pid}" in message and "rlprobe.Probe" in message, message
        assert _files(path) == before  # nothing merged, nothing deleted
        cli = CliRunner().invoke(main, ["compact", str(path)], catch_exceptions=False)
        assert cli.exit_code == 1 and f"pid {pid}" in cli.output, cli.output
        # a second writer for the same rank is refused the same way, before it touches anything
        with pytest.raises(ProbeError, match=rf"rank 0 of .* live process \(rlprobe.Probe, pid {pid}"):
            rlprobe.Probe(path, rank=0, world_size=1, mode="overwrite")
        assert _files(path) == before
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "DONE" in out, err
    dump = rlprobe.open(path)
    assert dump.complete is True
    assert dump.rank_manifests[0]["committed_steps"] == list(range(12))
    _check_rows_once(path, 12)
    # finished: compact is free to run (close() already left one part per kind)
    assert compact(path)["refused"] == []


@pytest.mark.parametrize("how", ["sigkill", "fork"])
def test_a_killed_writer_releases_its_rank(tmp_path, how):
    """The lock dies with the process (also when a forked child of it lives on): compact runs."""
    path = tmp_path / "dump"
    proc, pid = _start(path, steps=5, more=0, how=how)
    child = None
    try:
        if how == "sigkill":
            os.kill(pid, signal.SIGKILL)
        else:
            line = proc.stdout.readline()
            assert line.startswith("CHILD"), line
            child = int(line.split()[1])
        assert proc.wait(timeout=60) == (-signal.SIGKILL if how == "sigkill" else 1)
        if child is not None:
            os.kill(child, 0)  # still alive, holding a copy of the writer's descriptors
        parts = list((path / "stats" / "key_data" / "rank=0").glob("part-*.parquet"))
        assert len(parts) > 1
        result = compact(path)
        assert result["refused"] == [], result
        assert [p.name for p in (path / "stats" / "key_data" / "rank=0").iterdir()
                if p.suffix == ".parquet"] == [part_name(0, 4)]
        _check_rows_once(path, 5)
        assert rlprobe.open(path).complete is False  # killed: compacted, still not closed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_compact_never_leaves_parts_of_two_concurrent_merges_readable_twice(tmp_path):
    """Two merges that ran at once (only possible for a process that ignores the rank lock)
    leave parts that overlap in part; readers refuse them, naming both, instead of counting the
    shared rows twice, and compact leaves them for a person to sort out."""
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1, flush_interval=0) as probe:
        for s in range(8):
            probe.save({"x": np.full(2, float(s), np.float32)})
            probe.step()
    rank_dir = path / "stats" / "key_data" / "rank=0"
    (merged,) = list(rank_dir.glob("part-*.parquet"))
    table = pq.read_table(merged, partitioning=None)
    steps = table["step"].to_numpy()
    merged.unlink()
    # one merge took flushes 0-5, another 3-7: flushes 3-5 are in both
    pq.write_table(table.filter(pa.array(steps <= 5)), rank_dir / part_name(0, 5))
    pq.write_table(table.filter(pa.array(steps >= 3)), rank_dir / part_name(3, 7))
    for read in (lambda d: d.key_data().collect(), lambda d: d.arrow("key_data"),
                 lambda d: d.connect().execute("select count(*) from key_data").fetchall()):
        with pytest.raises(DumpReadError) as err:
            read(rlprobe.open(path))
        message = str(err.value)
        assert part_name(0, 5) in message and part_name(3, 7) in message and "flushes 3-5" in message, message
    before = _files(path)
    result = compact(path)
    assert len(result["refused"]) == 1 and part_name(3, 7) in result["refused"][0]
    assert _files(path) == before
    cli = CliRunner().invoke(main, ["info", str(path)], catch_exceptions=False)
    assert cli.exit_code == 3 and part_name(3, 7) in cli.output


def test_lock_file_names_its_holder_and_is_released_at_close(tmp_path):
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=2, world_size=4)
    note = json.loads((path / ".rank2.lock").read_text())
    assert note["pid"] == os.getpid() and note["holder"] == "rlprobe.Probe"
    with pytest.raises(ProbeError, match="rank 2 of .* is being written by a live process"):
        rlprobe.Probe(path, rank=2, world_size=4, mode="append")
    rlprobe.Probe(path, rank=3, world_size=4).close()  # other ranks are not affected
    probe.close()
    assert (path / ".rank2.lock").read_text() == ""
    with rlprobe.Probe(path, rank=2, world_size=4, mode="append") as again:  # free once closed
        assert again.current_step == 0
    assert sorted(p.name for p in path.iterdir() if p.name.endswith(".json")) == \
        ["rank2.json", "rank3.json"]  # lock files match no reader's pattern


def _two_ranks(path: Path, live_rank: int) -> rlprobe.Probe:
    """Rank 1 - live_rank closed, rank `live_rank` still being written (the returned probe)."""
    with rlprobe.Probe(path, rank=1 - live_rank, world_size=2, flush_interval=0) as closed:
        for s in range(3):
            closed.save({"x": np.full(2, float(s), np.float32)})
            closed.step()
    live = rlprobe.Probe(path, rank=live_rank, world_size=2, flush_interval=0)
    for s in range(3):
        live.save({"x": np.full(2, float(s), np.float32)})
        live.step()
    live.flush()
    return live


def test_a_foreign_part_of_a_free_rank_stops_compact_before_any_rank_is_merged(tmp_path):
    """The parts of every free rank are checked under its lock before anything is merged."""
    path = tmp_path / "dump"
    (path / "stats" / "key_data" / "rank=2").mkdir(parents=True)
    live = _two_ranks(path, live_rank=0)
    try:
        # a killed rank 2 with parts to merge, and a foreign part in the closed rank 1
        table = pq.read_table(next((path / "stats" / "key_data" / "rank=1").glob("part-*.parquet")),
                              partitioning=None)
        for seq in range(3):
            pq.write_table(table, path / "stats" / "key_data" / "rank=2" / part_name(seq, seq))
        foreign = path / "stats" / "key_data" / "rank=1" / part_name(99, 99)
        pq.write_table(pa.table({"foo": [1]}), foreign)
        before = _files(path)
        with pytest.raises(DumpReadError, match="nothing was compacted") as err:
            compact(path)
        assert str(err.value).startswith(f"{foreign}: not a key_data stats part"), str(err.value)
        assert _files(path) == before
        cli = CliRunner().invoke(main, ["compact", str(path)], catch_exceptions=False)
        assert cli.exit_code == 3 and "nothing was compacted" in cli.output, cli.output
        assert _files(path) == before
        # the locks were released: a writer for the free ranks is not refused
        rlprobe.Probe(path, rank=2, world_size=3, mode="overwrite").close()
    finally:
        live.close()


def test_a_live_ranks_parts_are_not_read_by_compact(tmp_path):
    """A part in a live writer's rank is that writer's business: the rank is refused (exit 1)
    unread, whatever it holds, and the free ranks are compacted."""
    path = tmp_path / "dump"
    live = _two_ranks(path, live_rank=0)
    try:
        (path / "stats" / "key_data" / "rank=0" / part_name(99, 99)).write_bytes(b"")
        live_before = {k: v for k, v in _files(path).items() if "rank=0" in k}
        result = compact(path)
        assert len(result["refused"]) == 1 and "rank 0" in result["refused"][0], result
        assert {k: v for k, v in _files(path).items() if "rank=0" in k} == live_before
        assert [p.name for p in (path / "stats" / "key_data" / "rank=1").iterdir()] == [part_name(0, 2)]
    finally:
        (path / "stats" / "key_data" / "rank=0" / part_name(99, 99)).unlink()
        live.close()


def test_compact_removes_a_killed_writers_hidden_tensor_leftovers_and_nothing_else(tmp_path):
    """A hidden packed file (today's layout), a hidden save-call folder (issue 15 to the seventh session) and a
    hidden .npy (the layout before issue 15), as a writer killed mid-write leaves them, go; the committed
    tensors stay and read the same."""
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        for step in range(2):
            probe.save({"log_prob": np.arange(4, dtype=np.float32) + step})
            probe.step()
    kept = sorted(p.relative_to(path) for p in (path / "tensors").rglob("*.npy*"))
    assert {p.parent.name for p in kept} == {"rank=0"}
    (path / "tensors" / "key_data" / "rank=0" / ".steps=2-2.call=0.npys.tmp-999-00000003").write_bytes(b"\x93NUMPY half")
    call_dir = path / "tensors" / "key_data" / "step=1" / "rank=0"  # issue 15 to the twelfth session
    hidden_call = call_dir / ".call=1.tmp-999-00000001"
    hidden_call.mkdir(parents=True)
    (hidden_call / "log_prob.npy").write_bytes(b"\x93NUMPY half")
    old_layout = path / "tensors" / "key_data" / "key=x" / "step=0" / "rank=0" / "micro_step=0"
    old_layout.mkdir(parents=True)
    (old_layout / "._.npy.tmp-999-00000002").write_bytes(b"half")

    result = compact(path)

    assert result["refused"] == [] and result["tensor_leftovers"] == 3
    assert not hidden_call.exists() and list(old_layout.iterdir()) == []
    assert sorted(p.relative_to(path) for p in (path / "tensors").rglob("*.npy*")) == kept
    dump = rlprobe.open(path)
    for step in range(2):
        np.testing.assert_array_equal(dump.tensor("log_prob", step), np.arange(4, dtype=np.float32) + step)
    out = CliRunner().invoke(main, ["compact", str(path)])
    assert out.exit_code == 0 and "leftover" not in out.output  # nothing left to remove the second time

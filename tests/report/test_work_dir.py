"""Work folders of comparisons and pipelines: those of killed runs go, those of live runs stay,
whatever their process ids; a previous output set aside comes back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlprobe.report.output_folder import LEGACY_AGE_S, WorkDir, remove_dead_work_dirs

PREFIX = ".out.tmp-"

# holds a work folder (and, with "old", a set-aside previous output) until killed
_HOLDER = """
import sys, time
from pathlib import Path
from rlprobe.report.output_folder import WorkDir
work = WorkDir(Path(sys.argv[1]), sys.argv[2])
(work.path / "half.parquet").write_bytes(b"half")
if sys.argv[3] == "old":
    work.old.mkdir()
    (work.old / "summary.json").write_text("previous")
print(work.path, flush=True)
time.sleep(600)
"""


@pytest.fixture
def holders():
    """start(parent, old=False) -> (process, its work folder); every process is killed at teardown."""
    started: list[subprocess.Popen] = []

    def start(parent: Path, old: bool = False) -> tuple[subprocess.Popen, Path]:
        proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(parent), PREFIX, "old" if old else "-"],
                                stdout=subprocess.PIPE, text=True)
        started.append(proc)
        line = proc.stdout.readline().strip()
        assert line, f"the holder process exited with {proc.wait()}"
        return proc, Path(line)

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _names(parent: Path) -> set[str]:
    return {p.name for p in parent.iterdir()}


def test_folders_of_killed_runs_go_and_of_live_runs_stay(tmp_path, holders):
    live, live_dir = holders(tmp_path)
    dead, dead_dir = holders(tmp_path)
    _kill(dead)
    assert {dead_dir.name, dead_dir.name + ".lock"} <= _names(tmp_path)  # what a killed run leaves
    assert remove_dead_work_dirs(tmp_path, PREFIX) == [dead_dir]
    assert _names(tmp_path) == {live_dir.name, live_dir.name + ".lock"}
    assert (live_dir / "half.parquet").read_bytes() == b"half"
    _kill(live)
    assert remove_dead_work_dirs(tmp_path, PREFIX) == [live_dir]
    assert _names(tmp_path) == set()


def test_a_reused_process_id_does_not_keep_a_dead_folder(tmp_path, holders):
    dead, dead_dir = holders(tmp_path)
    _kill(dead)
    # the next run in a container often gets the killed run's process id: here, this process's
    reused = dead_dir.with_name(f"{PREFIX}{os.getpid()}-{dead_dir.name.rsplit('-', 1)[1]}")
    dead_dir.rename(reused)
    Path(str(dead_dir) + ".lock").rename(str(reused) + ".lock")
    mine = WorkDir(tmp_path, PREFIX)
    assert remove_dead_work_dirs(tmp_path, PREFIX) == [reused]
    assert _names(tmp_path) == {mine.path.name, mine.path.name + ".lock"}  # this run's own stays
    mine.remove()
    assert _names(tmp_path) == set()


def test_a_set_aside_output_comes_back_when_the_output_is_missing(tmp_path, holders):
    out = tmp_path / "out"
    dead, dead_dir = holders(tmp_path, old=True)
    _kill(dead)  # as if killed between moving the old output aside and moving the new one in
    assert remove_dead_work_dirs(tmp_path, PREFIX, restore_to=out) == [dead_dir]
    assert (out / "summary.json").read_text() == "previous" and _names(tmp_path) == {"out"}
    # with an output in place, the set-aside one is only removed
    dead, dead_dir = holders(tmp_path, old=True)
    _kill(dead)
    remove_dead_work_dirs(tmp_path, PREFIX, restore_to=out)
    assert (out / "summary.json").read_text() == "previous" and _names(tmp_path) == {"out"}


def test_folders_without_a_lock_go_only_when_a_day_old(tmp_path):
    old = LEGACY_AGE_S + 3600
    names = {"legacy_old": PREFIX + "0123abcd", "legacy_new": PREFIX + "89abcdef",
             "lockless_old": PREFIX + "12-0123abcd", "unrelated": PREFIX + "notes", "other": "data"}
    for key, name in names.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(key)
        if key.endswith("_old") or key == "unrelated":
            t = (tmp_path / name).stat().st_mtime - old
            os.utime(tmp_path / name, (t, t))
    removed = remove_dead_work_dirs(tmp_path, PREFIX)
    assert sorted(p.name for p in removed) == sorted([names["legacy_old"], names["lockless_old"]])
    assert _names(tmp_path) == {names["legacy_new"], names["unrelated"], names["other"]}


def test_nothing_to_remove_and_no_folder(tmp_path):
    assert remove_dead_work_dirs(tmp_path / "missing", PREFIX) == []
    with WorkDir(tmp_path, PREFIX) as path:
        assert path.is_dir() and path.name.startswith(f"{PREFIX}{os.getpid()}-")
        assert remove_dead_work_dirs(tmp_path, PREFIX) == []
    assert _names(tmp_path) == set()
    with pytest.raises(OSError):
        WorkDir(tmp_path / "missing", PREFIX)
    assert _names(tmp_path) == set()

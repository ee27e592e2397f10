"""rlprobe/comparison/pair_results.py: with two workers, the pairs of two msprobe dumps are compared from their
folders' listings while their statistics are read; the SQL still picks the pairs, and every result and
output is the one of comparing the picked pairs afterwards (one worker)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rlprobe.comparison.executor import PairTask, run_pairs
from rlprobe.comparison.key_data import _start_ahead
from rlprobe.comparison.pair_results import AHEAD_MIN_PAIRS, PairsAhead
from rlprobe.lake.reader import open_dump
from rlprobe.pipeline.compare_command import compare

# the threads a comparison starts (other tests of this process may leave threads of their own)
COMPARISON_THREADS = ("rlprobe-pairs-ahead", "rlprobe-compare", "rlprobe-beside-pairs", "rlprobe-single-run")


def _save(run: Path, key: str, step: int, micro: int, array: np.ndarray, stem: str | None = None) -> None:
    """One tensor as msprobe's SingleSave writes it: its .npy and its statistics file."""
    folder = run / "data" / key / f"step{step}" / "rank0" / f"micro_step{micro}"
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{stem or key}.npy", array)
    stats = {"max": float(array.max()), "min": float(array.min()), "mean": float(array.mean()),
             "norm": float(np.linalg.norm(array)), "shape": list(array.shape)}
    (folder / f"{stem or key}.json").write_text(json.dumps({"data": stats}), encoding="utf-8")


def _runs(root: Path) -> tuple[Path, Path]:
    """Two msprobe dumps of 2 keys x 4 steps x 3 micro-steps; B differs in log_prob from step 2 on, holds one
    pair of another shape, a tensor A lacks, and lacks one A holds."""
    a, b = root / "a", root / "b"
    for step in range(4):
        for micro in range(3):
            base = np.linspace(-2, -1, 64, dtype=np.float32).reshape(4, 16) + np.float32(step + micro / 10)
            for run, shift in ((a, 0.0), (b, 1e-3 if step >= 2 else 0.0)):
                _save(run, "log_prob", step, micro, base + np.float32(shift))
                if not (run is b and (step, micro) == (3, 2)):
                    wide = base[:2] if (run is b and (step, micro) == (1, 1)) else base
                    _save(run, "advantages", step, micro, wide * np.float32(2))
    _save(b, "advantages", 0, 0, np.ones(3, np.float32), stem="advantages.extra")
    return a, b


def test_the_pairs_started_ahead_are_run_a_s_files_with_run_b_s_under_the_same_path(tmp_path: Path):
    a, b = _runs(tmp_path)
    started: list[list[PairTask]] = []
    dump_a = open_dump(a)
    _start_ahead(started.append, dump_a, open_dump(b))
    (tasks,) = started
    files = [t.path_a[len(str(a)) + 1:] for t in tasks]
    assert files == dump_a.arrow("key_data")["tensor_file"].to_pylist() and len(files) == 2 * 4 * 3
    assert all(t.path_b == str(b) + t.path_a[len(str(a)):] for t in tasks)
    assert [t.task_id for t in tasks] == list(range(len(tasks)))
    few = tmp_path / "few"
    for step in range(AHEAD_MIN_PAIRS - 1):
        _save(few / "a", "k", step, 0, np.zeros(2, np.float32))
        _save(few / "b", "k", step, 0, np.zeros(2, np.float32))
    _start_ahead(started.append, open_dump(few / "a"), open_dump(few / "b"))
    assert len(started) == 1  # fewer than AHEAD_MIN_PAIRS: compared where the SQL picks them
    _save(few / "a", "k", AHEAD_MIN_PAIRS, 0, np.zeros(2, np.float32))
    _start_ahead(started.append, open_dump(few / "a"), open_dump(few / "b"))
    assert len(started[1]) == AHEAD_MIN_PAIRS
    rlprobe_dump = tmp_path / "rl"
    import rlprobe

    with rlprobe.Probe(rlprobe_dump) as probe:
        probe.save({"k": np.zeros(2, np.float32)})
    _start_ahead(started.append, open_dump(few / "a"), open_dump(rlprobe_dump))
    assert len(started) == 2  # msprobe dumps only


def test_taking_pairs_compared_ahead_gives_run_pairs_results(tmp_path: Path):
    a, b = _runs(tmp_path)
    started: list[list[PairTask]] = []
    _start_ahead(started.append, open_dump(a), open_dump(b))
    ahead_tasks = started[0]
    # the pairs asked for: most in another order under other ids, one renamed in B, one file that is gone
    asked = [PairTask(10 + i, t.path_a, t.path_b) for i, t in enumerate(reversed(ahead_tasks[3:]))]
    renamed = str(b / "data/advantages/step0/rank0/micro_step0/advantages.extra.npy")
    asked.append(PairTask(99, ahead_tasks[0].path_a, renamed))
    asked.append(PairTask(100, str(a / "gone.npy"), str(b / "gone.npy")))
    rest_asked: list[list[PairTask]] = []
    seen: list[tuple[int, int]] = []

    def run_rest(rest, progress):
        rest_asked.append(rest)
        return run_pairs(rest, workers=2, progress=progress)

    taken = PairsAhead(ahead_tasks, 2, lambda: None, run_pairs).take(asked, run_rest, lambda d, t: seen.append((d, t)))
    expected = run_pairs(asked, workers=1)
    assert taken.table().equals(expected.table())
    assert [t.task_id for t in rest_asked[0]] == [99, 100]  # only what was not compared ahead
    assert "shape mismatch" in taken[99]["error"] and "gone.npy" in taken[100]["error"]
    mismatched = next(i for i, t in enumerate(asked) if "step1/rank0/micro_step1/advantages" in t.path_a)
    assert "shape mismatch" in taken[asked[mismatched].task_id]["error"]  # an error compared ahead, carried over
    assert seen and seen[-1][0] == seen[-1][1] > 0  # progress counts the pairs compared ahead too

    everything = PairsAhead(ahead_tasks, 2, lambda: None, run_pairs)
    assert everything.take(ahead_tasks[5:], run_rest).table().equals(run_pairs(ahead_tasks[5:]).table())
    assert len(rest_asked) == 1  # nothing left to compare


def test_comparing_ahead_that_fails_leaves_every_pair_to_the_executor(tmp_path: Path):
    a, b = _runs(tmp_path)
    started: list[list[PairTask]] = []
    _start_ahead(started.append, open_dump(a), open_dump(b))

    def not_ready() -> None:
        raise RuntimeError("the kernels did not load")

    rest_asked = []

    def run_rest(rest, progress):
        rest_asked.append(rest)
        return run_pairs(rest, workers=1, progress=progress)

    taken = PairsAhead(started[0], 2, not_ready, run_pairs).take(started[0], run_rest)
    assert rest_asked == [started[0]]
    assert taken.table().equals(run_pairs(started[0], workers=1).table())


def test_two_workers_comparing_ahead_write_every_output_of_one_worker(tmp_path: Path):
    import zipfile

    a, b = _runs(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    compare(a, b, one, workers=1)
    compare(a, b, two, workers=2)
    assert not [t.name for t in threading.enumerate() if t.name.startswith(COMPARISON_THREADS)]
    assert (one / "key_data.csv").read_bytes() == (two / "key_data.csv").read_bytes()
    key_data = pq.read_table(one / "key_data.parquet")
    assert key_data.equals(pq.read_table(two / "key_data.parquet"))
    statuses = {(r["key"], r["step"], r["micro_step"], r["index"]): r["status"] for r in key_data.to_pylist()}
    assert statuses[("log_prob", 2, 0, "")] != "match" and statuses[("log_prob", 1, 2, "")] == "match"
    assert statuses[("advantages", 3, 2, "")] == "only_in_a" and statuses[("advantages", 0, 0, "extra")] == "only_in_b"
    summaries = [json.loads((out / "summary.json").read_text()) for out in (one, two)]
    for summary in summaries:
        del summary["created_at"], summary["elapsed_s"]
    assert summaries[0] == summaries[1]
    first = summaries[0]["first_divergence"]
    assert (first["key"], first["step"], first["index"], first["status"]) == ("advantages", 0, "extra", "only_in_b")
    assert statuses[("advantages", 1, 1, "")] == "shape_mismatch"  # compared ahead (an error there), not picked
    with zipfile.ZipFile(one / "report.xlsx") as x, zipfile.ZipFile(two / "report.xlsx") as y:
        assert x.namelist() == y.namelist()
        for name in x.namelist():
            if name not in ("docProps/core.xml", "xl/worksheets/sheet1.xml"):  # times: written, elapsed
                assert x.read(name) == y.read(name), name


@pytest.mark.parametrize("selection", [{"keys": ["log_prob"]}, {"steps": [1, 2]}])
def test_a_selection_compares_no_pair_ahead_and_the_same_pairs(tmp_path: Path, selection):
    a, b = _runs(tmp_path)
    one, two = tmp_path / "one", tmp_path / "two"
    compare(a, b, one, workers=1, **selection)
    compare(a, b, two, workers=2, **selection)
    assert pq.read_table(one / "key_data.parquet").equals(pq.read_table(two / "key_data.parquet"))

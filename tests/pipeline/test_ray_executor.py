"""The Ray executor gives the same comparison as the local one (a local Ray instance, started once)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import ray  # noqa: E402  (installed by the dev extra; never skipped)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield
    ray.shutdown()


def test_ray_and_local_give_identical_key_data(tmp_path, dumps, cli, local_ray, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --set paths are relative to the current folder
    spec = tmp_path / "p.yaml"
    spec.write_text(f"version: 1\nname: r\nruns:\n  a: {dumps['a']}\n  b: {dumps['b']}\noutput: ./out\n"
                    "report: {xlsx: false, csv: false}\n", encoding="utf-8")
    local = cli("pipeline", "run", spec, "--set", "output=./local", "--set", "executor.kind=local")
    remote = cli("pipeline", "run", spec, "--set", "output=./ray", "--set", "executor.kind=ray")
    assert local.exit_code == 0 and remote.exit_code == 0, remote.output
    a = pq.read_table(tmp_path / "local" / "key_data.parquet")
    b = pq.read_table(tmp_path / "ray" / "key_data.parquet")
    assert a.num_rows == 12 and a.equals(b)
    assert sum(1 for r in a.to_pylist() if r["status"] == "mismatch") == 2


def test_run_pairs_ray_matches_run_pairs_and_reports_errors(tmp_path, local_ray):
    import numpy as np

    from rlprobe.comparison.executor import PairTask, run_pairs
    from rlprobe.comparison.executor import run_pairs_ray

    tasks = []
    for i in range(6):
        np.save(tmp_path / f"a{i}.npy", np.arange(1000, dtype=np.float32) * (i + 1))
        np.save(tmp_path / f"b{i}.npy", np.arange(1000, dtype=np.float32) * (i + 1) + (i % 2))
        tasks.append(PairTask(i, str(tmp_path / f"a{i}.npy"), str(tmp_path / f"b{i}.npy")))
    tasks.append(PairTask("missing", str(tmp_path / "none.npy"), str(tmp_path / "a0.npy")))
    seen = []
    assert run_pairs_ray(tasks, workers=2, progress=lambda d, t: seen.append((d, t))) == run_pairs(tasks, workers=2)
    assert seen[-1] == (7, 7)
    assert "none.npy" in run_pairs_ray(tasks, workers=2)["missing"]["error"]

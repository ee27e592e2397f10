"""Two processes, one dump directory: a real torch.distributed (gloo) run, and RANK/WORLD_SIZE only."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import rlprobe

REPO = Path(__file__).resolve().parents[2]
STEPS, MICRO_STEPS, WORLD = 3, 2, 2

# The data each rank saves, shared by the worker (which saves it) and the test (which expects it).
VALUES_SRC = textwrap.dedent("""
    import numpy as np

    def values(rank, step, micro):
        base = 1000 * rank + 100 * step + 10 * micro
        return {
            "log_prob": (np.arange(8, dtype=np.float32).reshape(2, 4) - 3.5) * (rank + 1) + base,
            "responses": np.arange(6, dtype=np.int64) + base,             # token ids stay int64
            "bf": np.array([1.5, -0.25, 2 * rank + step / 2 + micro / 4], np.float32),  # bfloat16, exact
            "pair.0": np.full((3,), rank * 2.0 + micro, dtype=np.float64), # list item 0
            "pair.1": np.array(rank == 1),                                 # list item 1 (0-d bool)
        }
""")
_ns: dict = {}
exec(VALUES_SRC, _ns)
values = _ns["values"]

WORKER_SRC = VALUES_SRC + textwrap.dedent("""
    import json, os, sys

    mode, path = sys.argv[1], sys.argv[2]
    import torch

    if mode == "pg":
        import torch.distributed as dist

        rank = int(sys.argv[3])
        dist.init_process_group("gloo", rank=rank, world_size=2)  # MASTER_ADDR/PORT from the environment
    import rlprobe

    probe = rlprobe.Probe(path)  # rank, world size (and in pg mode the run_id) come from the environment
    rank = probe.rank
    for step in range(3):
        for micro in range(2):
            v = values(rank, step, micro)
            probe.save({
                "log_prob": torch.from_numpy(v["log_prob"]),
                "responses": torch.from_numpy(v["responses"]),
                "bf": torch.from_numpy(v["bf"]).to(torch.bfloat16),
                "pair": [torch.from_numpy(v["pair.0"]), torch.from_numpy(v["pair.1"])],
            })
        if mode == "pg":
            total = torch.tensor([float(rank + 1 + step)])
            dist.all_reduce(total)  # the group really talks: both ranks save the same sum
            probe.save({"allreduced": total})
        probe.log_metrics({"loss": 0.5 * rank + step, "rank_metric": float(rank)})
        probe.step()
    probe.save_config({"rank": rank, "lr": 1e-5, "mode": mode})
    probe.close()
    print("RESULT " + json.dumps({"rank": probe.rank, "world_size": probe.world_size, "run_id": probe.run_id}))
    if mode == "pg":
        dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RLPROBE_RUN_ID",
                        "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "MS_ROLE", "MS_WORKER_NUM",
                        "RANK_TABLE_FILE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux") and Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _run_two(tmp_path: Path, argv_env: list[tuple[list[str], dict[str, str]]]) -> list[dict]:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER_SRC)
    procs = [subprocess.Popen([sys.executable, str(worker), *argv], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv, env in argv_env]
    results, failures = [], []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            if p.returncode != 0 or not lines:
                failures.append(f"worker exited {p.returncode}\nstdout:\n{out}\nstderr:\n{err[-4000:]}")
            else:
                results.append(json.loads(lines[-1][len("RESULT "):]))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate() for p in procs]
        pytest.fail("workers hung:\n" + "\n".join(err[-3000:] for _, err in outs))
    assert not failures, "\n\n".join(failures)
    return sorted(results, key=lambda r: r["rank"])


def _check_dump(path: Path, run_id: str, mode: str) -> None:
    manifest = json.loads((path / "rlprobe.json").read_text())
    assert manifest["world_size"] == WORLD
    assert manifest["run_id"] == run_id
    for r in range(WORLD):
        rm = json.loads((path / f"rank{r}.json").read_text())
        assert rm["closed"] is True, r
        assert (rm["rank"], rm["world_size"], rm["run_id"]) == (r, WORLD, run_id)
        assert rm["committed_steps"] == list(range(STEPS))
        assert rm["errors"] == [] and rm["lost"] == []
        for kind in ("key_data", "scalar"):
            parts = list((path / "stats" / kind / f"rank={r}").glob("part-*.parquet"))
            assert len(parts) == 1, (kind, r, parts)  # each rank its own parts, merged at close
    assert not list(path.glob("rank[2-9]*.json"))

    dump = rlprobe.open(path)
    assert dump.format == "rlprobe"
    assert dump.complete is True
    assert sorted(dump.parts("key_data")) == [0, 1]
    assert dump.manifest["run_id"] == run_id

    kd = dump.key_data().collect()
    leaves = ("log_prob", "responses", "bf", "pair")
    per_rank = STEPS * MICRO_STEPS * (len(leaves) + 1) + (STEPS if mode == "pg" else 0)
    assert sorted(kd["rank"].unique().to_list()) == [0, 1]
    for r in range(WORLD):
        assert kd.filter(kd["rank"] == r).height == per_rank, r
    assert kd.select("key", "step", "rank", "micro_step", "index").n_unique() == kd.height
    rows = {(x["key"], x["step"], x["rank"], x["micro_step"], x["index"]): x for x in kd.iter_rows(named=True)}

    for r in range(WORLD):
        for step in range(STEPS):
            for micro in range(MICRO_STEPS):
                v = values(r, step, micro)
                where = (r, step, micro)
                for key, index, dtype in (("log_prob", "", "float32"), ("responses", "", "int64"),
                                          ("bf", "", "bfloat16"), ("pair", "0", "float64"), ("pair", "1", "bool")):
                    expected = v[f"{key}.{index}" if index else key]
                    row = rows[(key, step, r, micro, index)]
                    assert row["dtype"] == dtype, (key, index, where)
                    assert row["framework"] == "torch"
                    assert row["shape"] == list(expected.shape)
                    assert row["max"] == float(expected.max()), (key, index, where)
                    assert row["min"] == float(expected.min()), (key, index, where)
                    got = dump.tensor(key, step, rank=r, micro_step=micro, index=index)
                    want = expected.astype(np.float32) if dtype == "bfloat16" else expected
                    assert got.dtype == want.dtype, (key, index, where)
                    np.testing.assert_array_equal(got, want, err_msg=str((key, index, where)))
                    # the rank's packed file of the calls the writer took with this one (here the micro-batch):
                    # named after the first call in it and the last step
                    m = re.fullmatch(rf"tensors/key_data/rank={r}/steps=(\d+)-(\d+)\.call=(\d+)\.npys",
                                     row["tensor_file"])
                    assert m and int(m[1]) <= step <= int(m[2]), row["tensor_file"]
                    assert int(m[1]) < step or int(m[3]) <= micro, row["tensor_file"]
        if mode == "pg":
            for step in range(STEPS):
                total = float(sum(q + 1 + step for q in range(WORLD)))
                np.testing.assert_array_equal(dump.tensor("allreduced", step, rank=r), np.array([total], np.float32))

    sc = dump.scalars().collect()
    assert sc.height == WORLD * STEPS * 2
    for r in range(WORLD):
        mine = sc.filter((sc["rank"] == r) & (sc["name"] == "loss")).sort("step")
        assert mine["value"].to_list() == [0.5 * r + s for s in range(STEPS)]

    assert (path / "configurations.json").exists()
    assert (path / "configurations.rank1.json").exists()
    assert json.loads((path / "configurations.rank1.json").read_text()) == {"rank": 1, "lr": 1e-5, "mode": mode}
    assert dump.configs() == {r: {"rank": r, "lr": 1e-5, "mode": mode} for r in range(WORLD)}

    con = dump.connect()
    counts = con.sql("select rank, count(*) from key_data group by rank order by rank").fetchall()
    assert counts == [(0, per_rank), (1, per_rank)]
    assert con.sql("select count(distinct rank) from configs").fetchall() == [(2,)]


def test_torch_distributed_gloo_two_ranks_one_dump(tmp_path: Path):
    path = tmp_path / "dump"
    port = str(_free_port())
    runs = []
    for r in range(WORLD):
        env = _base_env()
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)  # no RANK/WORLD_SIZE: detected from the group
        runs.append((["pg", str(path), str(r)], env))
    results = _run_two(tmp_path, runs)
    assert [(x["rank"], x["world_size"]) for x in results] == [(0, WORLD), (1, WORLD)]
    run_ids = {x["run_id"] for x in results}
    assert len(run_ids) == 1, f"ranks disagree on run_id: {run_ids}"  # rank 0's id was broadcast
    _check_dump(path, run_ids.pop(), "pg")


def test_rank_and_world_size_from_environment_only(tmp_path: Path):
    path = tmp_path / "dump"
    runs = []
    for r in range(WORLD):
        env = _base_env()
        env.update(RANK=str(r), WORLD_SIZE=str(WORLD), RLPROBE_RUN_ID="env-run-42")
        runs.append((["env", str(path)], env))
    results = _run_two(tmp_path, runs)
    assert [(x["rank"], x["world_size"], x["run_id"]) for x in results] == \
        [(0, WORLD, "env-run-42"), (1, WORLD, "env-run-42")]
    _check_dump(path, "env-run-42", "env")


def test_second_run_into_finished_distributed_dump_is_refused(tmp_path: Path):
    """Each rank's claim is checked against its own manifest: a rerun without a mode fails on every rank."""
    path = tmp_path / "dump"
    for r in range(WORLD):
        with rlprobe.Probe(path, rank=r, world_size=WORLD, run_id="first") as probe:
            probe.save({"x": np.arange(3) + r})
    for r in range(WORLD):
        with pytest.raises(rlprobe.ProbeError, match=f"rank {r}.*mode='overwrite'"):
            rlprobe.Probe(path, rank=r, world_size=WORLD)
    dump = rlprobe.open(path)
    assert dump.complete is True
    np.testing.assert_array_equal(dump.tensor("x", 0, rank=1), np.arange(3) + 1)


REFUSED_SRC = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    import rlprobe

    path, rank = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        probe = rlprobe.Probe(path)  # rank 0 finds its finished dump and refuses; rank 1 starts
    except rlprobe.ProbeError as e:
        print("REFUSED", e)
    else:
        probe.close()
        print("STARTED")
""")


def test_one_rank_refusing_does_not_hang_the_others(tmp_path: Path):
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as p:
        p.save({"x": np.ones(2)})
    worker = tmp_path / "refused.py"
    worker.write_text(REFUSED_SRC)
    port = str(_free_port())
    procs = []
    for r in range(2):
        env = _base_env()
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(worker), str(path), str(r)], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert "REFUSED" in outs[0] and "mode='overwrite'" in outs[0]
    assert "STARTED" in outs[1]

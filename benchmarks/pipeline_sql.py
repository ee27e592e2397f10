"""Time a pipeline's SQL phase over two large stats-only dumps.

Generates (once, cached under --cache) two dumps of STEPS x RANKS x KEYS x MICRO statistics
written through rlprobe.Probe(stats_only=True) — one Probe per rank, rank=R, world_size=RANKS,
MICRO save calls per step each holding every key, ranks written by --jobs processes — so the
file layout is the real one; in run B key_03 on rank 1 drifts from the middle step on, and B
logs a 7% lower e2e_tps. Then runs a pipeline (matching, first divergence, roll-ups, two
queries, four gates, reports, the history) --repeat times and prints the phases. The SQL phase
is compare_dumps (reading the statistics, matching, statuses, first divergence, verdict,
roll-ups) plus the scalars table, the queries and the gates; it excludes opening the dumps,
writing reports and the history. Default: 1,000 steps x 64 ranks x 16 keys x 4 micro steps.

    python benchmarks/pipeline_sql.py [--steps 1000 --ranks 64 --keys 16 --micro 4] [--cache DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np


DRIFT_RANK = 1  # run B: key_03 on this rank drifts from the middle step on


def write_rank(root: str, rank: int, ranks: int, steps: int, keys: int, micro: int, drift: bool) -> float:
    """One rank's Probe: `micro` save calls per step, each holding every key (stats only)."""
    import rlprobe

    t = time.perf_counter()
    rng = np.random.default_rng(rank)
    names = [f"key_{k:02d}" for k in range(keys)]
    values = {n: rng.standard_normal(4).astype(np.float32) for n in names}
    drifting = names[3 % keys] if drift and rank == DRIFT_RANK % ranks else None
    with rlprobe.Probe(root, stats_only=True, rank=rank, world_size=ranks, run_id="bench") as p:
        for step in range(steps):
            for m in range(micro):
                batch = {n: values[n] * np.float32(1 + step + m) for n in names}
                if drifting and step >= steps // 2:
                    batch[drifting] = batch[drifting] * np.float32(1.001)
                batch[names[0]] = np.float32(step + m)  # a numpy scalar, too
                p.save(batch)
            p.log_metrics({"e2e_tps": 1000.0 * (0.93 if drift else 1.0), "loss": 1.0 / (1 + step),
                           "timing/update": 0.5})
            p.step()
    return time.perf_counter() - t


def generate(cache: Path, steps: int, ranks: int, keys: int, micro: int, jobs: int) -> float | None:
    """Dumps a (reference) and b (drifting) under `cache`, reused when their shape matches;
    returns the seconds spent generating, or None when both came from the cache."""
    shape = {"steps": steps, "ranks": ranks, "keys": keys, "micro": micro, "drift_rank": DRIFT_RANK, "layout": 2}
    runs = {"a": False, "b": True}
    todo = {}
    for name, drift in runs.items():
        marker = cache / name / "bench.json"
        if not (marker.exists() and json.loads(marker.read_text()) == {**shape, "drift": drift}):
            shutil.rmtree(cache / name, ignore_errors=True)
            todo[name] = drift
    if not todo:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    # every rank is its own Probe in its own process; rank 0 of each dump first: it writes the
    # run manifest the other ranks of that dump join
    ctx = multiprocessing.get_context("spawn")  # no inherited threads or locks
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        firsts = [pool.submit(write_rank, str(cache / n), 0, ranks, steps, keys, micro, d) for n, d in todo.items()]
        for f in firsts:
            f.result()
        rest = [pool.submit(write_rank, str(cache / n), r, ranks, steps, keys, micro, d)
                for r in range(1, ranks) for n, d in todo.items()]
        for f in rest:
            f.result()
    for name, drift in todo.items():
        (cache / name / "bench.json").write_text(json.dumps({**shape, "drift": drift}))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--keys", type=int, default=16)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--cache", "--dir", dest="cache", type=Path,
                    default=Path(os.environ.get("TMPDIR", "/tmp")) / "rlprobe_bench_pipeline",
                    help="where the generated dumps are kept and reused (and the pipeline output goes)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="processes writing ranks")
    ap.add_argument("--repeat", type=int, default=3, help="pipeline runs to time")
    ap.add_argument("--generate-only", action="store_true")
    args = ap.parse_args()

    dims = (args.steps, args.ranks, args.keys, args.micro)
    took = generate(args.cache, *dims, args.jobs)
    if took is None:
        print(f"dumps reused from {args.cache}")
    else:
        print(f"generated dumps a and b through rlprobe.Probe in {took:.1f} s ({args.jobs} processes)")
    rows = args.steps * args.ranks * args.keys * args.micro
    print(f"dumps: {args.steps} steps x {args.ranks} ranks x {args.keys} keys x {args.micro} micro steps "
          f"= {rows:,} key-data rows each, stats only")
    if args.generate_only:
        return

    from rlprobe.pipeline.runner import run_pipeline
    from rlprobe.pipeline.spec import load_pipeline

    spec = args.cache / "bench.yaml"
    spec.write_text(f"""version: 1
name: bench
runs: {{a: ./a, b: ./b}}
output: ./out
queries: [sql/first_divergence.sql, sql/status_counts.sql]
gates:
  - {{name: key_03_identical, sql: "select * from key_data where key = 'key_03' and status <> 'stats_only_match'"}}
  - {{name: tps, sql: sql/gates/tps_regression.sql}}
  - {{name: loss, sql: sql/gates/loss_drift.sql}}
  - {{name: timing, sql: sql/gates/timing_regression.sql}}
report: {{xlsx: false, csv: false, markdown: true, junit: true, plots: false}}
history: ./history.parquet
""")
    pipeline = load_pipeline(spec)
    sql_phases = []
    for i in range(args.repeat):
        t = time.perf_counter()
        result = run_pipeline(pipeline)
        total = time.perf_counter() - t
        tm = result.timings
        sql_phase = tm["compare_s"] + tm["sql_s"]
        sql_phases.append(sql_phase)
        first = result.summary["first_divergence"]
        print(f"run {i + 1}: first divergence {first['key']} step {first['step']} rank {first['rank']} "
              f"({first['status']}); gates: "
              + ", ".join(f"{g.name} {'pass' if g.passed else f'FAIL {g.rows.num_rows} rows'}" for g in result.gates))
        print(f"  read stats + match + first divergence + roll-ups (compare_dumps): {tm['compare_s']:.2f} s")
        print(f"  scalars + queries + gates:                                       {tm['sql_s']:.2f} s")
        print(f"  SQL phase:                                                       {sql_phase:.2f} s (goal < 10 s)")
        print(f"  writing key_data.parquet, summary.md, JUnit:                     {tm['reports_s']:.2f} s")
        print(f"  whole pipeline (incl. opening the dumps and the history):        {total:.2f} s")
    ordered = sorted(sql_phases)
    print(f"SQL phase over {args.repeat} runs: best {ordered[0]:.2f} s, median {ordered[len(ordered) // 2]:.2f} s, "
          f"worst {ordered[-1]:.2f} s")


if __name__ == "__main__":
    main()

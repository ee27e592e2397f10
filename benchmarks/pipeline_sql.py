"""Time a pipeline's SQL phase over two large stats-only dumps.

Generates (once, cached) two dumps of STEPS x RANKS x KEYS x MICRO statistics written through
rlprobe.Probe(stats_only=True) — one Probe per rank, rank=R, world_size=RANKS — so the file
layout is the real one; run B drifts on one key from the middle step on and logs a 7% lower
e2e_tps. Then runs a pipeline (matching, first divergence, roll-ups, four gates, the history)
and prints the phases. Default: 1,000 steps x 64 ranks x 16 keys x 4 micro steps.

    python benchmarks/pipeline_sql.py [--steps 1000 --ranks 64 --keys 16 --micro 4] [--dir /tmp/...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np


def write_rank(root: str, rank: int, ranks: int, steps: int, keys: int, micro: int, drift: bool) -> None:
    import rlprobe

    rng = np.random.default_rng(rank)
    names = [f"key_{k:02d}" for k in range(keys)]
    values = {n: rng.standard_normal(4).astype(np.float32) for n in names}
    with rlprobe.Probe(root, stats_only=True, rank=rank, world_size=ranks, run_id="bench") as p:
        for step in range(steps):
            for m in range(micro):
                batch = {n: values[n] * (1 + step + m) for n in names}
                if drift and step >= steps // 2:
                    batch[names[3]] = batch[names[3]] * np.float32(1.001)
                batch[names[0]] = np.float32(step + m)  # a numpy scalar, too
                p.save(batch)
            p.log_metrics({"e2e_tps": 1000.0 * (0.93 if drift else 1.0), "loss": 1.0 / (1 + step),
                           "timing/update": 0.5})
            p.step()


def generate(root: Path, steps: int, ranks: int, keys: int, micro: int, drift: bool, jobs: int) -> float:
    shape = {"steps": steps, "ranks": ranks, "keys": keys, "micro": micro, "drift": drift}
    marker = root / "bench.json"
    if marker.exists() and json.loads(marker.read_text()) == shape:
        return 0.0
    shutil.rmtree(root, ignore_errors=True)
    t = time.perf_counter()
    # rank 0 first: it writes the run manifest the other ranks join
    write_rank(str(root), 0, ranks, steps, keys, micro, drift)
    with ProcessPoolExecutor(jobs) as pool:
        list(pool.map(write_rank, [str(root)] * (ranks - 1), range(1, ranks), [ranks] * (ranks - 1),
                      [steps] * (ranks - 1), [keys] * (ranks - 1), [micro] * (ranks - 1), [drift] * (ranks - 1)))
    marker.write_text(json.dumps(shape))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--keys", type=int, default=16)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "rlprobe_bench_pipeline")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="processes writing ranks")
    args = ap.parse_args()
    sys.modules.setdefault("scipy", None)  # type: ignore[arg-type]  # numba need not load scipy

    dims = (args.steps, args.ranks, args.keys, args.micro)
    for name, drift in (("a", False), ("b", True)):
        took = generate(args.dir / name, *dims, drift, args.jobs)
        if took:
            print(f"generated dump {name} through rlprobe.Probe in {took:.1f} s")
    rows = args.steps * args.ranks * args.keys * args.micro
    print(f"dumps: {args.steps} steps x {args.ranks} ranks x {args.keys} keys x {args.micro} micro steps "
          f"= {rows:,} key-data rows each, stats only")

    from rlprobe.pipeline.runner import run_pipeline
    from rlprobe.pipeline.spec import load_pipeline

    spec = args.dir / "bench.yaml"
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
    t = time.perf_counter()
    result = run_pipeline(pipeline)
    total = time.perf_counter() - t
    tm = result.timings
    sql_phase = tm["compare_s"] + tm["sql_s"]
    first = result.summary["first_divergence"]
    print(f"first divergence: {first['key']} step {first['step']} ({first['status']}); gates: "
          + ", ".join(f"{g.name} {'pass' if g.passed else f'FAIL {g.rows.num_rows} rows'}" for g in result.gates))
    print(f"read + match + first divergence + roll-ups (compare_dumps): {tm['compare_s']:.2f} s")
    print(f"queries + gates:                                            {tm['sql_s']:.2f} s")
    print(f"SQL phase:                                                  {sql_phase:.2f} s (goal < 10 s)")
    print(f"writing key_data.parquet, summary, JUnit:                   {tm['reports_s']:.2f} s")
    print(f"whole pipeline (incl. history):                             {total:.2f} s")


if __name__ == "__main__":
    main()

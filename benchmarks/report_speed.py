"""Report writing speed: each writer of a comparison's output folder, timed on the tables of two
realistic RL comparisons, for two source trees in the same run (issue 18).

    python benchmarks/report_speed.py --baseline /path/to/other/checkout [--repeat 5] [--tmp DIR]

Makes once, under --tmp (kept with --keep):
- an rlprobe dump pair of 200 steps x 8 ranks x 16 keys of 4 x 64 float32 written with
  rlprobe.Probe (25,600 pairs; run B differs in two keys from step 120 on);
- an msprobe-format pair of 100 steps x 4 micro-batches x 8 keys of [4, 64] / [4, 512] float32
  (3,200 pairs; run B differs in one key from step 50 on);
compares each pair once in memory (rlprobe.comparison.run.compare_dumps) and keeps the tables and the
summary. Then, alternating the two trees, each repetition loads the kept tables in a fresh
process with that tree first on sys.path and times each writer of
rlprobe/report/comparison_files.py: the Parquet tables, summary.json, key_data.csv, report.xlsx,
summary.md. Prints per workload and writer the paired median of (this tree / baseline) and both
medians. The machine may be shared: the figures are noisy, so compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rlprobe.comparison.options import CompareOptions

HERE = Path(__file__).resolve().parent
WRITERS = ("tables", "summary_json", "csv", "xlsx", "markdown")


def make_rlprobe_pair(root: Path) -> tuple[Path, Path]:
    import rlprobe

    keys = [f"key{k:02d}" for k in range(16)]
    for name, perturbed in (("a", False), ("b", True)):
        for rank in range(8):
            rng = np.random.default_rng(rank)
            with rlprobe.Probe(root / name, rank=rank, world_size=8, run_id="bench") as probe:
                for step in range(200):
                    values = {}
                    for k, key in enumerate(keys):
                        value = rng.standard_normal((4, 64), dtype=np.float32)
                        if perturbed and k in (3, 7) and step >= 120:
                            value = value + np.float32(1e-3)
                        values[key] = value
                    probe.save(values)
                    probe.step()
    return root / "a", root / "b"


def make_msprobe_pair(root: Path) -> tuple[Path, Path]:
    shapes = {f"key{k}": (4, 64) if k % 2 else (4, 512) for k in range(8)}
    for name, perturbed in (("a", False), ("b", True)):
        rng = np.random.default_rng(0)
        for step in range(100):
            for micro in range(4):
                for key, shape in shapes.items():
                    value = rng.standard_normal(shape, dtype=np.float32)
                    if perturbed and key == "key2" and step >= 50:
                        value = value + np.float32(1e-3)
                    d = root / name / "data" / key / f"step{step}" / "rank0" / f"micro_step{micro}"
                    d.mkdir(parents=True, exist_ok=True)
                    np.save(d / f"{key}.npy", value)
                    stats = {"max": float(value.max()), "min": float(value.min()), "mean": float(value.mean()),
                             "norm": float(np.linalg.norm(value)), "shape": list(value.shape)}
                    (d / f"{key}.json").write_text(json.dumps({"data": stats}, indent=4))
    return root / "a", root / "b"


def compare_once(a: Path, b: Path, cache: Path) -> None:
    """The comparison's tables and summary, as write_tables / write_reports get them."""
    import pyarrow.parquet as pq

    from rlprobe.comparison.run import compare_dumps
    from rlprobe.lake.reader import open_dump

    tables, summary = compare_dumps(open_dump(a), open_dump(b), CompareOptions(workers=2))
    summary["elapsed_s"] = 1.0
    cache.mkdir(parents=True)
    for name, table in tables.items():
        pq.write_table(table, cache / f"{name}.parquet")
    (cache / "summary.pickle").write_bytes(pickle.dumps(summary))


TIMER = r"""
import json, pickle, sys, time
from pathlib import Path
import pyarrow.parquet as pq
cache, folder = Path(sys.argv[1]), Path(sys.argv[2])
import rlprobe.report.comparison_files as cf
tables = {p.stem: pq.read_table(p) for p in cache.glob("*.parquet")}
summary = pickle.loads((cache / "summary.pickle").read_bytes())
folder.mkdir()
public = cf.public_key_data(tables["key_data"])
times = {}
t = time.perf_counter(); extras = cf.write_tables(folder, tables); times["tables"] = time.perf_counter() - t
t = time.perf_counter(); cf.write_summary_json(folder, summary); times["summary_json"] = time.perf_counter() - t
from rlprobe.report.csv_report import write_key_data_csv
from rlprobe.report.xlsx import write_report_xlsx
from rlprobe.report.markdown import render_summary_md
t = time.perf_counter(); write_key_data_csv(folder / "key_data.csv", public); times["csv"] = time.perf_counter() - t
t = time.perf_counter(); write_report_xlsx(folder / "report.xlsx", public, summary, **extras)
times["xlsx"] = time.perf_counter() - t
t = time.perf_counter(); (folder / "summary.md").write_text(render_summary_md(summary, public), encoding="utf-8")
times["markdown"] = time.perf_counter() - t
print(json.dumps(times))
"""


def time_writers(tree: Path, cache: Path, folder: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", TIMER, str(cache), str(folder)], capture_output=True, text=True,
                         env=env, cwd=tree)
    if out.returncode != 0:
        raise RuntimeError(f"the writers of {tree} failed: {out.stderr[-3000:]}")
    shutil.rmtree(folder)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the checkout to compare with (e.g. the integration branch)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tmp", default=None, help="where the dumps and tables go (reused when they are there)")
    ap.add_argument("--keep", action="store_true", help="keep --tmp's dumps and tables for the next run")
    args = ap.parse_args()
    work = Path(args.tmp) if args.tmp else Path(tempfile.mkdtemp(prefix="bench-reports-"))
    trees = {"baseline": Path(args.baseline).resolve(), "this": HERE.parent}
    try:
        caches = {}
        for name, make in (("rlprobe_25600", make_rlprobe_pair), ("msprobe_3200", make_msprobe_pair)):
            cache = work / name / "tables"
            if not cache.exists():
                t0 = time.perf_counter()
                a, b = make(work / name)
                compare_once(a, b, cache)
                print(f"{name}: made and compared in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            caches[name] = cache
        runs = {(w, t): [] for w in caches for t in trees}
        for i in range(args.repeat):
            for workload, cache in caches.items():
                for tree in (("baseline", "this") if i % 2 == 0 else ("this", "baseline")):
                    runs[workload, tree].append(time_writers(trees[tree], cache, work / f"out-{tree}"))
        report = {"load_average": os.getloadavg()}
        for workload in caches:
            rows = {}
            for writer in WRITERS + ("total",):
                def get(r, writer=writer):
                    return sum(r.values()) if writer == "total" else r[writer]
                base = [get(r) for r in runs[workload, "baseline"]]
                this = [get(r) for r in runs[workload, "this"]]
                rows[writer] = {"baseline_s": round(statistics.median(base), 3),
                                "this_s": round(statistics.median(this), 3),
                                "paired_ratio": round(statistics.median(t / b for t, b in zip(this, base) if b), 3)}
            report[workload] = rows
        print(json.dumps(report, indent=2))
    finally:
        if not args.keep and not args.tmp:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

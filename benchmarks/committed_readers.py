"""What reading committed steps only costs: each reader over one large dump, with the default
filter (each rank's committed_steps) and with include_uncommitted=True, in the same process.

The dump is benchmarks/pipeline_sql.py's run A (generated once through rlprobe.Probe, one
process per rank, and cached): by default 1,000 steps x 64 ranks x 4 keys x 1 micro step.
Every step is committed, so both ways return the same rows and the difference is the filter.
Closed ranks need no filter (they committed every row they wrote); a copy whose rank
manifests say "not closed", as a killed run's do, times the filter itself.

    python benchmarks/committed_readers.py [--steps 1000 --ranks 64 --keys 4 --micro 1] [--cache DIR] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline_sql import generate  # noqa: E402


def _readers(path: Path):
    import duckdb

    import rlprobe
    from rlprobe.comparison.key_data import load_stats
    from rlprobe.pipeline.info_output import dump_info

    def polars_key_data(include: bool) -> int:
        return rlprobe.open(path, include_uncommitted=include).key_data().select("step").collect().height

    def arrow_key_data(include: bool) -> int:
        return rlprobe.open(path, include_uncommitted=include).arrow("key_data").num_rows

    def duckdb_view(include: bool) -> int:
        con = rlprobe.open(path, include_uncommitted=include).connect()
        return con.execute("SELECT count(*) FROM key_data").fetchone()[0]

    def compare_stats(include: bool) -> int:
        con = duckdb.connect()
        load_stats(con, "stats_a", rlprobe.open(path, include_uncommitted=include), [], "A")
        return con.execute("SELECT count(*) FROM stats_a").fetchone()[0]

    def info(include: bool) -> int:
        return sum(k["tensors"] for k in dump_info(rlprobe.open(path, include_uncommitted=include))["keys"])

    return {"Dump.key_data() (polars)": polars_key_data, "Dump.arrow('key_data')": arrow_key_data,
            "DuckDB view key_data": duckdb_view, "compare: stats table": compare_stats, "rlprobe info": info}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--keys", type=int, default=4)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "rlprobe_bench_committed")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    took = generate(args.cache, args.steps, args.ranks, args.keys, args.micro, args.jobs)
    print("dump reused" if took is None else f"generated in {took:.1f} s", f"({args.cache / 'a'})")
    killed = args.cache / "a-killed"
    if not killed.exists():
        shutil.copytree(args.cache / "a", killed)
        for manifest in killed.glob("rank*.json"):
            m = json.loads(manifest.read_text())
            manifest.write_text(json.dumps({**m, "closed": False}))
    print(f"{args.steps} steps x {args.ranks} ranks x {args.keys} keys x {args.micro} micro steps; "
          f"median of {args.repeat}, committed-only vs include_uncommitted=True")
    for label, path in (("closed ranks", args.cache / "a"), ("killed ranks", killed)):
        print(label)
        _time(path, args.repeat)


def _time(path: Path, repeat: int) -> None:
    for name, read in _readers(path).items():
        read(True), read(False)  # warm: imports, file cache
        times = {True: [], False: []}
        rows = {}
        for _ in range(repeat):
            for include in (False, True):
                t = time.perf_counter()
                rows[include] = read(include)
                times[include].append(time.perf_counter() - t)
        filtered, plain = statistics.median(times[False]), statistics.median(times[True])
        assert rows[False] == rows[True], (name, rows)
        print(f"  {name:28s} {filtered * 1e3:8.1f} ms vs {plain * 1e3:8.1f} ms  x{filtered / plain:.2f}  "
              f"({rows[False]:,} rows)")


if __name__ == "__main__":
    main()

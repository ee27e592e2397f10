"""How a comparison's time and memory grow with the number of pairs (issue 42, item 6).

    python benchmarks/compare_scaling.py [--ranks 8,32,128] [--workers 2] [--cache DIR] [--tmp DIR]
                                         [--repeat 1] [--json FILE]

The workload is compare_speed.py's rlprobe_small (200 steps x 16 keys of 4 x 64 float32 per rank, real
``rlprobe.Probe`` dumps, run B differing in one key from step 100 on) at more ranks: 8 ranks are 25,600
pairs, 128 ranks 409,600, 512 ranks 1,638,400. Each `rlprobe compare A B -o OUT --workers W --quiet` runs as
a child process; its wall time, CPU time (user + system) and peak RSS come from its own rusage (wait4). The
output files' sizes are printed beside them. Prints per-pair time and memory, and the targets: peak memory
under 1 GB at every size, time linear in the pairs (the largest size's time per pair within 1.5 x the
middle one's).

The dumps are written once into --cache (default: a temp folder; 128 ranks take a few minutes and ~0.6 GB
for both runs, 512 ranks four times that).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_workloads  # noqa: E402  (benchmarks/ is not a package)
from compare_speed import run_child  # noqa: E402

GB = 1 << 30


def folder_bytes(root: Path) -> dict[str, int]:
    """Bytes of each output file of a comparison folder, by name (the plots folder summed)."""
    sizes: dict[str, int] = {}
    for path in root.rglob("*"):
        if path.is_file():
            name = path.relative_to(root).parts[0]
            sizes[name] = sizes.get(name, 0) + path.stat().st_size
    return sizes


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="8,32,128", help="comma-separated rank counts (pairs = ranks x 3,200)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per size (the median is reported)")
    ap.add_argument("--cache", type=Path, help="folder for the dumps (kept)")
    ap.add_argument("--tmp", type=Path, help="folder for the comparison outputs")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--record", action="store_true",
                    help="write the figures into benchmarks/RESULTS.md's compare_scaling section (benchmarks/results.py)")
    args = ap.parse_args(argv)
    sizes = [int(r) for r in args.ranks.split(",")]
    cache = args.cache or Path(tempfile.mkdtemp(prefix="rlprobe-scaling-"))
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="rlprobe-scaling-out-", dir=args.tmp))
    rows = []
    try:
        for ranks in sizes:
            a, b = compare_workloads.rlprobe_small(cache, ranks)
            pairs = ranks * compare_workloads.RL_STEPS * compare_workloads.RL_KEYS
            runs = []
            for i in range(args.repeat):
                out = tmp / f"r{ranks}-{i}"
                cmd = [sys.executable, "-m", "rlprobe.cli", "compare", str(a), str(b), "-o", str(out),
                       "--workers", str(args.workers), "--quiet"]
                wall, _, rss, cpu = run_child(cmd)
                runs.append((wall, cpu, rss, folder_bytes(out)))
                if i < args.repeat - 1:
                    shutil.rmtree(out, ignore_errors=True)
            runs.sort(key=lambda r: r[0])
            wall, cpu, rss, outputs = runs[len(runs) // 2]
            rows.append({"ranks": ranks, "pairs": pairs, "wall_s": wall, "cpu_s": cpu, "peak_rss": rss,
                         "us_per_pair": wall / pairs * 1e6, "rss_bytes_per_pair": rss / pairs, "outputs": outputs,
                         "load": os.getloadavg()[0]})
            r = rows[-1]
            big = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(outputs.items(), key=lambda kv: -kv[1])[:4])
            print(f"{ranks:4d} ranks, {pairs:9,d} pairs: {wall:6.2f} s (CPU {cpu:6.2f} s), peak {rss / 1e6:7.0f} MB; "
                  f"{r['us_per_pair']:.1f} us and {r['rss_bytes_per_pair']:.0f} B a pair; load {r['load']:.1f}; {big}",
                  flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if args.cache is None:
            shutil.rmtree(cache, ignore_errors=True)
    print("\ntargets:")
    for r in rows:
        print(f"  peak memory under 1 GB at {r['pairs']:,} pairs: {r['peak_rss'] / GB:.2f} GB "
              f"{'ok' if r['peak_rss'] < GB else 'MISSED'}")
    if len(rows) >= 3:
        mid, last = rows[-2], rows[-1]
        ratio = last["us_per_pair"] / mid["us_per_pair"]
        print(f"  time linear: {last['pairs']:,} pairs' time a pair / {mid['pairs']:,} pairs' = {ratio:.2f} "
              f"{'ok' if ratio <= 1.5 else 'MISSED'} (<= 1.5)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.record:
        import results

        results.record(
            "compare_scaling", "Comparison time and memory against the number of pairs",
            f"python benchmarks/compare_scaling.py --ranks {args.ranks} --workers {args.workers} --record",
            ["ranks", "pairs", "wall", "CPU", "peak memory", "µs a pair", "bytes a pair", "report.xlsx", "key_data.csv"],
            [[r["ranks"], f"{r['pairs']:,}", f"{r['wall_s']:.2f} s", f"{r['cpu_s']:.2f} s", f"{r['peak_rss'] / 1e6:.0f} MB",
              f"{r['us_per_pair']:.1f}", f"{r['rss_bytes_per_pair']:.0f}", f"{r['outputs'].get('report.xlsx', 0) / 1e6:.1f} MB",
              f"{r['outputs'].get('key_data.csv', 0) / 1e6:.1f} MB"] for r in rows],
            notes="One `rlprobe compare --quiet` per size, its own rusage; the goal: peak memory under 1 GB at every size.")
    return rows


if __name__ == "__main__":
    main()

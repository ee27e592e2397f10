"""Comparison speed: `rlprobe compare` vs msprobe 8.1.2's SingleComparator, same dumps, same run.

    python benchmarks/compare_speed.py [--repeat 3] [--tmp DIR] [--workloads large,msprobe_small,rlprobe_small]
                                       [--baseline /path/to/other/checkout] [--cache DIR]

Workloads (issue 18 adds the two small ones, benchmarks/compare_workloads.py):
- large: the 2 x 660 MB msprobe-format dumps below;
- msprobe_small: 3,200 pairs of [4, 64] / [4, 512] float32 in msprobe format (100 steps x 4
  micro-batches x 8 keys, ~47 MB), msprobe's SingleComparator timed on it too;
- rlprobe_small: an rlprobe dump of 200 steps x 8 ranks x 16 keys of 4 x 64 float32 (25,600 pairs).
Each rlprobe command runs with --workers 1 and 2 and its peak RSS and CPU time (user + system:
the child's rusage from wait4, steadier than wall time on a shared machine) are recorded, with the
1-minute load average at each repeat; "beyond start-up" is a command's time minus the median
start-up (two one-step dumps of one 4-element tensor). With --baseline, the same commands run from another checkout too
(PYTHONPATH), alternating with this one, for paired ratios. Prints every target of issue 18 with
its measured value. The small dumps are written once into --cache (default: a temp folder). Each
checkout compares every workload once, untimed, first: numba's cache then holds its kernels (a cold
cache compiles them: seconds, which the first timed run used to pay).

The large workload:

Makes two msprobe-format dumps (as msprobe's SingleSave writes them: float32 .npy + JSON
statistics) of 8 keys — log_prob, old_log_prob, ref_log_prob, advantages (float32 256x4096),
responses (token ids 256x4096, stored as float32 the way msprobe stores integers), prompts
(256x512), kl_loss and loss (0-d) — x 8 steps x 4 micro steps, about 660 MB each; run B
differs from run A in log_prob from step 4 on. Then, alternating and repeated:
- msprobe: SingleComparator.compare(a, b, out, num_processes=2) in msprobe's virtual
  environment (benchmarks/setup_msprobe_venv.sh); the time inside the call and the whole process;
- rlprobe: `rlprobe compare A B -o OUT --workers 2 --quiet` (xlsx, CSV, summary; no plots), the
  whole command;
- rlprobe on a tiny dump pair: the command's fixed start-up;
- `cat` of both dumps' files to /dev/null: the practical limit of reading them.
Prints medians and the ratios the issue asks for.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_workloads  # noqa: E402  (benchmarks/ is not a package)

HERE = Path(__file__).resolve().parent
KEYS = {"log_prob": (256, 4096), "old_log_prob": (256, 4096), "ref_log_prob": (256, 4096),
        "advantages": (256, 4096), "responses": (256, 4096), "prompts": (256, 512), "kl_loss": (), "loss": ()}
STEPS, MICRO = 8, 4


def write_msprobe_dump(root: Path, seed: int, perturb_from: int | None) -> None:
    rng = np.random.default_rng(seed)
    for step in range(STEPS):
        for micro in range(MICRO):
            for key, shape in KEYS.items():
                if key in ("responses", "prompts"):
                    value = rng.integers(0, 50000, shape).astype(np.float32)
                else:
                    value = rng.standard_normal(shape, dtype=np.float32)
                if perturb_from is not None and key == "log_prob" and step >= perturb_from:
                    value = value + np.float32(1e-4)
                compare_workloads.write_msprobe_entry(root, key, step, micro, value)


def dump_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*.npy"))


MSPROBE_SNIPPET = """
import sys, time
from msprobe.core import SingleComparator
t0 = time.perf_counter()
SingleComparator.compare(sys.argv[1], sys.argv[2], sys.argv[3], num_processes=2)
print(time.perf_counter() - t0)
"""


def run_child(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, str, int, float]:
    """(seconds, stdout, peak RSS in bytes, CPU seconds: user + system) of one child process (its own
    rusage, from wait4). `python -m` puts the working folder first on sys.path: run a checkout's
    commands from inside that checkout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {stderr[-2000:]}")
    return elapsed, stdout, int(usage.ru_maxrss) * 1024, usage.ru_utime + usage.ru_stime


def rlprobe_env(checkout: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(checkout)
    return env


def warm_up_cache(checkout: Path, dumps: dict[str, tuple[Path, Path]], out: Path) -> None:
    """One untimed `rlprobe compare` per workload: a checkout whose kernel sources are new to numba's
    cache (each gets its own folder) compiles its kernels here (seconds each), not in a timed run."""
    for wl, (a, b) in dumps.items():
        elapsed, _, _, _ = run_child([sys.executable, "-m", "rlprobe.cli", "compare", str(a), str(b), "-o", str(out),
                                      "--quiet"], rlprobe_env(checkout), cwd=checkout)
        print(f"cache warm-up ({checkout}, {wl}): {elapsed:.2f} s", flush=True)
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--cache", default=None, help="folder for the small workloads' dumps (kept)")
    ap.add_argument("--workloads", default="large,msprobe_small,rlprobe_small")
    ap.add_argument("--baseline", default=None, help="another rlprobe checkout, run alternately for paired ratios")
    args = ap.parse_args()

    msprobe_py = Path(os.environ.get("MSPROBE_PYTHON", HERE.parent / ".venv-msprobe" / "bin" / "python"))
    work = Path(tempfile.mkdtemp(prefix="bench-compare-", dir=args.tmp))
    cache = Path(args.cache) if args.cache else work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    versions = {"rlprobe": HERE.parent} | ({"baseline": Path(args.baseline)} if args.baseline else {})
    wanted = args.workloads.split(",")
    try:
        dumps: dict[str, tuple[Path, Path]] = {"tiny": compare_workloads.tiny(cache)}
        if "large" in wanted:
            a, b = work / "a", work / "b"
            write_msprobe_dump(a, 0, None)
            write_msprobe_dump(b, 0, 4)
            dumps["large"] = (a, b)
        if "msprobe_small" in wanted:
            dumps["msprobe_small"] = compare_workloads.msprobe_small(cache)
        if "rlprobe_small" in wanted:
            dumps["rlprobe_small"] = compare_workloads.rlprobe_small(cache)
        runs: dict[str, list] = {}

        def record(name: str, value) -> None:
            runs.setdefault(name, []).append(value)

        n = 0
        for label, checkout in versions.items():  # untimed: each checkout's kernels into numba's cache
            warm_up_cache(checkout, dumps, work / f"warm-{label}")
        for i in range(args.repeat):
            record("load_average_1min", os.getloadavg()[0])  # a shared machine: the figures are as quiet as this
            order = list(versions.items()) if i % 2 == 0 else list(versions.items())[::-1]
            for label, checkout in order:
                env = rlprobe_env(checkout)
                for wl, (a, b) in dumps.items():
                    for workers in ((2,) if wl == "tiny" else (1, 2)):
                        n += 1
                        cmd = [sys.executable, "-m", "rlprobe.cli", "compare", str(a), str(b), "-o",
                               str(work / f"out-{n}"), "--workers", str(workers), "--quiet"]
                        elapsed, _, peak, cpu = run_child(cmd, env, cwd=checkout)
                        record(f"{label}/{wl}/w{workers}/s", elapsed)
                        record(f"{label}/{wl}/w{workers}/cpu_s", cpu)
                        record(f"{label}/{wl}/w{workers}/peak_MB", peak / 1e6)
                        shutil.rmtree(work / f"out-{n}", ignore_errors=True)
            if msprobe_py.exists() and i < 2:  # msprobe twice: the faster run is its figure
                for wl in ("msprobe_small", "large"):
                    if wl in dumps:
                        n += 1
                        a, b = dumps[wl]
                        elapsed, stdout, peak, _ = run_child([str(msprobe_py), "-c", MSPROBE_SNIPPET, str(a), str(b),
                                                              str(work / f"out-{n}")])
                        record(f"msprobe/{wl}/process_s", elapsed)
                        record(f"msprobe/{wl}/call_s", float(stdout.strip().splitlines()[-1]))
                        record(f"msprobe/{wl}/peak_MB", peak / 1e6)
                        shutil.rmtree(work / f"out-{n}", ignore_errors=True)
            if "large" in dumps:
                files = [str(f) for d in dumps["large"] for f in d.rglob("*.npy")]
                t0 = time.perf_counter()
                subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
                record("cat/large/s", time.perf_counter() - t0)
        report_targets(runs, dumps, list(versions))
        print("runs:", json.dumps(runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report_targets(runs: dict[str, list], dumps: dict, labels: list[str]) -> None:
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(json.dumps({"medians": med}, indent=1))
    print(f"load average: {os.getloadavg()} now; 1-minute load at each repeat's start: {runs['load_average_1min']}")
    for label in labels:
        start = med[f"{label}/tiny/w2/s"]
        print(f"\n== {label} (start-up {start:.2f} s: target <= 1 s) ==")
        for wl in ("msprobe_small", "rlprobe_small", "large"):
            if wl not in dumps:
                continue
            w1, w2 = med[f"{label}/{wl}/w1/s"], med[f"{label}/{wl}/w2/s"]
            peak = max(runs[f"{label}/{wl}/w2/peak_MB"] + runs[f"{label}/{wl}/w1/peak_MB"])
            beyond = w2 - start
            cpu1, cpu2, cpu0 = (med[f"{label}/{w}/cpu_s"] for w in (f"{wl}/w1", f"{wl}/w2", "tiny/w2"))
            line = (f"{wl}: whole {w2:.2f} s (workers 2), {w1:.2f} s (workers 1); beyond start-up, 2 workers "
                    f"{(w1 - start) / beyond if beyond > 0 else float('nan'):.2f} x faster than 1 (target >= 1.7); "
                    f"peak {peak:.0f} MB; CPU (user + system) {cpu2:.2f} s (workers 2), {cpu1:.2f} s (workers 1), "
                    f"{cpu2 - cpu0:.2f} s beyond start-up's {cpu0:.2f} s")
            if wl == "msprobe_small":
                line += "; target whole <= 2 s"
                if f"msprobe/{wl}/call_s" in runs:
                    best = min(runs[f"msprobe/{wl}/call_s"])
                    line += (f"; msprobe (faster of two) {best:.2f} s: {best / beyond:.1f} x beyond start-up "
                             "(target >= 15)")
            if wl == "rlprobe_small":
                line += "; targets whole <= 6 s, peak <= 500 MB"
            if wl == "large":
                gb = sum(dump_bytes(d) for d in dumps["large"]) / 1e9
                line += f"; {gb / beyond:.2f} GB/s beyond start-up (cat {gb / med['cat/large/s']:.2f} GB/s)"
                if "msprobe/large/call_s" in runs:
                    best = min(runs["msprobe/large/call_s"])
                    line += (f"; throughput {best / beyond:.1f} x msprobe (target >= 10), whole command "
                             f"{min(runs['msprobe/large/process_s']) / w2:.2f} x (target >= 3)")
            print(line)
        if label != labels[0]:
            continue
        for other in labels[1:]:
            print(f"\npaired ratios {other} / {label} (medians of per-repeat ratios):")
            for key in sorted(k for k in runs if k.startswith(f"{label}/") and k.endswith("/s")):
                twin = other + key[len(label):]
                ratios = [o / m for o, m in zip(runs[twin], runs[key])]
                print(f"  {key[len(label) + 1:]}: {statistics.median(ratios):.2f} x")


if __name__ == "__main__":
    main()

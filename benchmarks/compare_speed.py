"""Comparison speed: `rlprobe compare` vs msprobe 8.1.2's SingleComparator, same dumps, same run.

    python benchmarks/compare_speed.py [--repeat 3] [--tmp DIR] [--workloads large,msprobe_small,rlprobe_small]
                                       [--baseline /path/to/other/checkout] [--cache DIR] [--source]

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
its measured value. The dumps are written once into --cache (default: a temp folder; large: ~1.3 GB).
Then (unless --no-core-scaling) benchmarks/core_scaling.py says what two busy processes get done on
this machine against one: a 2-worker ratio cannot exceed it (~2.0 on two whole cores; 1.45-1.92 on the
test VM's two vCPUs, docs/performance.md "Two workers against one, and what bounds it").

rlprobe runs as installed, as msprobe does from its virtual environment: each checkout's package (and
its bundled sql/, pipelines/, examples/) is copied into the work folder and byte-compiled first, as pip
does when it installs a wheel (startup.installed_copy). From a checkout's own sources (`--source`), where
PYTHONDONTWRITEBYTECODE is set (this VM) no .pyc is ever written, so every command compiles each rlprobe
module it imports, and a larger comparison imports more of them than the start-up's one-step pair: a
fixed cost, the same with 1 and 2 workers, that "beyond start-up" would count.

Before the timed repeats each checkout builds its compiled kernels in place (`python hatch_build.py`; a
checkout of before issue 42 builds its numba kernels ahead of time with `python -m rlprobe.numba_build`)
and compares each workload once, untimed; for such a numba checkout each timed run that still changed
numba's cache folder (it compiled a kernel) is counted and named in the output.

The large workload (compare_workloads.large):

Two msprobe-format dumps (as msprobe's SingleSave writes them: float32 .npy + JSON
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_workloads  # noqa: E402  (benchmarks/ is not a package)
import core_scaling  # noqa: E402
from startup import installed_copy  # noqa: E402

HERE = Path(__file__).resolve().parent


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


def numba_cache_dir(checkout: Path) -> str | None:
    """The folder where `checkout`'s rlprobe keeps numba's compiled kernels (named after its kernels'
    sources: other checkouts, other sessions' tests, compile into folders of their own); None for a
    checkout without numba kernels."""
    if not (checkout / "rlprobe" / "numba_cache.py").is_file():
        return None
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rlprobe", "numba")
    if os.environ.get("NUMBA_CACHE_DIR"):
        return base
    digest = subprocess.run([sys.executable, "-c", "from rlprobe.numba_cache import kernel_sources_digest as d; "
                             "print(d())"], env=rlprobe_env(checkout), cwd=checkout, capture_output=True, text=True)
    name = digest.stdout.strip()
    return os.path.join(base, name) if digest.returncode == 0 and name else base


def numba_cache_files(base: str | None) -> dict[str, int]:
    """Every file under `base` with its mtime: a run that changes them compiled a kernel."""
    found: dict[str, int] = {}
    for root, _, files in os.walk(base) if base else ():
        for name in files:
            try:
                found[os.path.join(root, name)] = os.stat(os.path.join(root, name)).st_mtime_ns
            except OSError:
                pass
    return found


def rlprobe_env(checkout: Path) -> dict:
    env = dict(os.environ)
    # the checkout first; a PYTHONPATH already set stays after it (packages carried to a machine as wheels
    # and installed into a folder of their own: benchmarks/gpu_checks.sh)
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--cache", default=None, help="folder for the small workloads' dumps (kept)")
    ap.add_argument("--workloads", default="large,msprobe_small,rlprobe_small")
    ap.add_argument("--baseline", default=None, help="another rlprobe checkout, run alternately for paired ratios")
    ap.add_argument("--source", action="store_true",
                    help="run each checkout's own sources instead of a byte-compiled copy (as installed)")
    ap.add_argument("--json", default=None, help="write each workload's figures (and every run) here")
    ap.add_argument("--record", action="store_true",
                    help="write the figures into benchmarks/RESULTS.md's compare_speed section (benchmarks/results.py)")
    ap.add_argument("--no-core-scaling", action="store_true",
                    help="skip core_scaling.py's measure of what two busy processes do against one here (~30 s)")
    args = ap.parse_args()

    msprobe_py = Path(os.environ.get("MSPROBE_PYTHON", HERE.parent / ".venv-msprobe" / "bin" / "python"))
    work = Path(tempfile.mkdtemp(prefix="bench-compare-", dir=args.tmp))
    cache = Path(args.cache) if args.cache else work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    versions = {"rlprobe": HERE.parent} | ({"baseline": Path(args.baseline)} if args.baseline else {})
    wanted = args.workloads.split(",")
    try:
        for label, checkout in versions.items():  # each checkout's compiled kernels, built before they are copied
            build = (["hatch_build.py"] if (checkout / "hatch_build.py").is_file() else
                     ["-m", "rlprobe.numba_build"] if (checkout / "rlprobe" / "numba_build.py").is_file() else None)
            if build:
                built = subprocess.run([sys.executable, *build], env=rlprobe_env(checkout), cwd=checkout,
                                       capture_output=True, text=True)
                if built.returncode:
                    raise RuntimeError(f"{label}: {' '.join(build)} failed: {built.stderr[-2000:]}")
        if not args.source:
            versions = {label: installed_copy(checkout, work / f"installed-{label}")
                        for label, checkout in versions.items()}
        print("rlprobe runs " + ("from the checkouts' sources" if args.source else "as installed (byte-compiled copies)"))
        dumps: dict[str, tuple[Path, Path]] = {"tiny": compare_workloads.tiny(cache)}
        if "large" in wanted:
            dumps["large"] = compare_workloads.large(cache)
        if "msprobe_small" in wanted:
            dumps["msprobe_small"] = compare_workloads.msprobe_small(cache)
        if "rlprobe_small" in wanted:
            dumps["rlprobe_small"] = compare_workloads.rlprobe_small(cache)
        runs: dict[str, list] = {}

        def record(name: str, value) -> None:
            runs.setdefault(name, []).append(value)

        n = 0
        for label, checkout in versions.items():  # untimed: the page cache (and a numba cache) then hold everything
            for wl, (a, b) in dumps.items():
                n += 1
                run_child([sys.executable, "-m", "rlprobe.cli", "compare", str(a), str(b), "-o", str(work / f"out-{n}"),
                           "--workers", "2", "--quiet"], rlprobe_env(checkout), cwd=checkout)
                shutil.rmtree(work / f"out-{n}", ignore_errors=True)
        compiled: list[str] = []
        cache_dirs = {label: numba_cache_dir(checkout) for label, checkout in versions.items()}
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
                        cache_before = numba_cache_files(cache_dirs[label])
                        elapsed, _, peak, cpu = run_child(cmd, env, cwd=checkout)
                        if numba_cache_files(cache_dirs[label]) != cache_before:
                            compiled.append(f"{label}/{wl}/w{workers} (repeat {i + 1})")
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
        figures = report_targets(runs, dumps, list(versions))
        if args.json:
            Path(args.json).write_text(json.dumps({"figures": figures, "runs": runs}, indent=1), encoding="utf-8")
        if args.record:
            record_results(runs, figures, dumps, list(versions), args)
        if not args.no_core_scaling:  # the ceiling of the 2-worker ratios on this machine (docs/compare.md)
            print("\n== this machine: two busy processes against one (benchmarks/core_scaling.py) ==")
            core_scaling.main(["--repeat", "3"])
        print(f"timed runs that compiled a kernel (changed numba's cache): {', '.join(compiled) or 'none'}")
        print("runs:", json.dumps(runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def paired_ratio(runs: dict[str, list], label: str, other: str, key: str) -> float:
    """The median of per-repeat ratios other / label of the figure `key` (e.g. "rlprobe_small/w2/s")."""
    return statistics.median(o / m for o, m in zip(runs[f"{other}/{key}"], runs[f"{label}/{key}"]))


def record_results(runs: dict[str, list], figures: dict[str, dict], dumps: dict, labels: list[str],
                   args: argparse.Namespace) -> None:
    """This checkout's figures (and, with --baseline, the paired ratios) as RESULTS.md's compare_speed section."""
    import results

    label, others = labels[0], labels[1:]
    med = {k: statistics.median(v) for k, v in runs.items()}
    header = ["workload", "2 workers", "1 worker", "CPU, 2 workers", "peak", "msprobe's call"]
    header += [f"{o} / this, w2 · w1" for o in others]
    rows = []
    start = figures[label]["start_up_s"]
    rows.append(["start-up (one-step compare)", f"{start:.2f} s", "", f"{med[f'{label}/tiny/w2/cpu_s']:.2f} s", "",
                 ""] + [f"{paired_ratio(runs, label, o, 'tiny/w2/s'):.2f}" for o in others])
    for wl in ("large", "msprobe_small", "rlprobe_small"):
        if wl not in dumps:
            continue
        f = figures[label][wl]
        call = runs.get(f"msprobe/{wl}/call_s")
        rows.append([wl, f"{f['whole_w2_s']:.2f} s", f"{f['whole_w1_s']:.2f} s", f"{med[f'{label}/{wl}/w2/cpu_s']:.2f} s",
                     f"{f['peak_MB']:.0f} MB", f"{min(call):.2f} s" if call else ""]
                    + [f"{paired_ratio(runs, label, o, f'{wl}/w2/s'):.2f} · {paired_ratio(runs, label, o, f'{wl}/w1/s'):.2f}"
                       for o in others])
    command = "python benchmarks/compare_speed.py " + " ".join(
        a for a in (f"--repeat {args.repeat}", f"--workloads {args.workloads}", args.baseline and "--baseline BASE",
                    "--record") if a)
    results.record("compare_speed", "Comparison speed (`rlprobe compare`, whole commands, medians)", command, header,
                   rows, notes=(f"Medians of {args.repeat} alternating repeats; msprobe's call: the faster of two "
                                "SingleComparator.compare calls; a paired ratio above 1 means the baseline took longer."))


def report_targets(runs: dict[str, list], dumps: dict, labels: list[str]) -> dict[str, dict]:
    """Prints every target with its value; returns, per checkout label and workload, the figures behind them."""
    med = {k: statistics.median(v) for k, v in runs.items()}
    figures: dict[str, dict] = {}
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
            figures.setdefault(label, {"start_up_s": start})[wl] = {
                "whole_w2_s": w2, "whole_w1_s": w1, "peak_MB": peak,
                "w2_over_w1_beyond_start_up": (w1 - start) / beyond if beyond > 0 else None}
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
    return figures


if __name__ == "__main__":
    main()

"""Per-thread timeline of one `rlprobe compare` (wall and thread CPU per phase): where the time
beyond start-up goes, and how much of it runs on more than one thread.

    python benchmarks/compare_timeline.py A B [--workers 1,2] [--repeat 3] [--cache DIR]
    python benchmarks/compare_timeline.py --workload msprobe_small|rlprobe_small --cache DIR

Each run is a fresh process (as the command: imports, the compiled kernels' load) that calls
rlprobe.pipeline.compare_command.compare(a, b, out, workers=N) with the main functions of the
comparison and its reports wrapped: each call is a span (thread, wall start and end since the
process began, thread CPU from time.thread_time). Every Python thread's CPU is recorded when it
ends (threading.Thread.run wrapped); native threads (DuckDB's, zlib in pyarrow's pools) show in
the process CPU (getrusage) only. Prints, per run, the spans in start order with their thread,
wall and CPU, then per thread its CPU, and the whole process's wall and CPU; then (and with --brief
only that) one line a run: the wall time of the phases before the pairs, the pairs, after them and
the output, with the CPU of the main thread and of the other Python threads in each (a thread's
CPU spread evenly over its life), and what the phase would take on two free cores if no GIL were
shared (its busiest thread's CPU or half of its CPU, the larger): a model that load does not move.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (module, function) wrapped as spans; a function of sql_runner is labelled with its SQL file
SPANS = (
    ("rlprobe.pipeline.compare_command", "compare"),
    ("rlprobe.lake.reader", "open_dump"),
    ("rlprobe.comparison.run", "compare_dumps"),
    ("rlprobe.cli.startup", "import_report_modules"),
    ("rlprobe.comparison.key_data", "compare_key_data"),
    ("rlprobe.comparison.key_data", "load_stats"),
    ("rlprobe.lake.msprobe_format", "key_data_table"),
    ("rlprobe.comparison.sample_alignment", "layout"),
    ("rlprobe.lake.sql_runner", "run"),
    ("rlprobe.lake.sql_runner", "records"),
    ("rlprobe.lake.sql_runner", "execute"),
    ("rlprobe.lake.sql_runner", "create_table"),
    ("rlprobe.lake.sql_runner", "store"),
    ("rlprobe.lake.sql_runner", "to_arrow"),
    ("rlprobe.comparison.key_data", "_pair_tasks"),
    ("rlprobe.comparison.run", "_saved_keys"),
    ("rlprobe.comparison.run", "_cursors"),
    ("rlprobe.comparison.run", "_SingleRunBeside.run_pairs"),
    ("rlprobe.comparison.executor", "run_pairs"),
    ("rlprobe.comparison.pair_results", "PairsAhead.take"),  # a method: Class.name
    ("rlprobe.comparison.pair_results", "pair_results_table"),
    ("rlprobe.comparison.single_run", "single_run_findings"),
    ("rlprobe.comparison.verdict", "explain"),
    ("rlprobe.comparison.params", "add_param_comparison"),
    ("rlprobe.comparison.config_diff", "diff_configs"),
    ("rlprobe.report.comparison_files", "write_tables"),
    ("rlprobe.report.comparison_files", "write_summary_json"),
    ("rlprobe.report.comparison_files", "write_reports"),
    ("rlprobe.report.comparison_files", "write_key_data_parquet"),
    ("rlprobe.report.comparison_files", "key_data_parquet_bytes"),
    ("rlprobe.report.csv_report", "write_key_data_csv"),
    ("rlprobe.report.csv_report", "key_data_csv_bytes"),
    ("rlprobe.report.xlsx", "write_report_xlsx"),
    ("rlprobe.report.markdown", "render_summary_md"),
    ("rlprobe.report.output_folder", "publish_output"),
)


def child(a: str, b: str, out: str, workers: int) -> None:
    """One comparison in this process, its spans printed as JSON on stdout's last line."""
    import threading

    t_zero = time.perf_counter()
    spans: list[dict] = []
    threads: list[dict] = []
    wanted: dict[str, set[str]] = {}
    for module, name in SPANS:
        wanted.setdefault(module, set()).add(name)

    def wrap(module: str, name: str, fn):
        if getattr(fn, "_timeline", False):
            return fn

        def timed(*args, **kwargs):
            label = f"{module.rsplit('.', 1)[-1]}.{name}"
            if module == "rlprobe.lake.sql_runner" and len(args) > 1 and isinstance(args[1], str):
                label = f"sql {args[1]}"
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                c1 = time.thread_time()
                spans.append({"label": label, "thread": threading.current_thread().name, "start": w0 - t_zero,
                              "wall": time.perf_counter() - w0, "cpu": c1 - c0, "cpu0": c0, "cpu1": c1})

        timed._timeline = True  # type: ignore[attr-defined]
        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    wrappers: dict[int, object] = {}  # id of an original function: its wrapper

    def patch(mod) -> None:
        """Wrap the wanted functions of `mod`, and every name in a loaded rlprobe module bound to one."""
        for name in wanted.get(mod.__name__, ()):
            owner, attr = mod, name
            if "." in name:  # a method
                owner, attr = getattr(mod, name.split(".")[0], None), name.split(".")[1]
            fn = getattr(owner, attr, None)
            if fn is not None and not getattr(fn, "_timeline", False):
                wrappers[id(fn)] = wrap(mod.__name__, name, fn)
                setattr(owner, attr, wrappers[id(fn)])
        for other in list(sys.modules.values()):
            if getattr(other, "__name__", "").startswith("rlprobe"):
                for attr, value in list(vars(other).items()):
                    if id(value) in wrappers and value is getattr(wrappers[id(value)], "__wrapped__", None):
                        setattr(other, attr, wrappers[id(value)])

    import importlib.abc
    import importlib.machinery

    class Patching(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname not in wanted:
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            run_module = loader.exec_module

            def exec_module(module, run_module=run_module):
                run_module(module)
                patch(module)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Patching())
    for module in wanted:
        if module in sys.modules:
            patch(sys.modules[module])

    run_thread = threading.Thread.run

    def thread_run(self):
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            run_thread(self)
        finally:
            threads.append({"thread": self.name, "start": w0 - t_zero, "wall": time.perf_counter() - w0,
                            "cpu": time.thread_time() - c0})

    threading.Thread.run = thread_run
    from rlprobe.pipeline.compare_command import compare

    c0 = time.thread_time()
    compare(a, b, out, workers=workers)
    main_cpu = time.thread_time() - c0
    usage = __import__("resource").getrusage(__import__("resource").RUSAGE_SELF)
    print(json.dumps({"spans": spans, "threads": threads, "main_cpu": main_cpu,
                      "wall": time.perf_counter() - t_zero, "cpu": usage.ru_utime + usage.ru_stime}))


def show(result: dict, title: str) -> None:
    print(f"\n== {title}: wall {result['wall']:.3f} s, process CPU {result['cpu']:.3f} s, "
          f"main thread CPU in compare() {result['main_cpu']:.3f} s")
    print(f"{'start':>7} {'wall':>7} {'cpu':>7}  thread               span")
    for s in sorted(result["spans"], key=lambda s: s["start"]):
        if s["wall"] < 0.004 and s["label"].startswith("sql "):
            continue  # tiny queries: left out of the listing (in the totals below)
        print(f"{s['start']:7.3f} {s['wall']:7.3f} {s['cpu']:7.3f}  {s['thread'][:20]:20} {s['label']}")
    print("threads (Python, CPU when they ended):")
    for t in sorted(result["threads"], key=lambda t: t["start"]):
        print(f"{t['start']:7.3f} {t['wall']:7.3f} {t['cpu']:7.3f}  {t['thread']}")


def phases(result: dict) -> dict[str, tuple[float, float, float]]:
    """(wall, main thread CPU, other Python threads' CPU) of the phases beyond opening the dumps:
    before the pairs (statistics, SQL), the pairs, after them (key_data.sql, verdict), the output."""
    first = {}
    for s in result["spans"]:
        if s["thread"] == "MainThread":
            first.setdefault(s["label"], s)
    # with pairs compared ahead (rlprobe.comparison.pair_results), the pairs phase is the main thread's wait for
    # them, and their CPU counts where their thread ran (before the pairs, mostly)
    calls = [first[label] for label in ("executor.run_pairs", "pair_results.PairsAhead.take") if label in first]
    if not calls or not {"run.compare_dumps", "output_folder.publish_output"} <= first.keys():
        return {}  # no tensor pair compared (statistics only): no phases to tell apart
    start, out = first["run.compare_dumps"], first["output_folder.publish_output"]
    pairs = min(calls, key=lambda s: s["start"])
    bounds = [("before pairs", start["start"], start["cpu0"], pairs["start"], pairs["cpu0"]),
              ("pairs", pairs["start"], pairs["cpu0"], pairs["start"] + pairs["wall"], pairs["cpu1"]),
              ("after pairs", pairs["start"] + pairs["wall"], pairs["cpu1"], out["start"], out["cpu0"]),
              ("output", out["start"], out["cpu0"], out["start"] + out["wall"], out["cpu1"])]
    found = {}
    for name, w0, c0, w1, c1 in bounds:
        shares = []
        for t in result["threads"]:  # a thread's CPU, spread evenly over its life, inside the window
            t0, t1 = t["start"], t["start"] + t["wall"]
            overlap = max(0.0, min(w1, t1) - max(w0, t0))
            shares.append(t["cpu"] * overlap / t["wall"] if t["wall"] > 0 else 0.0)
        main_cpu, others = c1 - c0, sum(shares)
        # on two free cores, with no GIL between them: the busiest thread's CPU or half of all of it
        estimate = max(main_cpu, max(shares, default=0.0), (main_cpu + others) / 2)
        found[name] = (w1 - w0, main_cpu, others, estimate)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--workload", choices=("msprobe_small", "rlprobe_small"))
    ap.add_argument("--cache", default=None)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write every run's spans here")
    ap.add_argument("--brief", action="store_true", help="only the phases of each run (wall, main + other CPU)")
    ap.add_argument("--child", nargs=4, metavar=("A", "B", "OUT", "WORKERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        a, b, out, workers = args.child
        child(a, b, out, int(workers))
        return
    if args.workload:
        sys.path.insert(0, str(HERE))
        import compare_workloads

        cache = Path(args.cache or tempfile.mkdtemp(prefix="timeline-"))
        a, b = getattr(compare_workloads, args.workload)(cache)
    else:
        a, b = args.runs
    results = []
    with tempfile.TemporaryDirectory(prefix="timeline-out-") as tmp:
        n = 0
        for i in range(args.repeat):
            for workers in [int(w) for w in args.workers.split(",")]:
                n += 1
                done = subprocess.run([sys.executable, __file__, "--child", str(a), str(b), f"{tmp}/out-{n}",
                                       str(workers)], capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(done.stderr[-3000:])
                result = json.loads(done.stdout.strip().splitlines()[-1])
                result.update(workers=workers, repeat=i, load=os.getloadavg()[0])
                results.append(result)
                if not args.brief:
                    show(result, f"{workers} worker(s), repeat {i + 1}, load {result['load']:.1f}")
                found = phases(result)
                print(f"{workers} worker(s), load {result['load']:4.1f}: " + "; ".join(
                    f"{name} {w:.3f} s wall, {c:.3f} + {o:.3f} s CPU (2 cores: {e:.3f} s)"
                    for name, (w, c, o, e) in found.items())
                    + f"; 2 cores: {sum(e for *_, e in found.values()):.3f} s; process CPU {result['cpu']:.3f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results))


if __name__ == "__main__":
    main()

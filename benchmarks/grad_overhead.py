"""Gradient probe cost on the CPU: rlprobe `monitor_grads` vs msprobe 8.1.2 grad_probe, same run.

    python benchmarks/grad_overhead.py                   # everything (about 5 minutes on 2 cores)
    python benchmarks/grad_overhead.py --no-compare      # step time and sign bytes only (~2.5 minutes)
    python benchmarks/grad_overhead.py --no-steps --compare-steps 100   # the comparison only
    python benchmarks/grad_overhead.py --params          # parameter fingerprints vs plain steps only
                                                         # (whole runs paired, and every other step in one run)

Workload (issue 4, "Speed"): nn.Sequential of 6 Linear(1024, 1024) with ReLU between, AdamW,
batch 256, MSE loss; torch threads = 2 in every process (`--threads`). The model, data and step
are `make_workload` of benchmarks/msprobe_grad_workload.py, which also runs msprobe in its own
virtual environment (.venv-msprobe, benchmarks/setup_msprobe_venv.sh) as a subprocess.

1. Step time. Per repetition, alternating: plain (this process), rlprobe L2 (this process: a
   Probe in a temp dir, `monitor_grads(model, optimizer=opt, level="L2", bounds=[-1, 0, 1])`,
   `probe.step()` after every step, then `close()`), msprobe L2 (subprocess), plain in the
   msprobe venv (subprocess; checks that both interpreters train equally fast). `--warmup`
   steps (monitored too), then `--steps` timed steps; the per-step median of each run, then the
   median over repetitions; also each repetition's rlprobe run against the plain run just before
   it (the median of those ratios is steadier on a shared machine). "until close" = (timed steps + close()) / steps.
2. Sign bytes of those runs: rlprobe's signs.npy files vs msprobe's per-parameter bool .npy
   files, for the same steps.
3. Comparison. Two monitored runs of `--compare-steps` steps each, B with lr x 1.1 (same seed,
   so step 0 agrees fully and the similarities then drift), dumped by both tools; then, whole
   processes, alternating: `rlprobe compare A B -o OUT --plots --quiet` on rlprobe's dumps vs
   msprobe's `GradComparator.compare_distributed` on msprobe's dumps (plus, for reference,
   `rlprobe compare` on msprobe's dumps); also the call alone in a process with every module
   imported (as msprobe's `call_s`). `--compare-blocks N,WIDTH,HIDDEN,BATCH` monitors the
   block model of msprobe_grad_workload.make_workload for this part instead (4,2048,8192,16:
   4 of the GPU workload's 16 blocks, 134M parameters), `--compare-layers N,HIDDEN,BATCH` its
   transformer-shaped model (24,256,64: 290 parameter tensors like an LLM's, 19M parameters);
   `--compare-every-param` makes rlprobe draw a PNG per parameter too, as msprobe always does;
   `--no-steps` skips part 1.

Before each timed run it waits (up to --idle-timeout s) until the CPU was >= --min-idle idle for
1 s: other processes on the 2 cores otherwise distort every figure. Prints a table and writes
the raw figures as JSON (`--json`).
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

import torch

import rlprobe

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from msprobe_grad_workload import make_workload  # noqa: E402  (the same workload in both venvs)

MSPROBE_PY = ROOT / ".venv-msprobe" / "bin" / "python"
WORKLOAD = HERE / "msprobe_grad_workload.py"
BOUNDS = [-1.0, 0.0, 1.0]


def run_plain(steps: int, warmup: int, seed: int = 0, lr: float = 1e-3) -> dict:
    _model, _opt, step = make_workload(seed, lr, torch)
    for i in range(warmup):
        step(i)
    times = []
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        s0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - s0)
    return {"step_s": times, "total_s": time.perf_counter() - t0}


def run_rlprobe(dump: Path, level: str, steps: int, warmup: int, seed: int = 0, lr: float = 1e-3,
                blocks: tuple[int, ...] | None = None, layers: tuple[int, ...] | None = None) -> dict:
    model, opt, step = make_workload(seed, lr, torch, blocks, layers)
    probe = rlprobe.Probe(dump)
    probe.monitor_grads(model, optimizer=opt, name="mlp", level=level, bounds=BOUNDS)
    for i in range(warmup):
        step(i)
        probe.step()
    times = []
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        s0 = time.perf_counter()
        step(i)
        probe.step()
        times.append(time.perf_counter() - s0)
    c0 = time.perf_counter()
    probe.close()
    t1 = time.perf_counter()
    signs = sorted(dump.rglob("signs.npy"))
    return {"step_s": times, "total_s": t1 - t0, "close_s": t1 - c0,
            "sign_bytes": sum(f.stat().st_size for f in signs), "sign_files": len(signs),
            "bytes_on_disk": sum(f.stat().st_size for f in dump.rglob("*") if f.is_file())}


def run_params(dump: Path, steps: int, warmup: int, seed: int = 0, lr: float = 1e-3) -> dict:
    """The workload with parameter fingerprints only (`monitor_params`, no gradient monitor)."""
    model, opt, step = make_workload(seed, lr, torch)
    probe = rlprobe.Probe(dump)
    probe.monitor_params(model, optimizer=opt, name="mlp")
    for i in range(warmup):
        step(i)
        probe.step()
    times = []
    for i in range(warmup, warmup + steps):
        s0 = time.perf_counter()
        step(i)
        probe.step()
        times.append(time.perf_counter() - s0)
    probe.close()
    return {"step_s": times}


def run_params_interleaved(dump: Path, steps: int, warmup: int, seed: int = 0, lr: float = 1e-3) -> list[float]:
    """One process whose monitor fingerprints every other optimizer step (`steps=` the even ones):
    each fingerprinted step against the mean of the plain steps either side of it. A shared
    machine's load drifts over seconds, not within three steps, so these ratios are paired far
    more tightly than whole runs."""
    model, opt, step = make_workload(seed, lr, torch)
    probe = rlprobe.Probe(dump)
    probe.monitor_params(model, optimizer=opt, name="mlp", steps=list(range(0, warmup + steps + 2, 2)))
    times = []
    for i in range(warmup + steps):
        s0 = time.perf_counter()
        step(i)
        probe.step()
        times.append(time.perf_counter() - s0)
    probe.close()
    return [times[i] / ((times[i - 1] + times[i + 1]) / 2) for i in range(warmup + warmup % 2, len(times) - 1, 2)]


def param_overhead(args: argparse.Namespace) -> int:
    """--params: plain vs fingerprints, alternating, `--repeat` pairs; the per-step median of each
    run, the median over repetitions and the median of the paired ratios; then per repetition a
    run fingerprinting every other step (run_params_interleaved) and the median of all its ratios."""
    plain, params, ratios, interleaved, log = [], [], [], [], []
    for r in range(args.repeat):
        wait_idle(args.min_idle, args.idle_timeout, log)
        p = med(run_plain(args.steps, args.warmup)["step_s"])
        with tempfile.TemporaryDirectory() as d:
            f = med(run_params(Path(d) / "dump", args.steps, args.warmup)["step_s"])
        with tempfile.TemporaryDirectory() as d:
            pairs = run_params_interleaved(Path(d) / "dump", args.steps, args.warmup)
        interleaved += pairs
        plain.append(p)
        params.append(f)
        ratios.append(f / p)
        print(f"rep {r}: plain {p * 1e3:.1f} ms, fingerprints {f * 1e3:.1f} ms, ratio {f / p:.4f}; "
              f"interleaved {med(pairs):.4f} ({len(pairs)} steps)", flush=True)
    result = {"plain_ms": med(plain) * 1e3, "fingerprints_ms": med(params) * 1e3, "paired_ratio": med(ratios),
              "ratio_min": min(ratios), "ratio_max": max(ratios), "interleaved_ratio": med(interleaved),
              "interleaved_steps": len(interleaved), "idle": log}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def run_msprobe(args: list[str]) -> dict:
    proc = subprocess.run([str(MSPROBE_PY), str(WORKLOAD), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"msprobe workload failed ({proc.returncode}):\n{proc.stderr[-3000:]}{proc.stdout[-2000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])


def timed(cmd: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}{proc.stdout[-2000:]}")
    return dt


# `rlprobe compare A B -o OUT --plots --quiet` in a process whose modules are already imported, so
# that the call compares with msprobe's `call_s` (GradComparator imported before the clock starts)
CALL_SNIPPET = """
import json, sys, time
import duckdb, matplotlib.figure, matplotlib.backends.backend_agg, matplotlib.ticker, numpy, openpyxl
import pyarrow.parquet, rich.console
import rlprobe.comparison.run, rlprobe.report.plots, rlprobe.report.plots, rlprobe.report.xlsx
from rlprobe.pipeline.compare_command import run_compare
t0 = time.perf_counter()
rc = run_compare(sys.argv[1], sys.argv[2], sys.argv[3], fail_on_diff=False, quiet=True, plots=True,
                 plot_every_param=sys.argv[4] == "every")
print(json.dumps({"call_s": time.perf_counter() - t0, "rc": rc}))
"""


def rlprobe_call(a: Path, b: Path, out: Path, env: dict, every_param: bool) -> float:
    proc = subprocess.run([sys.executable, "-c", CALL_SNIPPET, str(a), str(b), str(out),
                           "every" if every_param else "worst"], capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"rlprobe compare call failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])["call_s"]


def cpu_idle_share(interval: float = 1.0) -> float:
    """Share of CPU time idle over `interval` seconds, from /proc/stat (1.0 where unavailable)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    try:
        i0, t0 = sample()
        time.sleep(interval)
        i1, t1 = sample()
    except OSError:
        return 1.0
    return (i1 - i0) / max(t1 - t0, 1)


def wait_idle(min_idle: float, timeout: float, log: list) -> None:
    """Wait until the machine is quiet (other processes sharing the cores distort every figure)."""
    if min_idle <= 0:
        return
    t0 = time.perf_counter()
    while True:
        share = cpu_idle_share()
        if share >= min_idle or time.perf_counter() - t0 > timeout:
            log.append({"idle": round(share, 3), "waited_s": round(time.perf_counter() - t0, 1)})
            return


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)  # this VM is noisy: single repetitions spread +-20%
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--level", default="L2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compare-steps", type=int, default=10)
    ap.add_argument("--compare-repeat", type=int, default=3)
    ap.add_argument("--no-compare", action="store_true")
    ap.add_argument("--no-steps", action="store_true", help="skip the step-time part (only the comparison)")
    ap.add_argument("--compare-blocks", default=None,
                    help="N,WIDTH,HIDDEN,BATCH: monitor this block model for the comparison instead "
                         "(e.g. 4,2048,8192,16: 4 of the GPU workload's 16 blocks, 134M parameters)")
    ap.add_argument("--compare-layers", default=None,
                    help="N,HIDDEN,BATCH: monitor the transformer-shaped model for the comparison instead "
                         "(e.g. 24,256,64: 24 decoder-shaped layers, 290 parameter tensors, 19M parameters)")
    ap.add_argument("--compare-every-param", action="store_true",
                    help="rlprobe draws a PNG per parameter too (--plot-every-param), as msprobe always does")
    ap.add_argument("--json", default=None, help="write the raw figures here")
    ap.add_argument("--params", action="store_true",
                    help="only the cost of parameter fingerprints (monitor_params) against plain steps")
    ap.add_argument("--min-idle", type=float, default=0.9,
                    help="before each timed run wait until this share of the CPU was idle for 1 s (0: never wait)")
    ap.add_argument("--idle-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    if args.params:
        torch.set_num_threads(args.threads)
        return param_overhead(args)
    if not MSPROBE_PY.exists():
        sys.exit(f"{MSPROBE_PY} missing: run benchmarks/setup_msprobe_venv.sh first")
    torch.set_num_threads(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
              "--level", args.level]
    res: dict = {"plain": [], "rlprobe": [], "msprobe": [], "plain_msprobe_venv": [], "config": vars(args),
                 "idle_waits": []}

    def quiet() -> None:
        wait_idle(args.min_idle, args.idle_timeout, res["idle_waits"])

    tmp = Path(tempfile.mkdtemp(prefix="grad_overhead_"))
    try:
        run_plain(2, 1)  # first-touch / allocator warm-up of this process
        for r in range(0 if args.no_steps else args.repeat):
            quiet()
            res["plain"].append(run_plain(args.steps, args.warmup))
            d = tmp / f"rl{r}"
            quiet()
            res["rlprobe"].append(run_rlprobe(d, args.level, args.steps, args.warmup))
            shutil.rmtree(d)
            d = tmp / f"ms{r}"
            quiet()
            res["msprobe"].append(run_msprobe(["--mode", "msprobe", "--dump", str(d), *common]))
            shutil.rmtree(d)
            quiet()
            res["plain_msprobe_venv"].append(run_msprobe(["--mode", "plain", *common]))
            print(f"rep {r}: plain {med(res['plain'][-1]['step_s']) * 1e3:.0f} ms, "
                  f"rlprobe {med(res['rlprobe'][-1]['step_s']) * 1e3:.0f} ms, "
                  f"msprobe {med(res['msprobe'][-1]['step_s']) * 1e3:.0f} ms, "
                  f"plain (msprobe venv) {med(res['plain_msprobe_venv'][-1]['step_s']) * 1e3:.0f} ms", flush=True)

        def step_med(kind: str) -> float:
            return med([med(x["step_s"]) for x in res[kind]])

        def total_med(kind: str) -> float:
            return med([x["total_s"] for x in res[kind]]) / args.steps

        summary: dict = {}
        if res["plain"]:
            plain, rl, ms, plain_ms = (step_med(k) for k in ("plain", "rlprobe", "msprobe", "plain_msprobe_venv"))
            # each repetition's rlprobe run against the plain run just before it: neighbours share the
            # machine's state, so the median of these ratios is steadier than a ratio of medians
            paired = [med(r["step_s"]) / med(p["step_s"]) for p, r in zip(res["plain"], res["rlprobe"])]
            rl_close, plain_total = total_med("rlprobe"), total_med("plain")
            rl_signs, ms_signs = res["rlprobe"][0]["sign_bytes"], res["msprobe"][0]["sign_bytes"]
            rl_files, ms_files = res["rlprobe"][0]["sign_files"], res["msprobe"][0]["sign_files"]
            summary.update({
                "plain_step_ms": plain * 1e3, "rlprobe_step_ms": rl * 1e3, "msprobe_step_ms": ms * 1e3,
                "plain_msprobe_venv_step_ms": plain_ms * 1e3,
                "rlprobe_added_pct": 100 * (rl / plain - 1), "msprobe_added_pct": 100 * (ms / plain - 1),
                "rlprobe_added_pct_paired": 100 * (med(paired) - 1),
                "rlprobe_added_pct_per_repetition": [round(100 * (x - 1), 1) for x in paired],
                "msprobe_added_pct_vs_own_venv_plain": 100 * (ms / plain_ms - 1),
                "rlprobe_until_close_per_step_ms": rl_close * 1e3, "plain_total_per_step_ms": plain_total * 1e3,
                "rlprobe_added_pct_until_close": 100 * (rl_close / plain_total - 1),
                "rlprobe_close_ms": med([x["close_s"] for x in res["rlprobe"]]) * 1e3,
                "steps_monitored": args.warmup + args.steps,
                "rlprobe_sign_bytes": rl_signs, "rlprobe_sign_files": rl_files,
                "msprobe_sign_bytes": ms_signs, "msprobe_sign_files": ms_files,
                "sign_bytes_ratio": rl_signs / ms_signs,
                "rlprobe_dump_bytes": res["rlprobe"][0]["bytes_on_disk"],
                "msprobe_dump_bytes": res["msprobe"][0]["bytes_on_disk"],
            })

        if not args.no_compare:
            n = str(args.compare_steps)
            blocks = tuple(int(v) for v in args.compare_blocks.split(",")) if args.compare_blocks else None
            layers = tuple(int(v) for v in args.compare_layers.split(",")) if args.compare_layers else None
            dumps = {}
            for run, lr in (("A", 1e-3), ("B", 1.1e-3)):
                dumps[f"rl{run}"] = tmp / f"cmp_rl{run}"
                run_rlprobe(dumps[f"rl{run}"], args.level, args.compare_steps, 0, lr=lr, blocks=blocks, layers=layers)
                dumps[f"ms{run}"] = tmp / f"cmp_ms{run}"
                run_msprobe(["--mode", "msprobe", "--dump", str(dumps[f"ms{run}"]), "--steps", n, "--warmup", "0",
                             "--lr", str(lr), "--threads", str(args.threads), "--level", args.level,
                             *(["--blocks", args.compare_blocks] if blocks else []),
                             *(["--layers", args.compare_layers] if layers else [])])
            rl_cli = [sys.executable, "-m", "rlprobe.cli"] if shutil.which("rlprobe") is None else ["rlprobe"]
            plot_args = ["--plots", "--quiet", *(["--plot-every-param"] if args.compare_every_param else [])]
            cmp = {"rlprobe": [], "rlprobe_call": [], "msprobe": [], "msprobe_call": [], "rlprobe_on_msprobe_dumps": []}
            # one untimed run each: page cache and first-touch allocations
            timed([*rl_cli, "compare", str(dumps["rlA"]), str(dumps["rlB"]), "-o", str(tmp / "warm_rl"), *plot_args], env)
            run_msprobe(["--mode", "compare", str(dumps["msA"]), str(dumps["msB"]), str(tmp / "warm_ms")])
            for r in range(args.compare_repeat):
                out = tmp / f"out_rl{r}"
                quiet()
                cmp["rlprobe"].append(timed([*rl_cli, "compare", str(dumps["rlA"]), str(dumps["rlB"]), "-o", str(out),
                                             *plot_args], env))
                if r == 0:
                    shutil.copytree(out, tmp / "kept_rl_out")
                shutil.rmtree(out)
                quiet()
                cmp["rlprobe_call"].append(rlprobe_call(dumps["rlA"], dumps["rlB"], out, env, args.compare_every_param))
                shutil.rmtree(out)
                out = tmp / f"out_ms{r}"
                quiet()
                t0 = time.perf_counter()
                call = run_msprobe(["--mode", "compare", str(dumps["msA"]), str(dumps["msB"]), str(out)])
                cmp["msprobe"].append(time.perf_counter() - t0)
                cmp["msprobe_call"].append(call["call_s"])
                if r == 0:
                    shutil.copytree(out, tmp / "kept_ms_out")
                shutil.rmtree(out)
                out = tmp / f"out_rlms{r}"
                quiet()
                cmp["rlprobe_on_msprobe_dumps"].append(timed([*rl_cli, "compare", str(dumps["msA"]), str(dumps["msB"]),
                                                              "-o", str(out), *plot_args], env))
                shutil.rmtree(out)
                print(f"compare rep {r}: rlprobe {cmp['rlprobe'][-1]:.2f} s (call {cmp['rlprobe_call'][-1]:.2f} s), "
                      f"msprobe {cmp['msprobe'][-1]:.2f} s "
                      f"(call {cmp['msprobe_call'][-1]:.2f} s), rlprobe on msprobe dumps "
                      f"{cmp['rlprobe_on_msprobe_dumps'][-1]:.2f} s", flush=True)
            res["compare"] = cmp
            # the similarities must agree between the tools (same runs, same bits)
            rl_csv = sorted((tmp / "kept_rl_out").rglob("similarities.csv"))
            ms_csv = sorted((tmp / "kept_ms_out").rglob("similarities.csv"))
            summary.update({
                "compare_rlprobe_s": med(cmp["rlprobe"]), "compare_msprobe_s": med(cmp["msprobe"]),
                "compare_msprobe_call_s": med(cmp["msprobe_call"]),
                "compare_rlprobe_call_s": med(cmp["rlprobe_call"]),
                "compare_call_speedup": med(cmp["msprobe_call"]) / med(cmp["rlprobe_call"]),
                "compare_rlprobe_on_msprobe_dumps_s": med(cmp["rlprobe_on_msprobe_dumps"]),
                "compare_speedup": med(cmp["msprobe"]) / med(cmp["rlprobe"]),
                "compare_speedup_vs_call": med(cmp["msprobe_call"]) / med(cmp["rlprobe"]),
                "compare_rlprobe_pngs": len(list((tmp / "kept_rl_out").rglob("*.png"))),
                "compare_msprobe_pngs": len(list((tmp / "kept_ms_out").rglob("*.png"))),
                "similarities_csv_equal": bool(rl_csv and ms_csv and rl_csv[0].read_bytes() == ms_csv[0].read_bytes()),
                "rlprobe_similarities_csv": rl_csv[0].read_text(encoding="utf-8-sig")[:2000] if rl_csv else None,
            })
        res["summary"] = summary
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    s = res["summary"]
    if "plain_step_ms" in s:
        print(f"\nCPU, {args.threads} threads, 6x Linear(1024,1024) + AdamW, batch 256, {args.level}, "
              f"medians of {args.repeat} alternating repetitions of {args.steps} steps:")
        print(f"  plain                 {s['plain_step_ms']:8.1f} ms/step  (msprobe venv: {s['plain_msprobe_venv_step_ms']:.1f})")
        print(f"  rlprobe               {s['rlprobe_step_ms']:8.1f} ms/step  +{s['rlprobe_added_pct']:.1f}%  (goal <= 15%)")
        print(f"  rlprobe vs the plain run before it, median of repetitions: {s['rlprobe_added_pct_paired']:+.1f}% "
              f"(each: {', '.join(f'{x:+.1f}%' for x in s['rlprobe_added_pct_per_repetition'])})")
        print(f"  rlprobe until close() {s['rlprobe_until_close_per_step_ms']:8.1f} ms/step  "
              f"+{s['rlprobe_added_pct_until_close']:.1f}%  (close {s['rlprobe_close_ms']:.0f} ms)")
        print(f"  msprobe 8.1.2         {s['msprobe_step_ms']:8.1f} ms/step  +{s['msprobe_added_pct']:.1f}%  "
              f"(+{s['msprobe_added_pct_vs_own_venv_plain']:.1f}% vs its venv's plain)")
        print(f"  sign bytes, {s['steps_monitored']} steps: rlprobe {s['rlprobe_sign_bytes']:,} in {s['rlprobe_sign_files']} "
              f"files, msprobe {s['msprobe_sign_bytes']:,} in {s['msprobe_sign_files']} files, "
              f"ratio {s['sign_bytes_ratio']:.4f} (goal <= 1/8 + headers)")
    if "compare_speedup" in s:
        model = (f"model {args.compare_layers} (layers)" if args.compare_layers else
                 f"model {args.compare_blocks} (blocks)" if args.compare_blocks else "the default model")
        print(f"  compare ({args.compare_steps} steps, {model}): whole processes rlprobe {s['compare_rlprobe_s']:.2f} s, "
              f"msprobe {s['compare_msprobe_s']:.2f} s -> {s['compare_speedup']:.1f}x (goal >= 10x); calls after "
              f"imports rlprobe {s['compare_rlprobe_call_s']:.2f} s, msprobe {s['compare_msprobe_call_s']:.2f} s -> "
              f"{s['compare_call_speedup']:.1f}x; PNGs rlprobe {s['compare_rlprobe_pngs']}, msprobe "
              f"{s['compare_msprobe_pngs']}; rlprobe on msprobe dumps "
              f"{s['compare_rlprobe_on_msprobe_dumps_s']:.2f} s; similarities.csv identical: "
              f"{s['similarities_csv_equal']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

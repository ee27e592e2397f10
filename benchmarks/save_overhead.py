"""How long `save` blocks the training thread: rlprobe vs msprobe 8.1.2, same tensors, same run.

    python benchmarks/save_overhead.py                  # CPU workload, msprobe from .venv-msprobe
    python benchmarks/save_overhead.py --device cuda    # GPU workload (96 x 64x4096 float32)

CPU workload (issue 2): 8 keys of 64x4096 (even keys float32, odd keys int64 token ids in
[0, 50000)), 4 micro steps, 8 steps, one save call per key (256 calls) — the same data and
calls as benchmarks/msprobe_save_workload.py, which runs in msprobe's own virtual environment
(benchmarks/setup_msprobe_venv.sh). Blocking time is the sum of the time spent inside save();
total time runs until close() returns, when everything is on disk. Each tool runs --repeat
times, alternating, and medians are compared.

GPU workload: 16 save calls of 6 float32 64x4096 keys each from the GPU (msprobe 8.1.2 blocked
121 ms on an H200 for this; the goal is 12 ms).

Cold workload (`--cold`, issue 17): the first saves of a fresh probe in a fresh process, each
repetition a new process per tool, alternating which goes first: 8 save calls of six float32
[64, 4096] tensors, an int64 [64, 4096] and an int64 [64, 512] (values up to 150,000), step()
after every fourth, timed from the first save to the last one's return (msprobe_save_workload
.make_cold_calls and time_cold, shared by both tools). The construction (Probe(), SingleSave())
is timed apart. Goal: rlprobe blocks at most 0.3 x msprobe (medians).
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
sys.path.insert(0, str(HERE))
from msprobe_save_workload import make_cold_calls, time_cold  # noqa: E402  (shared with msprobe's run)

N_KEYS, SHAPE, MICRO_STEPS, STEPS, INT_HIGH = 8, (64, 4096), 4, 8, 50000


def make_data(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)  # identical to msprobe_save_workload.make_data
    return {f"key{k}": torch.randn(*SHAPE) if k % 2 == 0 else torch.randint(0, INT_HIGH, SHAPE) for k in range(N_KEYS)}


def bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def tensor_bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.npy"))


def run_rlprobe_cpu(dump: Path, seed: int) -> dict:
    data = make_data(seed)
    blocking = 0.0
    t0 = time.perf_counter()
    probe = rlprobe.Probe(dump)
    for _ in range(STEPS):
        for _ in range(MICRO_STEPS):
            for key, tensor in data.items():
                c0 = time.perf_counter()
                probe.save({key: tensor})
                blocking += time.perf_counter() - c0
        c0 = time.perf_counter()
        probe.step()
        blocking += time.perf_counter() - c0
    probe.close()
    total = time.perf_counter() - t0
    return {"tool": "rlprobe", "save_blocking_s": blocking, "total_s": total,
            "bytes_on_disk": bytes_under(dump), "tensor_bytes": tensor_bytes_under(dump)}


def run_msprobe_cpu(dump: Path, seed: int, python: Path) -> dict:
    out = subprocess.run([str(python), str(HERE / "msprobe_save_workload.py"), "--dump", str(dump), "--seed", str(seed)],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["tensor_bytes"] = tensor_bytes_under(dump)
    return result


def cpu(args: argparse.Namespace) -> None:
    python = Path(os.environ.get("MSPROBE_PYTHON", HERE.parent / ".venv-msprobe" / "bin" / "python"))
    have_msprobe = python.exists()
    if not have_msprobe:
        print(f"msprobe venv not found at {python}: run benchmarks/setup_msprobe_venv.sh (rlprobe alone is measured)")
    results: dict[str, list[dict]] = {"rlprobe": [], "msprobe": []}
    for i in range(args.repeat):
        for tool in ("msprobe", "rlprobe") if i % 2 == 0 else ("rlprobe", "msprobe"):
            if tool == "msprobe" and not have_msprobe:
                continue
            work = Path(tempfile.mkdtemp(prefix=f"bench-{tool}-", dir=args.tmp))
            try:
                subprocess.run(["sync"], check=False)
                r = run_rlprobe_cpu(work / "dump", args.seed) if tool == "rlprobe" else run_msprobe_cpu(work / "dump", args.seed, python)
                results[tool].append(r)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    report = {}
    for tool, runs in results.items():
        if runs:
            report[tool] = {k: statistics.median(r[k] for r in runs) for k in ("save_blocking_s", "total_s", "bytes_on_disk", "tensor_bytes")}
    print(json.dumps(report, indent=2))
    for tool, runs in results.items():
        if runs:
            print(f"{tool} save blocking per repetition (ms): " + ", ".join(f"{r['save_blocking_s'] * 1e3:.0f}" for r in runs))
    if "msprobe" in report:
        r, m = report["rlprobe"], report["msprobe"]
        print(f"save blocking: rlprobe {r['save_blocking_s'] * 1e3:.1f} ms, msprobe {m['save_blocking_s'] * 1e3:.1f} ms, "
              f"ratio {r['save_blocking_s'] / m['save_blocking_s']:.3f} (goal <= 0.3)")
        print(f"until on disk (close): rlprobe {r['total_s'] * 1e3:.1f} ms, msprobe {m['total_s'] * 1e3:.1f} ms, "
              f"ratio {r['total_s'] / m['total_s']:.3f}")
        print(f"tensor bytes: rlprobe {r['tensor_bytes'] / 2**20:.1f} MiB, msprobe {m['tensor_bytes'] / 2**20:.1f} MiB, "
              f"ratio {r['tensor_bytes'] / m['tensor_bytes']:.3f} (goal <= 1, lossless)")


def cold_child(args: argparse.Namespace) -> None:
    """One cold rlprobe run (in a fresh process): one JSON line."""
    calls = make_cold_calls(args.seed)
    t0 = time.perf_counter()
    probe = rlprobe.Probe(Path(args.dump))
    init = time.perf_counter() - t0
    blocking = time_cold(calls, probe.save, probe.step)
    t0 = time.perf_counter()
    probe.close()
    print(json.dumps({"tool": "rlprobe", "init_s": init, "save_blocking_s": blocking,
                      "close_s": time.perf_counter() - t0, "bytes_on_disk": bytes_under(Path(args.dump))}))


def cold(args: argparse.Namespace) -> None:
    python = Path(os.environ.get("MSPROBE_PYTHON", HERE.parent / ".venv-msprobe" / "bin" / "python"))
    if not python.exists():
        sys.exit(f"msprobe venv not found at {python}: run benchmarks/setup_msprobe_venv.sh")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    commands = {"rlprobe": [sys.executable, str(Path(__file__).resolve()), "--cold-child"],
                "msprobe": [str(python), str(HERE / "msprobe_save_workload.py"), "--cold"]}
    results: dict[str, list[dict]] = {"rlprobe": [], "msprobe": []}
    for i in range(args.repeat):
        for tool in ("msprobe", "rlprobe") if i % 2 == 0 else ("rlprobe", "msprobe"):
            work = Path(tempfile.mkdtemp(prefix=f"bench-cold-{tool}-", dir=args.tmp))
            try:
                out = subprocess.run([*commands[tool], "--dump", str(work / "dump"), "--seed", str(args.seed)],
                                     capture_output=True, text=True, check=True, env=env)
                results[tool].append(json.loads(out.stdout.strip().splitlines()[-1]))
            finally:
                shutil.rmtree(work, ignore_errors=True)
    report = {tool: {k: statistics.median(r[k] for r in runs) for k in ("init_s", "save_blocking_s")}
              for tool, runs in results.items()}
    r, m = report["rlprobe"], report["msprobe"]
    report["ratio"] = r["save_blocking_s"] / m["save_blocking_s"]
    report["runs"] = results
    for tool, runs in results.items():
        print(f"{tool} cold blocking per repetition (ms): " + ", ".join(f"{x['save_blocking_s'] * 1e3:.0f}" for x in runs))
    print(f"cold saves blocked: rlprobe {r['save_blocking_s'] * 1e3:.1f} ms, msprobe {m['save_blocking_s'] * 1e3:.1f} ms "
          f"(medians of {args.repeat}), ratio {report['ratio']:.3f} (goal <= 0.3)")
    print(f"construction: rlprobe Probe() {r['init_s'] * 1e3:.0f} ms, msprobe SingleSave() {m['init_s'] * 1e3:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(report))


def gpu(args: argparse.Namespace) -> None:
    if not torch.cuda.is_available():
        sys.exit("--device cuda needs a GPU")
    torch.manual_seed(args.seed)
    keys = ["prompts_f", "responses_f", "log_prob", "old_log_prob", "ref_log_prob", "advantages"]
    calls = [{k: torch.randn(*SHAPE, device="cuda") for k in keys} for _ in range(16)]
    results = []
    for stats_only in (False, True):
        blocking_runs, total_runs = [], []
        for rep in range(args.repeat + 1):  # the first run warms up kernels and the pinned-memory cache
            work = Path(tempfile.mkdtemp(prefix="bench-gpu-", dir=args.tmp))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            probe = rlprobe.Probe(work / "dump", stats_only=stats_only)
            blocking = 0.0
            for i, batch in enumerate(calls):
                c0 = time.perf_counter()
                probe.save(batch)
                blocking += time.perf_counter() - c0
                if i % 4 == 3:
                    c0 = time.perf_counter()
                    probe.step()
                    blocking += time.perf_counter() - c0
            probe.close()
            total = time.perf_counter() - t0
            d = rlprobe.open(work / "dump")
            rows = d.arrow("key_data")
            assert rows.num_rows == 96, rows.num_rows
            if not stats_only:
                ref = calls[5]["log_prob"].cpu().numpy()
                got = d.tensor("log_prob", 1, 0, 1)
                assert (got == ref).all()
            shutil.rmtree(work, ignore_errors=True)
            if rep:
                blocking_runs.append(blocking)
                total_runs.append(total)
        label = "stats only" if stats_only else "stats + tensors"
        b = statistics.median(blocking_runs)
        results.append({"device": torch.cuda.get_device_name(), "mode": label, "save_blocking_ms": b * 1e3,
                        "until_closed_ms": statistics.median(total_runs) * 1e3, "ratio_to_msprobe_121ms": b / 0.121})
        print(json.dumps(results[-1]))
    if args.json:
        Path(args.json).write_text(json.dumps(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", default=None, help="folder for the temporary dumps (default: system temp)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--cold", action="store_true", help="the cold workload (CPU, a fresh process per run)")
    ap.add_argument("--cold-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dump", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cold_child:
        cold_child(args)
    elif args.cold:
        cold(args)
    else:
        cpu(args) if args.device == "cpu" else gpu(args)


if __name__ == "__main__":
    main()

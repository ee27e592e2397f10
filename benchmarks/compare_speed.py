"""Comparison speed: `rlprobe compare` vs msprobe 8.1.2's SingleComparator, same dumps, same run.

    python benchmarks/compare_speed.py [--repeat 3] [--tmp DIR]

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
                d = root / "data" / key / f"step{step}" / "rank0" / f"micro_step{micro}"
                d.mkdir(parents=True, exist_ok=True)
                np.save(d / f"{key}.npy", value)
                stats = {"max": float(value.max()), "min": float(value.min()), "mean": float(value.mean()),
                         "norm": float(np.linalg.norm(value)), "shape": list(value.shape)}
                (d / f"{key}.json").write_text(json.dumps({"data": stats}, indent=4))


def dump_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*.npy"))


def timed(cmd: list[str], **kw) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    elapsed = time.perf_counter() - t0
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{cmd[:3]} failed ({out.returncode}): {out.stderr[-2000:]}")
    return elapsed, out.stdout


MSPROBE_SNIPPET = """
import sys, time
from msprobe.core import SingleComparator
t0 = time.perf_counter()
SingleComparator.compare(sys.argv[1], sys.argv[2], sys.argv[3], num_processes=2)
print(time.perf_counter() - t0)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default=None)
    args = ap.parse_args()
    msprobe_py = Path(os.environ.get("MSPROBE_PYTHON", HERE.parent / ".venv-msprobe" / "bin" / "python"))
    rlprobe_cmd = [sys.executable, "-m", "rlprobe.cli"] if not shutil.which("rlprobe") else [shutil.which("rlprobe")]
    work = Path(tempfile.mkdtemp(prefix="bench-compare-", dir=args.tmp))
    try:
        a, b = work / "a", work / "b"
        write_msprobe_dump(a, 0, None)
        write_msprobe_dump(b, 0, 4)
        tiny_a, tiny_b = work / "tiny_a", work / "tiny_b"
        for root in (tiny_a, tiny_b):
            d = root / "data" / "x" / "step0" / "rank0" / "micro_step0"
            d.mkdir(parents=True)
            np.save(d / "x.npy", np.ones(4, np.float32))
        size = dump_bytes(a) + dump_bytes(b)
        files = [str(f) for f in list(a.rglob("*.npy")) + list(b.rglob("*.npy"))]
        results: dict[str, list[float]] = {"msprobe_call": [], "msprobe_process": [], "rlprobe": [], "startup": [], "cat": []}
        for i in range(args.repeat):
            order = ("msprobe", "rlprobe") if i % 2 == 0 else ("rlprobe", "msprobe")
            for tool in order:
                out = work / f"out-{tool}-{i}"
                if tool == "msprobe" and msprobe_py.exists():
                    elapsed, stdout = timed([str(msprobe_py), "-c", MSPROBE_SNIPPET, str(a), str(b), str(out)])
                    results["msprobe_process"].append(elapsed)
                    results["msprobe_call"].append(float(stdout.strip().splitlines()[-1]))
                elif tool == "rlprobe":
                    elapsed, _ = timed([*rlprobe_cmd, "compare", str(a), str(b), "-o", str(out), "--workers", "2", "--quiet"])
                    results["rlprobe"].append(elapsed)
            elapsed, _ = timed([*rlprobe_cmd, "compare", str(tiny_a), str(tiny_b), "-o", str(work / f"tiny-{i}"), "--quiet"])
            results["startup"].append(elapsed)
            t0 = time.perf_counter()
            subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
            results["cat"].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in results.items() if v}
        gb = size / 1e9
        report = {"bytes_compared": size, "medians_s": med}
        r_work = med["rlprobe"] - med["startup"]
        report["rlprobe_throughput_GBps"] = gb / r_work if r_work > 0 else None
        report["cat_GBps"] = gb / med["cat"]
        if "msprobe_call" in med:
            report["msprobe_throughput_GBps"] = gb / med["msprobe_call"]
            report["throughput_ratio"] = report["rlprobe_throughput_GBps"] / report["msprobe_throughput_GBps"]
            report["whole_command_speedup_vs_msprobe_process"] = med["msprobe_process"] / med["rlprobe"]
            report["whole_command_speedup_vs_msprobe_call"] = med["msprobe_call"] / med["rlprobe"]
        report["rlprobe_fraction_of_cat_speed"] = report["rlprobe_throughput_GBps"] / report["cat_GBps"]
        print(json.dumps(report, indent=2))
        print("runs:", json.dumps(results))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

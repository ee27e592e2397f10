"""What the capture core costs per small tensor: a TRL GRPO step's save calls, nothing else.

    python benchmarks/capture_small_tensors.py                      # this checkout, 5 repetitions
    python benchmarks/capture_small_tensors.py --baseline /work/main  # paired with another checkout

Workload (examples/trl_grpo's shapes): per step one rollout call of 12 keys (prompts, responses,
mask, rewards, advantages, log-probs; [8, 8] and [8, 16] tensors) with sample_ids and group_ids,
and two micro-batch calls of 5 keys ([4, 8] tensors and a 0-d loss) with sample_ids, then
`step()`; 22 tensors a step, ~300 bytes each. The training thread sleeps 10 ms a step so the
writer runs beside it as it does beside a training step. Reported per step: the background
writer thread's CPU (user = Python and numpy holding the GIL; sys = the kernel's file work:
folders, temporary files, renames), the training thread's CPU, and the wall time inside save().
Each repetition runs in a fresh process; with --baseline the two checkouts alternate, and the
table gives medians and the median of the paired ratios. The machine is shared: read ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def one_run(steps: int, stats_only: bool) -> dict[str, float]:
    """Run the workload in this process; CPU and wall figures per step (ms)."""
    import torch

    import rlprobe

    torch.manual_seed(0)
    roll = {k: torch.randn(8, 8) for k in ("prompts", "responses", "response_mask", "rewards", "advantages",
                                           "old_log_prob", "ref_log_prob", "rollout_log_prob", "r1", "r2", "r3",
                                           "r4")}
    roll["prompts"], roll["responses"] = torch.randint(0, 100, (8, 16)), torch.randint(0, 100, (8, 8))
    micro = {k: torch.randn(4, 8) for k in ("log_prob", "entropies", "loss_mask", "kl")}
    micro["loss"] = torch.tensor(0.5)
    ids = torch.arange(8)
    with tempfile.TemporaryDirectory(prefix="capture_small_") as tmp, rlprobe.Probe(tmp, stats_only=stats_only) as probe:
        writer = next(t for t in threading.enumerate() if t.name.startswith("rlprobe-writer"))
        warm = 10
        save_s, caller0, w0 = 0.0, 0.0, (0.0, 0.0)
        for s in range(warm + steps):
            if s == warm:
                probe.flush()
                caller0, w0, save_s = time.thread_time(), _thread_cpu(writer.native_id), 0.0
            t = time.perf_counter()
            probe.save(roll, sample_ids=ids, group_ids=ids // 4)
            for m in range(2):
                probe.save(micro, sample_ids=ids[m * 4:(m + 1) * 4])
            probe.step()
            save_s += time.perf_counter() - t
            time.sleep(0.01)
        probe.flush()
        caller = time.thread_time() - caller0
        w1 = _thread_cpu(writer.native_id)
    return {"writer_user_ms": (w1[0] - w0[0]) * 1e3 / steps, "writer_sys_ms": (w1[1] - w0[1]) * 1e3 / steps,
            "caller_cpu_ms": caller * 1e3 / steps, "save_wall_ms": save_s * 1e3 / steps}


def _thread_cpu(tid: int | None) -> tuple[float, float]:
    """(user, system) CPU seconds of one thread of this process, from /proc (Linux)."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def run_in(tree: Path, steps: int, stats_only: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--steps", str(steps)]
    out = subprocess.run(cmd + (["--stats-only"] if stats_only else []), env=env, check=True, capture_output=True,
                         text=True, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--stats-only", action="store_true")
    ap.add_argument("--baseline", help="another checkout (its root) to run alternately")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args.steps, args.stats_only)))
        return 0
    here = Path(__file__).resolve().parent.parent
    trees = {"this": here, **({"baseline": Path(args.baseline).resolve()} if args.baseline else {})}
    runs: list[dict[str, dict[str, float]]] = []
    for rep in range(args.reps):
        order = list(trees) if rep % 2 == 0 else list(reversed(trees))
        runs.append({name: run_in(trees[name], args.steps, args.stats_only) for name in order})
        print(f"rep {rep}: " + "; ".join(f"{n} writer {r['writer_user_ms']:.2f}+{r['writer_sys_ms']:.2f} ms, "
                                         f"save() {r['save_wall_ms']:.2f} ms" for n, r in runs[-1].items()), flush=True)
    fields = ("writer_user_ms", "writer_sys_ms", "caller_cpu_ms", "save_wall_ms")
    summary = {name: {f: statistics.median(r[name][f] for r in runs) for f in fields} for name in trees}
    print(f"\n22 small tensors a step, {args.reps} repetitions x {args.steps} steps (ms a step, medians)")
    print(f"{'':<10}" + "".join(f"{f:>16}" for f in fields))
    for name in trees:
        print(f"{name:<10}" + "".join(f"{summary[name][f]:>16.2f}" for f in fields))
    if args.baseline:
        ratios = {f: statistics.median(r["this"][f] / max(r["baseline"][f], 1e-9) for r in runs) for f in fields}
        summary["paired_ratio"] = ratios
        print(f"{'ratio':<10}" + "".join(f"{ratios[f]:>16.2f}" for f in fields) + "   (this / baseline, paired)")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

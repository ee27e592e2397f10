"""What the capture core costs per small tensor: a TRL GRPO step's save calls, nothing else.

    python benchmarks/capture_small_tensors.py                      # this checkout, 5 repetitions
    python benchmarks/capture_small_tensors.py --baseline /work/main  # paired with another checkout
    python benchmarks/capture_small_tensors.py --baseline /work/main --train-ops 2000  # + a training loop

Workload (examples/trl_grpo's shapes): per step one rollout call of 12 keys (prompts, responses,
mask, rewards, advantages, log-probs; [8, 8] and [8, 16] tensors) with sample_ids and group_ids,
and two micro-batch calls of 5 keys ([4, 8] tensors and a 0-d loss) with sample_ids, then
`step()`; 22 tensors a step, ~300 bytes each. The training thread sleeps 10 ms a step so the
writer runs beside it as it does beside a training step. Reported per step: the background
writer thread's CPU (user = Python and numpy holding the GIL; sys = the kernel's file work:
the packed file of each save call since the seventh session, a folder and a file a tensor before;
temporary files, renames), the writer process's CPU (user + sys; where the work goes
since issue 15's second pass, off the training process's GIL), the training thread's CPU, and
the wall time inside save(). With --train-ops N the training thread runs N tiny torch ops a step
instead of sleeping (each releases and re-takes the GIL, as a CPU training step's ops do); a
third run without any probe is added, and the loop's wall time against it is what the capture
adds to training through the GIL and the cores.
Each repetition runs in a fresh process; with --baseline the two checkouts alternate, and the
table gives medians and the median of the paired ratios. The machine is shared: read ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def one_run(steps: int, stats_only: bool, train_ops: int = 0, plain: bool = False) -> dict[str, float]:
    """Run the workload in this process; CPU and wall figures per step (ms). With `train_ops`,
    each step runs that many tiny torch ops (each releases and re-takes the GIL, as a CPU
    training step's do) instead of sleeping, and `train_ms` is their wall time: what the probe's
    background work adds to a step through the GIL. `plain`: the same loop, no probe."""
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
    a, b = torch.randn(16, 16), torch.randn(16, 16)

    def train() -> float:
        if not train_ops:
            time.sleep(0.01)
            return 0.0
        t = time.perf_counter()
        x = a
        for _ in range(train_ops):
            x = torch.tanh(x @ b)
        return time.perf_counter() - t

    with tempfile.TemporaryDirectory(prefix="capture_small_") as tmp, \
            (contextlib.nullcontext() if plain else rlprobe.Probe(tmp, stats_only=stats_only)) as probe:
        writer = None if plain else next(t for t in threading.enumerate() if t.name.startswith("rlprobe-writer"))
        writer = getattr(probe, "writer", None) or probe._writer  # `_writer` in older checkouts
        helper = None if plain else getattr(writer, "process", None)  # absent in older checkouts
        process = None if helper is None else helper.process.pid
        warm = 10
        save_s, train_s, caller0, w0, p0 = 0.0, 0.0, 0.0, (0.0, 0.0), (0.0, 0.0)
        for s in range(warm + steps):
            if s == warm:
                if not plain:
                    probe.flush()
                caller0, save_s, train_s = time.thread_time(), 0.0, 0.0
                w0, p0 = _thread_cpu(writer and writer.native_id), _process_cpu(process)
            t = time.perf_counter()
            if not plain:
                probe.save(roll, sample_ids=ids, group_ids=ids // 4)
                for m in range(2):
                    probe.save(micro, sample_ids=ids[m * 4:(m + 1) * 4])
                probe.step()
            save_s += time.perf_counter() - t
            train_s += train()
        if not plain:
            probe.flush()
        caller = time.thread_time() - caller0
        w1, p1 = _thread_cpu(writer and writer.native_id), _process_cpu(process)
    per_step = 1e3 / steps
    return {"writer_user_ms": (w1[0] - w0[0]) * per_step, "writer_sys_ms": (w1[1] - w0[1]) * per_step,
            "process_cpu_ms": (p1[0] + p1[1] - p0[0] - p0[1]) * per_step,
            "caller_cpu_ms": caller * per_step, "save_wall_ms": save_s * per_step, "train_ms": train_s * per_step}


def _process_cpu(pid: int | None) -> tuple[float, float]:
    """(user, system) CPU seconds of the writer process (0 where there is none), from /proc (Linux)."""
    if pid is None:
        return 0.0, 0.0
    return _cpu_fields(Path(f"/proc/{pid}/stat"))


def _thread_cpu(tid: int | None) -> tuple[float, float]:
    """(user, system) CPU seconds of one thread of this process, from /proc (Linux)."""
    return (0.0, 0.0) if tid is None else _cpu_fields(Path(f"/proc/self/task/{tid}/stat"))


def _cpu_fields(stat: Path) -> tuple[float, float]:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def run_in(tree: Path, steps: int, stats_only: bool, train_ops: int, plain: bool = False) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--steps", str(steps), "--train-ops", str(train_ops)]
    cmd += (["--stats-only"] if stats_only else []) + (["--plain"] if plain else [])
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--stats-only", action="store_true")
    ap.add_argument("--baseline", help="another checkout (its root) to run alternately")
    ap.add_argument("--train-ops", type=int, default=0,
                    help="per step, this many tiny torch ops instead of a 10 ms sleep; adds a run without the probe")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args.steps, args.stats_only, args.train_ops, args.plain)))
        return 0
    here = Path(__file__).resolve().parent.parent
    trees = {"this": here, **({"baseline": Path(args.baseline).resolve()} if args.baseline else {})}
    names = [*trees, *(["plain"] if args.train_ops else [])]
    runs: list[dict[str, dict[str, float]]] = []
    for rep in range(args.reps):
        order = names if rep % 2 == 0 else list(reversed(names))
        runs.append({name: run_in(trees.get(name, here), args.steps, args.stats_only, args.train_ops, name == "plain")
                     for name in order})
        print(f"rep {rep}: " + "; ".join(f"{n} writer {r['writer_user_ms']:.2f}+{r['writer_sys_ms']:.2f} ms, "
                                         f"process {r.get('process_cpu_ms', 0):.2f} ms, save() "
                                         f"{r['save_wall_ms']:.2f} ms, train {r.get('train_ms', 0):.2f} ms"
                                         for n, r in runs[-1].items()), flush=True)
    fields = ("writer_user_ms", "writer_sys_ms", "process_cpu_ms", "caller_cpu_ms", "save_wall_ms", "train_ms")
    summary = {name: {f: statistics.median(r[name].get(f, 0.0) for r in runs) for f in fields} for name in names}
    print(f"\n22 small tensors a step, {args.reps} repetitions x {args.steps} steps (ms a step, medians)")
    print(f"{'':<10}" + "".join(f"{f:>16}" for f in fields))
    for name in names:
        print(f"{name:<10}" + "".join(f"{summary[name][f]:>16.2f}" for f in fields))
    if args.baseline:
        ratios = {f: statistics.median(r["this"].get(f, 0.0) / max(r["baseline"].get(f, 0.0), 1e-9) for r in runs)
                  for f in fields}
        summary["paired_ratio"] = ratios
        print(f"{'ratio':<10}" + "".join(f"{ratios[f]:>16.2f}" for f in fields) + "   (this / baseline, paired)")
    if args.train_ops:  # what each checkout's capture adds to the training loop (GIL and cores)
        added = {n: (statistics.median(r[n]["train_ms"] / r["plain"]["train_ms"] for r in runs) - 1) * 100
                 for n in trees}
        summary["train_added_pct"] = added
        print("training loop slowed by the capture (paired median): "
              + ", ".join(f"{n} {v:+.1f}%" for n, v in added.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

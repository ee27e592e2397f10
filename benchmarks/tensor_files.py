"""The file work alone of a TRL step's key data: 22 small tensors in 3 save calls (capture_small_tensors.py's
shapes), written as a folder per call with a file a tensor (lake/atomic.py's AtomicFolder, the layout before the
seventh session) or as a packed file per call (TensorPack, docs/dump-format.md change 12).

    python benchmarks/tensor_files.py                   # in a temporary folder (TMPDIR: on its file system)
    python benchmarks/tensor_files.py --dir /dev/shm    # tmpfs: the file system's own cost left out

User and system CPU of this thread a step, the two alternating (ABBA), medians and the median of the paired
ratios; nothing else runs, so it shows what the number of files costs on that file system at that moment
(on the shared VM's ext4 it swings by 10x from minute to minute: read ratios from one run).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from rlprobe.lake.atomic import AtomicFolder
from rlprobe.lake.tensor_pack import TensorPack


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime, usage.ru_stime


def one_run(root: str, packed: bool, steps: int) -> dict[str, float]:
    """Write `steps` steps' tensors under `root`; user and system CPU a step (ms)."""
    rng = np.random.default_rng(0)
    calls = [[rng.random((8, 8), np.float32) for _ in range(12)]] + [[rng.random((4, 8), np.float32)
                                                                      for _ in range(5)] for _ in range(2)]
    user, system = _cpu()
    for step in range(steps):
        for call, arrays in enumerate(calls):
            where = f"{root}/tensors/key_data/step={step}/rank=0/call={call}"
            target = TensorPack(where + ".npys") if packed else AtomicFolder(where)
            for i, array in enumerate(arrays):
                target.save_npy(f"k{i}.npy", array)
            target.commit()
    user2, system2 = _cpu()
    return {"user_ms": (user2 - user) / steps * 1e3, "sys_ms": (system2 - system) / steps * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--dir", help="the file system to write on (default: TMPDIR's)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    runs: list[dict[str, dict[str, float]]] = []
    for rep in range(args.reps):
        figures = {}
        for name in (("packed", "folders") if rep % 2 == 0 else ("folders", "packed")):
            root = tempfile.mkdtemp(prefix="tensor_files_", dir=args.dir)
            try:
                figures[name] = one_run(root, name == "packed", args.steps)
            finally:
                shutil.rmtree(root, ignore_errors=True)
        runs.append(figures)
    summary = {name: {k: statistics.median(r[name][k] for r in runs) for k in ("user_ms", "sys_ms")}
               for name in ("packed", "folders")}
    total = {name: [r[name]["user_ms"] + r[name]["sys_ms"] for r in runs] for name in ("packed", "folders")}
    summary["paired_cpu_ratio"] = statistics.median(p / max(f, 1e-9) for p, f in zip(total["packed"], total["folders"]))
    summary["load"] = os.getloadavg()
    print(f"22 tensors in 3 save calls a step, {args.reps} repetitions x {args.steps} steps, "
          f"in {args.dir or tempfile.gettempdir()} (ms a step, medians)")
    for name in ("packed", "folders"):
        print(f"  {name:<8} user {summary[name]['user_ms']:.3f}  sys {summary[name]['sys_ms']:.3f}")
    print(f"  paired CPU ratio packed / folders: {summary['paired_cpu_ratio']:.2f}   "
          f"load {' '.join(f'{x:.1f}' for x in summary['load'])}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU time of getting each family of compiled kernels into a fresh process (issue 18): a `python -c` child
per run imports what a command imports and calls each kernel once on a tiny input, and prints the CPU time of
its calling thread for that (`time.thread_time`) and whether numba was imported. Each family runs with the
ahead-of-time module (where rlprobe.numba_cache finds it built: `python -m rlprobe.numba_build` first) and
with RLPROBE_AOT=0 (numba's JIT kernels from its on-disk cache), alternating; medians and their ratio.

    python benchmarks/kernel_load.py [--repeat 7] [--checkout PATH]

CPU time, not wall time: the machine is shared. numpy's import, and the modules a command imports before\nit needs the kernels (compare: rlprobe.comparison.run), are outside the measured span.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_MEASURE = ("import sys, time\nimport numpy as np\n{setup}\nt = time.thread_time()\n{body}\n"
            "print(time.thread_time() - t, 'numba' in sys.modules)\n")

FAMILIES = {
    # what `rlprobe compare` runs: the warm-up, one larger pair (element kernel) and a batch of small files
    "compare": ("import rlprobe.comparison.run, rlprobe.comparison.pair_metrics  # imported by the command anyway",
                "from rlprobe.comparison.run import warm_up_kernels\nwarm_up_kernels()\n"
                "from rlprobe.comparison.pair_metrics import pair_kernel, batch_functions\n"
                "x = np.arange(64, dtype=np.float32)\npair_kernel(x.dtype)(x, x, 0, 64)\n"
                "bk = batch_functions()\npaths = np.frombuffer(b'/nonexistent\\0', np.uint8)\n"
                "info, sizes = np.zeros((1, 4), np.int64), np.zeros(1, np.int64)\n"
                "buf = bk.read_files(paths, np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, -1, np.int64), 1 << 20, "
                "info, sizes)\n"
                "bk.compare_batch(buf, info, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 6), np.int64),"
                " np.zeros((0, 5)))\n"),
    # `rlprobe check`'s token kernel (and compare's single-run rules'), as token_tables calls it
    "check": ("import rlprobe.checks.token_tables  # imported by the command anyway",
              "from rlprobe.checks.compiled import reduce_pair\n"
              "x = np.zeros((2, 8), np.float32)\nreduce_pair(x, x, 0.2)\n"),
    # the gradient probe's CPU kernel (JIT only so far)
    "grads": ("", "from rlprobe.frameworks.cpu_grad_kernel import stats_into\n"
              "stats_into(np.ones(16, np.float32), None, np.zeros(4), None, 0)\n"),
}


def run(checkout: Path, code: tuple[str, str], aot: bool) -> tuple[float, bool]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    if not aot:
        env["RLPROBE_AOT"] = "0"
    done = subprocess.run([sys.executable, "-c", _MEASURE.format(setup=code[0], body=code[1])], env=env, cwd=checkout,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    cpu, numba = done.stdout.split()[-2:]
    return float(cpu), numba == "True"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--checkout", default=str(HERE.parent))
    ap.add_argument("--families", default=",".join(FAMILIES))
    args = ap.parse_args()
    checkout = Path(args.checkout)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    built = subprocess.run([sys.executable, "-m", "rlprobe.numba_build"], env=env, cwd=checkout,
                           capture_output=True, text=True)
    print(f"ahead-of-time kernels: {built.stdout.strip() or built.stderr.strip()[-300:]}")
    print(f"load average {os.getloadavg()[0]:.1f}; CPU seconds of the calling thread, medians of {args.repeat}")
    for family in args.families.split(","):
        body = FAMILIES[family]
        run(checkout, body, False)  # numba's cache holds the JIT kernels
        got: dict[bool, list[tuple[float, bool]]] = {True: [], False: []}
        for i in range(args.repeat):
            for aot in ((True, False) if i % 2 == 0 else (False, True)):
                got[aot].append(run(checkout, body, aot))
        med = {aot: statistics.median(c for c, _ in runs) for aot, runs in got.items()}
        numba = {aot: any(n for _, n in runs) for aot, runs in got.items()}
        print(f"{family:8s} default {med[True] * 1000:7.1f} ms (numba imported: {numba[True]})  "
              f"RLPROBE_AOT=0 {med[False] * 1000:7.1f} ms (numba imported: {numba[False]})  "
              f"ratio {med[False] / med[True]:.1f} x")


if __name__ == "__main__":
    main()

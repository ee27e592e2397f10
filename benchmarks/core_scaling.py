"""How much two busy processes get done on this machine against one: the ceiling of any 2-worker speed-up.

    python benchmarks/core_scaling.py [--repeat 5] [--json FILE]
    python benchmarks/core_scaling.py --two-cores      # prints "A,B": two CPUs of distinct physical cores

Issue 18 asks `rlprobe compare --workers 2` to be >= 1.7 x faster than `--workers 1` on 2 cores. On a
virtual machine two vCPUs need not be two whole cores: they can be hyper-threads of one, or share a
host's memory bandwidth with other guests. This measures it for three kinds of work, each in fresh
processes, one alone and then two at once (same work each, repetitions alternating): a pure-Python
loop (the interpreter, as the GIL-holding parts of a comparison), numpy sorts of 32 MB (memory-bound,
as the pairs' kernels and Arrow), and blake2b of 200 MB (a C loop, as hashing and deflate). The
figure is 2 x (one alone) / (the slower of two at once): 2.0 for two independent cores, 1.0 for one
core shared. A 2-worker ratio above it cannot be measured on this machine.

`--two-cores` names two CPUs this process may run on that sit on different physical cores (by the
kernel's topology: package and core id), for `taskset -c A,B`: on a many-core machine (the lent GPU
machine, benchmarks/gpu_checks.sh) the comparison's 2-worker ratio is then measured on two whole cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

WORK = {  # each with its size at --scale 1
    "python loop": ("x = 0\nfor i in range({n}):\n    x += i", 15_000_000),
    "numpy sort": ("import numpy as np\nr = np.random.default_rng(0).random({n})\nfor _ in range(6):\n    np.sort(r)",
                   4_000_000),
    "blake2b": ("import hashlib\nhashlib.blake2b(bytes({n})).digest()", 200_000_000),
}


def timed(code: str, processes: int) -> list[float]:
    """Seconds each of `processes` fresh interpreters, started together, spends on `code`."""
    source = f"import time\nt = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"
    running = [subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, text=True)
               for _ in range(processes)]
    return [float(p.communicate()[0]) for p in running]


def two_cores(cpus: list[int], core_of: dict[int, tuple[int, int]]) -> list[int] | None:
    """The first two of `cpus` (in order) whose physical cores (`core_of`: cpu -> (package, core id)) differ;
    None when all share one. A CPU missing from `core_of` counts as a core of its own."""
    first = cpus[0] if cpus else None
    for cpu in cpus[1:]:
        if core_of.get(cpu, ("cpu", cpu)) != core_of.get(first, ("cpu", first)):
            return [first, cpu]  # type: ignore[list-item]
    return None


def topology() -> dict[int, tuple[int, int]]:
    """Linux's cpu -> (physical package, core id), from /sys (empty where it is not there)."""
    found = {}
    for cpu in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"):
        try:
            ids = [int((cpu / "topology" / name).read_text()) for name in ("physical_package_id", "core_id")]
        except (OSError, ValueError):
            continue
        found[int(cpu.name[3:])] = (ids[0], ids[1])
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="work sizes x this (the test suite runs 0.01)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--two-cores", action="store_true", help="print two CPUs of distinct physical cores, then exit")
    args = ap.parse_args(argv)
    if args.two_cores:
        import os

        pair = two_cores(sorted(os.sched_getaffinity(0)), topology())
        if pair is None:
            print("core_scaling.py: no two CPUs of distinct physical cores to run on here", file=sys.stderr)
            return 1
        print(f"{pair[0]},{pair[1]}")
        return 0
    out = {}
    for name, (template, size) in WORK.items():
        code = template.format(n=max(1, int(size * args.scale)))
        one, two = [], []
        for _ in range(args.repeat):
            one += timed(code, 1)
            two.append(max(timed(code, 2)))
        alone, both = statistics.median(one), statistics.median(two)
        out[name] = {"one_s": alone, "two_s": both, "throughput_of_two": 2 * alone / both}
        print(f"{name:12s} one alone {alone:.2f} s, two at once {both:.2f} s (the slower): "
              f"two cores do {2 * alone / both:.2f} x the work of one", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

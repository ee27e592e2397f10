"""How much two busy processes get done on this machine against one: the ceiling of any 2-worker speed-up.

    python benchmarks/core_scaling.py [--repeat 5] [--json FILE]

Issue 18 asks `rlprobe compare --workers 2` to be >= 1.7 x faster than `--workers 1` on 2 cores. On a
virtual machine two vCPUs need not be two whole cores: they can be hyper-threads of one, or share a
host's memory bandwidth with other guests. This measures it for three kinds of work, each in fresh
processes, one alone and then two at once (same work each, repetitions alternating): a pure-Python
loop (the interpreter, as the GIL-holding parts of a comparison), numpy sorts of 32 MB (memory-bound,
as the pairs' kernels and Arrow), and blake2b of 200 MB (a C loop, as hashing and deflate). The
figure is 2 x (one alone) / (the slower of two at once): 2.0 for two independent cores, 1.0 for one
core shared. A 2-worker ratio above it cannot be measured on this machine.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="work sizes x this (the test suite runs 0.01)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
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

"""Instructions of the start-up (`rlprobe compare` of two one-step dumps, as benchmarks/startup.py runs it),
counted by valgrind's callgrind per thread: a figure the load of a shared VM does not move, where wall and
CPU times move by 30-50 % between runs (docs/performance.md, "How speed is measured").

    python benchmarks/startup_instructions.py [--baseline /work/base-s8] [--format msprobe] [--bytecode]

Each checkout runs once under `valgrind --tool=callgrind --separate-threads=yes` (~1 min each), on the
interpreter binary itself (a pyenv shim is a shell script valgrind would measure instead). Prints, per
checkout, the instructions of the whole process and of its main thread, and the other threads' above
1 M. --bytecode: from byte-compiled copies, as startup.py --bytecode. Needs valgrind on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from startup import CHECKOUT, installed_copy, make_tiny_dumps


def interpreter() -> str:
    """The python binary itself (sys.executable may be a wrapper script)."""
    real = Path(sysconfig.get_config_var("BINDIR") or "") / f"python{sysconfig.get_python_version()}"
    return str(real) if real.is_file() else sys.executable


def instructions(checkout: Path, a: Path, b: Path, work: Path, name: str) -> dict[str, int]:
    """{"process": N, "main": N, "thread <i>": N ...} of one `rlprobe compare a b` run from `checkout`."""
    prefix = work / f"callgrind-{name}"
    done = subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                           f"--callgrind-out-file={prefix}", interpreter(), "-m", "rlprobe.cli", "compare",
                           str(a), str(b), "-o", str(work / f"out-{name}")],
                          cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"rlprobe compare under valgrind from {checkout} failed: {done.stderr[-2000:]}")
    counts: dict[str, int] = {}
    for part in sorted(work.glob(f"callgrind-{name}-*")):  # one file a thread: <prefix>-01 is the main thread
        found = re.search(r"^totals:\s*(\d+)", part.read_text(errors="replace"), re.MULTILINE)
        if found:
            thread = int(part.name.rsplit("-", 1)[1])
            counts["main" if thread == 1 else f"thread {thread}"] = int(found.group(1))
    counts["process"] = sum(counts.values())
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="Another checkout to count in the same run.")
    ap.add_argument("--format", default="msprobe", choices=("msprobe", "rlprobe"))
    ap.add_argument("--bytecode", action="store_true", help="Count byte-compiled copies (as installed).")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH: install it (apt-get install valgrind) to count instructions")
    checkouts = {"this": CHECKOUT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    work = Path(tempfile.mkdtemp(prefix="bench-startup-instructions-"))
    try:
        if args.bytecode:
            checkouts = {who: installed_copy(path, work / f"installed-{who}") for who, path in checkouts.items()}
        a, b = make_tiny_dumps(work, args.format)
        report = {}
        for who, path in checkouts.items():
            counts = instructions(path, a, b, work, who)
            report[who] = {k: v for k, v in counts.items() if k in ("process", "main") or v > 1_000_000}
        print(json.dumps({"format": args.format, "bytecode": args.bytecode, "instructions": report}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

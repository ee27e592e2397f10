"""`python -m rlprobe.cli ...`: the `rlprobe` command (the benchmarks run a checkout's command this way)."""

from rlprobe.cli import console

console()

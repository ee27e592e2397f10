"""What sample rows (docs/dump-format.md, "Samples") cost at capture: the same save calls with
the prompt ids under `prompts` (sample rows written) and under `prompt_tokens` (no identity, no
sample rows), alternating, paired medians.

    python benchmarks/sample_overhead.py [--repeat 5] [--stats-only]

Workload: 4 steps x 4 micro-batches, each call 64 samples: prompts int64 [64, 512], responses
int64 [64, 512], five float32 [64, 512] per-token keys, two scalars. Blocking time is the time
inside save(); total time runs until close() returns (everything on disk, the writer thread's
hashing included). The machine is shared: the ratio of paired medians is the figure to read.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import rlprobe

STEPS, MICRO, ROWS, WIDTH = 4, 4, 64, 512


def _calls(seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    calls = []
    for _ in range(STEPS * MICRO):
        call = {"prompts": torch.randint(0, 50000, (ROWS, WIDTH), generator=gen),
                "responses": torch.randint(0, 50000, (ROWS, WIDTH), generator=gen)}
        for key in ("old_log_prob", "ref_log_prob", "values", "advantages", "returns"):
            call[key] = torch.randn(ROWS, WIDTH, generator=gen)
        call["loss"], call["entropy"] = torch.tensor(0.5), torch.tensor(1.5)
        calls.append(call)
    return calls


def _run(path: Path, calls: list[dict[str, torch.Tensor]], prompt_key: str, stats_only: bool) -> tuple[float, float]:
    shutil.rmtree(path, ignore_errors=True)
    started = time.perf_counter()
    blocked = 0.0
    probe = rlprobe.Probe(path, framework="torch", stats_only=stats_only)
    for s in range(STEPS):
        for m in range(MICRO):
            call = dict(calls[s * MICRO + m])
            call[prompt_key] = call.pop("prompts")
            t0 = time.perf_counter()
            probe.save(call)
            blocked += time.perf_counter() - t0
        probe.step()
    probe.close()
    return blocked, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stats-only", action="store_true")
    args = ap.parse_args()
    calls = _calls(0)
    results: dict[str, list[tuple[float, float]]] = {"prompts": [], "prompt_tokens": []}
    with tempfile.TemporaryDirectory() as tmp:
        _run(Path(tmp) / "warm", calls, "prompts", args.stats_only)
        for i in range(args.repeat):
            for key in (("prompts", "prompt_tokens") if i % 2 == 0 else ("prompt_tokens", "prompts")):
                results[key].append(_run(Path(tmp) / key, calls, key, args.stats_only))
    for what, col in (("blocking", 0), ("total", 1)):
        with_rows = [r[col] for r in results["prompts"]]
        without = [r[col] for r in results["prompt_tokens"]]
        ratio = statistics.median(np.array(with_rows) / np.array(without))
        print(f"{what}: with sample rows {statistics.median(with_rows) * 1e3:.1f} ms, without "
              f"{statistics.median(without) * 1e3:.1f} ms, paired median ratio {ratio:.3f}")


if __name__ == "__main__":
    main()

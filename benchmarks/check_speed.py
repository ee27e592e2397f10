"""Time `rlprobe check` on a large statistics-only dump and its token kernel on tensors.

1. Statistics: STEPS x RANKS ranks, each a real rlprobe.Probe(stats_only=True) in its own
   process (cached under --cache), MICRO save calls a step with the canonical keys (log_prob,
   old_log_prob, rollout_log_prob, ref_log_prob, advantages, kl, loss, rewards, entropy, values)
   and a NaN planted at STEPS//2, rank 1, advantages. Prints the phases of check_dump: read
   (statistics, scalars, configs, gradients), sql (every check's query) — the issue's goal is
   sql < 5 s at 1,000 steps x 64 ranks.
2. Tensors: a dump of PAIRS rollout_log_prob/old_log_prob pairs of ROWS x COLS float32 (with a
   response mask); after a warm-up check of a small dump (numba's compile is start-up), the token
   phase's throughput in bytes of log-prob pairs per second (goal >= 1 GB/s on 2 cores).
3. Kernel: the same pairs read into memory first, reduced by the kernel alone on 1 thread and on
   2 (the pairs split between them): GB/s and the 2-thread scaling, wall clock and the 1-thread
   figure also in thread CPU time (what the kernel costs when other processes share the cores).

    python benchmarks/check_speed.py [--steps 1000 --ranks 64 --micro 2] [--pairs 64 --rows 64 --cols 4096]
                                     [--cache DIR] [--repeat 3] [--smoke] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

KEYS = ("log_prob", "old_log_prob", "rollout_log_prob", "ref_log_prob", "advantages", "kl", "loss", "rewards",
        "entropy", "values")
NAN_RANK = 1


def write_rank(root: str, rank: int, ranks: int, steps: int, micro: int) -> None:
    import rlprobe

    rng = np.random.default_rng(rank)
    base = {k: -rng.random(8).astype(np.float32) for k in KEYS}
    with rlprobe.Probe(root, stats_only=True, rank=rank, world_size=ranks, run_id="check-bench") as p:
        if rank == 0:
            p.save_config({"ppo": {"clip": 0.2, "ref_starts_as_actor": True}})
        for step in range(steps):
            for m in range(micro):
                batch = {k: v * np.float32(1 + 0.001 * step) for k, v in base.items()}
                batch["old_log_prob"] = batch["log_prob"]
                batch["rollout_log_prob"] = batch["log_prob"]
                batch["ref_log_prob"] = batch["log_prob"]
                batch["kl"] = np.zeros(8, np.float32)
                if rank == NAN_RANK and step == steps // 2 and m == 1:
                    batch["advantages"] = batch["advantages"].copy()
                    batch["advantages"][5] = np.nan
                p.save(batch)
            p.log_metrics({"loss": 1.0 / (1 + step)})
            p.step()


def stats_dump(cache: Path, steps: int, ranks: int, micro: int, jobs: int) -> Path:
    dump = cache / "stats"
    shape = {"steps": steps, "ranks": ranks, "micro": micro, "layout": 1}
    marker = cache / "stats.json"
    if marker.exists() and json.loads(marker.read_text()) == shape:
        return dump
    shutil.rmtree(dump, ignore_errors=True)
    if jobs == 1:  # in this process (the smoke test): no start-up of worker processes
        for r in range(ranks):
            write_rank(str(dump), r, ranks, steps, micro)
        marker.write_text(json.dumps(shape))
        return dump
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        pool.submit(write_rank, str(dump), 0, ranks, steps, micro).result()  # rank 0 writes the run manifest
        for f in [pool.submit(write_rank, str(dump), r, ranks, steps, micro) for r in range(1, ranks)]:
            f.result()
    marker.write_text(json.dumps(shape))
    return dump


def tensor_dump(path: Path, pairs: int, rows: int, cols: int) -> int:
    """A dump of `pairs` steps, each one save of rollout/old log-probs and a mask; returns the pairs' bytes."""
    import rlprobe

    rng = np.random.default_rng(0)
    old = -rng.random((rows, cols), dtype=np.float32) * 4
    mask = np.ones((rows, cols), np.bool_)
    mask[:, cols * 3 // 4:] = False
    with rlprobe.Probe(path, mode="overwrite", flush_interval=0) as p:
        for step in range(pairs):
            rollout = old + rng.normal(0, 0.01, old.shape).astype(np.float32)
            p.save({"rollout_log_prob": rollout, "old_log_prob": old, "response_mask": mask})
            p.step()
    return pairs * 2 * old.nbytes


def kernel_speed(path: Path, repeat: int) -> dict[str, float]:
    """GB/s of the kernel alone on the dump's rollout/old pairs, in memory: 1 thread (wall and thread
    CPU time), 2 threads (wall), scaling = 2-thread / 1-thread wall GB/s."""
    from rlprobe.check.inputs import stats_table
    from rlprobe.check.token_kernel import PairFigures, reduce_pair
    from rlprobe.check.token_tables import tensor_rows
    from rlprobe.lake.reader import open_dump

    dump = open_dump(path)
    tensors = {(name, step): np.array(dump.load_tensor(row["tensor_file"], row["dtype"]))
               for (name, step, _, _, _), row in tensor_rows(stats_table(dump)).items()}
    steps = sorted({step for _, step in tensors})
    triples = [(tensors[("old_log_prob", s)], tensors[("rollout_log_prob", s)], tensors[("response_mask", s)])
               for s in steps]
    nbytes = sum(a.nbytes + b.nbytes for a, b, _ in triples)

    def run(share: list) -> float:
        figures, cpu = PairFigures(), time.thread_time()
        for a, b, mask in share:
            reduce_pair(a, b, 0.2, mask, into=figures)
        return time.thread_time() - cpu

    run(triples[:1])  # compiled kernel loaded
    one, one_cpu, two = [], [], []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(repeat):
            t = time.perf_counter()
            one_cpu.append(run(triples))
            one.append(time.perf_counter() - t)
            t = time.perf_counter()
            list(pool.map(run, (triples[0::2], triples[1::2])))
            two.append(time.perf_counter() - t)
    figures = {"kernel_1thread_gb_s": nbytes / statistics.median(one) / 1e9,
               "kernel_1thread_cpu_gb_s": nbytes / statistics.median(one_cpu) / 1e9,
               "kernel_2threads_gb_s": nbytes / statistics.median(two) / 1e9}
    figures["kernel_scaling"] = figures["kernel_2threads_gb_s"] / figures["kernel_1thread_gb_s"]
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/rlprobe_check_bench"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: the script runs, the figures mean nothing")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.ranks, args.pairs, args.rows, args.cols, args.repeat, args.jobs = 4, 2, 2, 4, 64, 1, 1
    from rlprobe.check.run import check_dump

    args.cache.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    dump = stats_dump(args.cache, args.steps, args.ranks, args.micro, args.jobs)
    generated = time.perf_counter() - t
    runs = [check_dump(dump) for _ in range(args.repeat)]
    first = runs[-1].results.to_pylist()
    nan_row = next(r for r in first if r["check"] == "nonfinite")
    sql = statistics.median(r.timings["sql"] for r in runs)
    read = statistics.median(r.timings["read"] for r in runs)
    print(f"statistics: {args.steps} steps x {args.ranks} ranks x {args.micro} micro x {len(KEYS)} keys "
          f"(generated in {generated:.1f} s): read {read:.2f} s, sql {sql:.2f} s (median of {args.repeat})")
    print(f"  nonfinite: {nan_row['status']}: {nan_row['first']}")

    tensors = args.cache / "tensors"
    nbytes = tensor_dump(tensors, args.pairs, args.rows, args.cols)
    warm = args.cache / "warm"
    tensor_dump(warm, 1, 2, 8)
    check_dump(warm)  # start-up: numba's compiled kernel loads (or compiles) here
    token_s = statistics.median(check_dump(tensors).timings["tokens"] for _ in range(args.repeat))
    rate = nbytes / token_s / 1e9
    print(f"tensors: {args.pairs} pairs of {args.rows} x {args.cols} float32 ({nbytes / 1e9:.2f} GB of pairs): "
          f"token phase {token_s:.2f} s = {rate:.2f} GB/s (median of {args.repeat})")
    kernel = kernel_speed(tensors, args.repeat)
    print(f"kernel alone, pairs in memory: 1 thread {kernel['kernel_1thread_gb_s']:.2f} GB/s "
          f"({kernel['kernel_1thread_cpu_gb_s']:.2f} GB/s of thread CPU time), 2 threads "
          f"{kernel['kernel_2threads_gb_s']:.2f} GB/s: scaling {kernel['kernel_scaling']:.2f} "
          f"(median of {args.repeat})")
    if args.json:
        args.json.write_text(json.dumps({"sql_s": sql, "read_s": read, "token_s": token_s, "gb_per_s": rate,
                                         "nonfinite": nan_row, **kernel}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

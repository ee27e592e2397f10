"""Time `rlprobe check` on a large statistics-only dump and its token kernel on tensors.

1. Statistics: STEPS x RANKS ranks, each a real rlprobe.Probe(stats_only=True) in its own
   process (cached under --cache), MICRO save calls a step with the canonical keys (log_prob,
   old_log_prob, rollout_log_prob, ref_log_prob, advantages, kl, loss, rewards, entropy, values)
   and a NaN planted at STEPS//2, rank 1, advantages. Prints the phases of check_dump: read
   (statistics, scalars, configs, gradients), sql (every check's query) — the issue's goal is
   sql < 5 s at 1,000 steps x 64 ranks.
2. Tensors: a dump of PAIRS rollout_log_prob/old_log_prob pairs of ROWS x COLS float32 (with a
   response mask); the token phase's throughput in bytes of log-prob pairs per second (goal >= 1 GB/s
   on 2 cores beyond start-up). Start-up, not timed: the process start, imports, and first checks of
   two small dumps (warm_dump: pairs reduced one by one, and a pool job's pairs in one call), which
   bring the dumps into the page cache (and, for a baseline of before issue 42, load numba's kernels). Timed: the token phase of
   check_dump (CheckResult.timings["tokens"]: pairing the tensor index, reading the files, the kernel
   on 2 threads, the token tables), wall clock and the process's CPU time. The bytes counted are
   those of the log-prob pairs reduced (two float32 tensors a pair; masks not counted).
   --workloads adds the class of workloads (each cached): `few` (4 pairs of 64 x 32768), `one` (a
   single pair of 512 x 8192: its rows split between the threads), `many` (1,024 pairs of 8 x 1024),
   `medium` (128 pairs of 32 x 4096), `nomask`, `extras` (log_prob and entropy saved too: the
   on-policy pair as well).
   --baseline CHECKOUT: each workload's token phase also from another checkout, each version in a
   process of its own, alternating, with paired ratios (baseline / this checkout).
3. Kernel: the same pairs read into memory first, reduced by the kernel alone on 1 thread and on
   2 (the pairs split between them): GB/s and the 2-thread scaling, wall clock and the 1-thread
   figure also in thread CPU time (what the kernel costs when other processes share the cores);
   with --baseline also paired with the other checkout's kernel (processes of their own, alternating).

    python benchmarks/check_speed.py [--steps 1000 --ranks 64 --micro 2] [--pairs 64 --rows 64 --cols 4096]
                                     [--cache DIR] [--repeat 3]
                                     [--workloads bench,few,one,many,medium,nomask,extras]
                                     [--baseline /path/to/other/checkout] [--no-stats] [--smoke] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

KEYS = ("log_prob", "old_log_prob", "rollout_log_prob", "ref_log_prob", "advantages", "kl", "loss", "rewards",
        "entropy", "values")
NAN_RANK = 1
# name: (save calls, rows, cols, mask, log_prob and entropy saved too)
WORKLOADS = {"few": (4, 64, 32768, True, False), "one": (1, 512, 8192, True, False),
             "many": (1024, 8, 1024, True, False), "medium": (128, 32, 4096, True, False),
             "nomask": (64, 64, 4096, False, False),
             "extras": (32, 64, 4096, True, True)}


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


def tensor_dump(path: Path, pairs: int, rows: int, cols: int, masked: bool = True, extras: bool = False) -> int:
    """A dump of `pairs` steps, each one save of rollout/old log-probs (a mask; with `extras` log_prob
    and entropy too); kept where its marker says it has that shape. Returns the bytes of the pairs
    the check reduces (rollout vs old; with `extras` also log_prob vs old, the on-policy pair)."""
    import rlprobe

    nbytes = pairs * (4 if extras else 2) * rows * cols * 4
    shape = {"pairs": pairs, "rows": rows, "cols": cols, "masked": masked, "extras": extras, "layout": 2}
    marker = path.with_name(path.name + ".json")
    if marker.exists() and json.loads(marker.read_text()) == shape and path.is_dir():
        return nbytes
    shutil.rmtree(path, ignore_errors=True)
    rng = np.random.default_rng(0)
    old = -rng.random((rows, cols), dtype=np.float32) * 4
    mask = np.ones((rows, cols), np.bool_)
    mask[:, cols * 3 // 4:] = False
    with rlprobe.Probe(path, mode="overwrite", flush_interval=0) as p:
        for _ in range(pairs):
            batch = {"rollout_log_prob": old + rng.normal(0, 0.01, old.shape).astype(np.float32), "old_log_prob": old}
            if masked:
                batch["response_mask"] = mask
            if extras:
                batch["log_prob"] = old
                batch["entropy"] = rng.random(old.shape, dtype=np.float32)
            p.save(batch)
            p.step()
    marker.write_text(json.dumps(shape))
    return nbytes


def warm_dump(path: Path) -> list[Path]:
    """The start-up checks' dumps, so that every compiled kernel the timed phases call is loaded:
    `pairs`, two steps (fewer keys than pool jobs: each pair through the kernel on its own, cut into
    row ranges), and `batch`, twelve steps of small pairs (a pool job's pairs in one compiled call)."""
    import rlprobe

    dumps = [path / "pairs", path / "batch"]
    marker = path.with_name(path.name + ".json")
    if marker.exists() and json.loads(marker.read_text()) == {"layout": 3} and all(d.is_dir() for d in dumps):
        return dumps
    shutil.rmtree(path, ignore_errors=True)
    rng = np.random.default_rng(0)
    for dump, shapes in zip(dumps, (((2, 8), (2, 40_000)), ((2, 8),) * 12)):
        with rlprobe.Probe(dump, mode="overwrite", flush_interval=0) as p:
            for shape in shapes:
                old = -rng.random(shape, dtype=np.float32)
                p.save({"rollout_log_prob": old + np.float32(0.01), "old_log_prob": old,
                        "response_mask": np.ones(shape, np.bool_)})
                p.step()
    marker.write_text(json.dumps({"layout": 3}))
    return dumps


def token_phase(path: Path, warm: Path | str, repeat: int | str) -> dict[str, list[float]]:
    """The token phase of check_dump on `path`, `repeat` times after warm-up checks of the dumps in
    `warm` (start-up; os.pathsep between them): its wall seconds (CheckResult.timings["tokens"]) and
    the CPU seconds (user + system, all threads) of the same phase run again on its own (check_dump's
    calls, between two getrusage)."""
    import resource

    from rlprobe.checks import inputs
    from rlprobe.checks.run import check_dump
    from rlprobe.checks.pair_index import samples_table
    from rlprobe.checks.token_tables import group_advantages, token_tables
    from rlprobe.lake.reader import open_dump

    from rlprobe.checks import run as check_run

    paused = getattr(check_run, "collections_paused", contextlib.nullcontext)  # as check_dump runs the phase
    for dump in str(warm).split(os.pathsep):  # start-up: the page cache (a numba baseline's kernels) here
        check_dump(dump)
    wall, cpu = [], []
    for _ in range(int(repeat)):
        wall.append(check_dump(path).timings["tokens"])
        dump = open_dump(path)
        stats = inputs.stats_table(dump)
        info = inputs.run_info(dump, stats, dump.configs(), {})
        before = resource.getrusage(resource.RUSAGE_SELF)
        with paused():
            samples = samples_table(dump)
            token_tables(dump, stats, info["eps"], 2, samples)
            group_advantages(dump, stats, info["group_size"], samples)
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {"wall": wall, "cpu": cpu}


def in_child(checkout: Path, call: str, *args: str) -> dict:
    """check_speed.<call>(*args) in a fresh process whose rlprobe is the one of `checkout`."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import check_speed; from pathlib import Path; "
            f"print(json.dumps(check_speed.{call}(Path(sys.argv[2]), *sys.argv[3:])))")
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent), *args], env=env,
                          cwd=checkout, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{call} in {checkout} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def kernel_speed(path: Path, repeat: int | str) -> dict[str, float]:
    """GB/s of the kernel alone on the dump's rollout/old pairs, in memory: 1 thread (wall and thread
    CPU time), 2 threads (wall), scaling = 2-thread / 1-thread wall GB/s."""
    from rlprobe.checks.inputs import stats_table
    from rlprobe.checks.token_tables import tensor_rows

    try:
        from rlprobe.checks.token_figures import PairFigures
        from rlprobe.checks.compiled import reduce_pair
    except ImportError:  # a --baseline checkout from before the kernels' AOT split (session 5)
        from rlprobe.checks.token_kernel import PairFigures, reduce_pair
    from rlprobe.lake.reader import open_dump

    dump = open_dump(path)
    load = getattr(dump, "load_row_tensor", None) or (  # a --baseline checkout from before packed files
        lambda row: dump.load_tensor(row["tensor_file"], row["dtype"]))
    tensors = {(name, step): np.array(load(row)) for (name, step, _, _, _), row in tensor_rows(stats_table(dump)).items()}
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
        for _ in range(int(repeat)):
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


def token_workloads(args: argparse.Namespace, bench: Path, nbytes: int, warm: str) -> dict[str, dict]:
    """Each workload's token phase (and the baseline's, alternating): medians and paired ratios."""
    dumps = {"bench": (bench, nbytes)}
    for name in [w for w in args.workloads.split(",") if w and w != "bench"]:
        pairs, rows, cols, masked, extras = WORKLOADS[name]
        if args.smoke:
            pairs, rows, cols = min(pairs, 3), min(rows, 4), min(cols, 64)
        path = args.cache / f"tensors-{name}"
        dumps[name] = (path, tensor_dump(path, pairs, rows, cols, masked, extras))
    here = Path(__file__).resolve().parent.parent
    versions = {"this": here} | ({"baseline": Path(args.baseline).resolve()} if args.baseline else {})
    found: dict[str, dict] = {}
    for name, (path, size) in dumps.items():
        runs: dict[str, dict[str, list[float]]] = {v: {"wall": [], "cpu": []} for v in versions}
        for i in range(args.repeat):
            for label in (list(versions) if i % 2 == 0 else list(versions)[::-1]):
                if len(versions) == 1:
                    got = token_phase(path, warm, 1)
                else:
                    got = in_child(versions[label], "token_phase", str(path), str(warm), "1")
                for k in ("wall", "cpu"):
                    runs[label][k] += got[k]
        figures = {"gb": size / 1e9}
        for label, r in runs.items():
            figures[f"{label}_s"] = statistics.median(r["wall"])
            figures[f"{label}_gb_s"] = size / figures[f"{label}_s"] / 1e9
            figures[f"{label}_cpu_gb_s"] = size / statistics.median(r["cpu"]) / 1e9
        if "baseline" in runs:
            figures["paired_ratio"] = statistics.median(
                b / t for b, t in zip(runs["baseline"]["wall"], runs["this"]["wall"]))
            figures["paired_cpu_ratio"] = statistics.median(
                b / t for b, t in zip(runs["baseline"]["cpu"], runs["this"]["cpu"]))
        found[name] = figures
        line = (f"  {name}: {size / 1e9:.3f} GB: token phase {figures['this_s']:.3f} s = "
                f"{figures['this_gb_s']:.2f} GB/s ({figures['this_cpu_gb_s']:.2f} GB/s of CPU time)")
        if "baseline" in runs:
            line += (f"; baseline {figures['baseline_s']:.3f} s = {figures['baseline_gb_s']:.2f} GB/s "
                     f"({figures['baseline_cpu_gb_s']:.2f} of CPU); paired ratio baseline/this: wall "
                     f"{figures['paired_ratio']:.2f}, CPU {figures['paired_cpu_ratio']:.2f}")
        print(line)
    return found


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
    ap.add_argument("--workloads", default="bench", help=f"bench and any of {','.join(WORKLOADS)}")
    ap.add_argument("--baseline", default=None, help="another rlprobe checkout: token phases alternate with it")
    ap.add_argument("--no-stats", action="store_true", help="skip the statistics part (1.)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: the script runs, the figures mean nothing")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.ranks, args.pairs, args.rows, args.cols, args.repeat, args.jobs = 4, 2, 2, 4, 64, 1, 1
    unknown = set(args.workloads.split(",")) - set(WORKLOADS) - {"bench", ""}
    if unknown:
        ap.error(f"unknown workload(s) {sorted(unknown)}: expected bench or {', '.join(WORKLOADS)}")
    from rlprobe.checks.run import check_dump

    args.cache.mkdir(parents=True, exist_ok=True)
    figures: dict = {"load_average": os.getloadavg()}
    if not args.no_stats:
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
        figures.update(sql_s=sql, read_s=read, nonfinite=nan_row)

    tensors = args.cache / "tensors"
    nbytes = tensor_dump(tensors, args.pairs, args.rows, args.cols)
    warm = os.pathsep.join(str(d) for d in warm_dump(args.cache / "warm"))
    alternating = ", alternating with --baseline in processes of their own" if args.baseline else ""
    print(f"tensors, token phase beyond start-up (median of {args.repeat}{alternating}; bench: {args.pairs} "
          f"pairs of {args.rows} x {args.cols} float32), load average {os.getloadavg()[0]:.1f}:")
    workloads = token_workloads(args, tensors, nbytes, warm)
    token_s, rate = workloads["bench"]["this_s"], workloads["bench"]["this_gb_s"]
    kernel = kernel_speed(tensors, args.repeat)
    print(f"kernel alone, pairs in memory: 1 thread {kernel['kernel_1thread_gb_s']:.2f} GB/s "
          f"({kernel['kernel_1thread_cpu_gb_s']:.2f} GB/s of thread CPU time), 2 threads "
          f"{kernel['kernel_2threads_gb_s']:.2f} GB/s: scaling {kernel['kernel_scaling']:.2f} "
          f"(median of {args.repeat})")
    if args.baseline:  # the same, each version in a process of its own, alternating
        runs: dict[str, list[dict]] = {"this": [], "baseline": []}
        versions = {"this": Path(__file__).resolve().parent.parent, "baseline": Path(args.baseline).resolve()}
        for i in range(args.repeat):
            for label in (["this", "baseline"] if i % 2 == 0 else ["baseline", "this"]):
                runs[label].append(in_child(versions[label], "kernel_speed", str(tensors), "1"))
        paired = {k: statistics.median(t[k] / b[k] for t, b in zip(runs["this"], runs["baseline"]))
                  for k in ("kernel_1thread_gb_s", "kernel_1thread_cpu_gb_s", "kernel_2threads_gb_s")}
        kernel["paired_this_over_baseline"] = paired
        print("  paired with the baseline (this / baseline, median of "
              f"{args.repeat}): 1 thread {paired['kernel_1thread_gb_s']:.2f} (thread CPU time "
              f"{paired['kernel_1thread_cpu_gb_s']:.2f}), 2 threads {paired['kernel_2threads_gb_s']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({**figures, "token_s": token_s, "gb_per_s": rate, "workloads": workloads,
                                         **kernel}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

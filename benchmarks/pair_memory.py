"""Peak memory and throughput of the element-wise pair comparison (rlprobe.compare).

    python benchmarks/pair_memory.py                 # 4 GB per file: two float32 .npy of 1e9 elements
    python benchmarks/pair_memory.py --gb 0.5        # smaller files
    python benchmarks/pair_memory.py --kernel-only   # just the in-memory kernel benchmark

Part 1 (files): writes two float32 .npy files of --gb GB each, chunk by chunk, into a temp dir
on disk (--dir, default $TMPDIR), then compares them once per reading mode, each in a fresh
subprocess so that its peak RSS is its own:

  pread       run_pairs(io="pread"): chunks read with os.preadv into a reused buffer (default)
  mmap        run_pairs(io="mmap"): chunks read through np.load(mmap_mode='r'), pages dropped
              with madvise(MADV_DONTNEED) after each chunk
  pair_metrics  pair_metrics() on the two np.load(mmap_mode='r') memmaps, one thread (it
              drops the pages of each chunk, like io="mmap")
  naive-mmap  pair_metrics() on plain ndarray views of the two memmaps, so nothing drops the
              pages: what happens without care - mapped file pages stay resident

Each mode is run with a warm page cache (the files were just written or read) and, with
--cold, after evicting both files from the page cache (posix_fadvise DONTNEED). Reported:
peak RSS (/proc/self/status VmHWM of the child; ru_maxrss is printed too, but on Linux it
also carries the parent's peak over from before exec, so it is not the child's own), RSS before the comparison (interpreter,
numpy and the compiled kernels), elapsed seconds and throughput in GB/s of input bytes
(both files). The goal is a peak RSS under 500 MB.

Part 2 (kernel): in-memory float32 256x4096 pairs (identical / 1 % perturbed with NaN/inf
sprinkled in / all different), single thread: pair_metrics (the fused compiled kernel) against
a plain numpy multi-pass implementation of the same metrics (float64, explicit masks) and
against msprobe's own formulas (float32, no NaN semantics). Throughput in GB/s of input bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GB = 1e9


# --------------------------------------------------------------------------------------
# part 1: files


def write_pair(dirpath: Path, n: int, chunk: int = 1 << 24, seed: int = 0) -> tuple[Path, Path, int]:
    """Two float32 .npy files of n elements, written chunk by chunk; b differs from a here and there."""
    rng = np.random.default_rng(seed)
    pa, pb = dirpath / "a.npy", dirpath / "b.npy"
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False, "shape": (n,)}
    first_mismatch = int(n * 0.75) + 3
    with open(pa, "wb") as fa, open(pb, "wb") as fb:
        np.lib.format.write_array_header_2_0(fa, header)
        np.lib.format.write_array_header_2_0(fb, header)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            a = rng.standard_normal(e - s, dtype=np.float32)
            b = a.copy()
            if e > first_mismatch:
                lo = max(s, first_mismatch) - s
                b[lo::1000] *= np.float32(1.0001)
            fa.write(a.tobytes())
            fb.write(b.tobytes())
        fa.flush()
        fb.flush()
        os.fsync(fa.fileno())
        os.fsync(fb.fileno())
    return pa, pb, first_mismatch


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def vm_status(field: str) -> int:
    """A /proc/self/status field in bytes (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child(mode: str, pa: str, pb: str, workers: int) -> None:
    """One measurement, in its own process; prints a JSON line."""
    from rlprobe.comparison.executor import PairTask, run_pairs
    from rlprobe.comparison.pair_metrics import pair_metrics
    rss_before = vm_status("VmRSS")
    nbytes = os.path.getsize(pa) + os.path.getsize(pb)
    t0 = time.perf_counter()
    if mode == "naive-mmap":  # plain ndarray views of the maps: nothing drops the pages
        result = pair_metrics(np.load(pa, mmap_mode="r").view(np.ndarray), np.load(pb, mmap_mode="r").view(np.ndarray))
    elif mode == "pair_metrics":  # pair_metrics on the memmaps themselves (drops pages), one thread
        result = pair_metrics(np.load(pa, mmap_mode="r"), np.load(pb, mmap_mode="r"))
    else:
        result = run_pairs([PairTask(0, pa, pb)], workers=workers, io=mode)[0]
    elapsed = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    maxrss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    print(json.dumps({
        "mode": mode, "workers": workers if mode in ("pread", "mmap") else 1, "elapsed_s": elapsed, "gb_per_s": nbytes / GB / elapsed,
        "rss_before_mb": rss_before / 1e6, "peak_rss_mb": maxrss / 1e6, "vm_hwm_mb": vm_status("VmHWM") / 1e6,
        "result": result,
    }))


def run_child(mode: str, pa: Path, pb: Path, workers: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(pa), str(pb), "--workers", str(workers)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child {mode} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def files_part(args) -> list[dict]:
    n = int(round(args.gb * GB / 4))
    base = Path(args.dir) if args.dir else Path(tempfile.gettempdir())
    need = 2 * n * 4 * 1.05
    free = shutil.disk_usage(base).free
    if free < need:
        raise SystemExit(f"not enough disk in {base}: need {need / GB:.1f} GB, {free / GB:.1f} GB free; use a smaller --gb")
    work = Path(tempfile.mkdtemp(prefix="rlprobe-pair-memory-", dir=base))
    rows = []
    try:
        t0 = time.perf_counter()
        pa, pb, first = write_pair(work, n)
        print(f"wrote 2 x {n:,} float32 ({2 * n * 4 / GB:.2f} GB) to {work} in {time.perf_counter() - t0:.1f} s; "
              f"first mismatch at {first:,}", flush=True)
        temps = ["cold", "warm"] if args.cold else ["warm"]
        for mode in args.modes.split(","):
            for temp in temps:
                if temp == "cold":
                    evict(pa)
                    evict(pb)
                r = run_child(mode, pa, pb, args.workers)
                r["cache"] = temp
                assert r["result"]["first_mismatch_index"] == first, r["result"]
                assert r["result"]["numel"] == n
                rows.append(r)
                print(f"{mode:>12} {temp:>4} cache, {r['workers']} thread(s): {r['elapsed_s']:6.2f} s "
                      f"{r['gb_per_s']:5.2f} GB/s  peak RSS {r['peak_rss_mb']:7.1f} MB (VmHWM {r['vm_hwm_mb']:7.1f}, "
                      f"before compare {r['rss_before_mb']:5.1f})  "
                      f"{'OK' if r['peak_rss_mb'] < 500 else 'OVER 500 MB'}", flush=True)
        res = rows[0]["result"]
        print(f"result: equal {res['equal_count']:,}/{res['numel']:,}, first mismatch {res['first_mismatch_index']:,}, "
              f"max rel {res['max_rel_err']:.3g}, cosine {res['cosine']!r}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return rows


# --------------------------------------------------------------------------------------
# part 2: the kernel in memory


def numpy_multipass(a: np.ndarray, b: np.ndarray) -> dict:
    """The same metrics as pair_metrics, with plain numpy (float64, explicit masks, many passes)."""
    x = a.astype(np.float64).ravel()
    y = b.astype(np.float64).ravel()
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    equal = (x == y) | (nan_x & nan_y)
    nan_mis = nan_x ^ nan_y
    numeric = ~equal & ~nan_mis
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        m = np.maximum(np.abs(x), np.abs(y))
        d = np.abs(x - y)
        inf_case = numeric & np.isinf(m)
        fin_case = numeric & ~inf_case
        rel = np.where(fin_case, d / np.where(fin_case, m, 1.0), 0.0)
    rel = np.where(inf_case, np.where(np.isinf(x) & np.isinf(y), 2.0, 1.0), rel)
    mism = ~equal
    max_abs = math.inf if inf_case.any() else float(np.max(d, where=fin_case, initial=0.0))
    w3 = equal | (fin_case & (d <= 1e-3 * m))
    w2 = equal | (fin_case & (d <= 1e-2 * m))
    fin = np.isfinite(x) & np.isfinite(y)
    xf, yf = x[fin], y[fin]
    dot, sa, sb = float(xf @ yf), float(xf @ xf), float(yf @ yf)
    return {
        "numel": x.size, "equal_count": int(equal.sum()),
        "first_mismatch_index": int(np.argmax(mism)) if mism.any() else None,
        "max_abs_err": max_abs, "max_rel_err": float(rel.max()),
        "within_1e3_count": int(w3.sum()), "within_1e2_count": int(w2.sum()),
        "cosine": dot / math.sqrt(sa * sb) if sa and sb else None, "nan_mismatch_count": int(nan_mis.sum()),
    }


def msprobe_formulas(array1: np.ndarray, array2: np.ndarray) -> dict:
    """msprobe 8.1.2 compare_arrays (benchmarks/MSPROBE_NOTES.md), in the stored dtype."""
    abs_error = np.abs(array1 - array2)
    max_abs_error = np.max(abs_error)
    with np.errstate(divide="ignore", invalid="ignore"):
        relative_error = np.abs(array1 - array2) / np.maximum(np.abs(array1), np.abs(array2))
    relative_error = np.nan_to_num(relative_error)
    same = np.sum(array1 == array2)
    mismatch = np.nonzero(array1.flatten() != array2.flatten())[0]
    thr3 = 0.001 * np.maximum(np.abs(array1), np.abs(array2))
    thr2 = 0.01 * np.maximum(np.abs(array1), np.abs(array2))
    return {"same": same, "first": mismatch[0] if mismatch.size else None, "max_abs": max_abs_error,
            "max_rel": np.max(relative_error), "w3": np.sum(abs_error <= thr3), "w2": np.sum(abs_error <= thr2)}


def best_time(fn, repeat: int) -> float:
    fn()
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def kernel_part(args) -> list[dict]:
    from rlprobe.comparison.pair_metrics import pair_metrics
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 4096), dtype=np.float32)
    perturbed = a.copy()
    sel = rng.random(a.shape) < 0.01
    perturbed[sel] *= np.float32(1.001)
    perturbed.flat[::100_003] = np.nan
    perturbed.flat[7::200_003] = np.inf
    cases = {"identical": a.copy(), "1% perturbed + NaN/inf": perturbed,
             "all different": rng.standard_normal((256, 4096), dtype=np.float32)}
    nbytes = a.nbytes * 2
    rows = []
    print(f"\nkernel, in memory, float32 256x4096 pair ({nbytes / 1e6:.1f} MB of input), 1 thread, best of {args.repeat}:")
    for name, b in cases.items():
        ours = pair_metrics(a, b)
        ref = numpy_multipass(a, b)
        for k in ("equal_count", "first_mismatch_index", "max_abs_err", "max_rel_err", "within_1e3_count",
                  "within_1e2_count", "nan_mismatch_count"):
            assert ours[k] == ref[k], (name, k, ours[k], ref[k])
        t_ours = best_time(lambda: pair_metrics(a, b), args.repeat)
        t_np = best_time(lambda: numpy_multipass(a, b), max(3, args.repeat // 4))
        t_ms = best_time(lambda: msprobe_formulas(a, b), max(3, args.repeat // 4))
        row = {"case": name, "rlprobe_ms": t_ours * 1e3, "rlprobe_gb_s": nbytes / GB / t_ours,
               "numpy_multipass_ms": t_np * 1e3, "numpy_multipass_gb_s": nbytes / GB / t_np,
               "msprobe_formulas_ms": t_ms * 1e3, "msprobe_formulas_gb_s": nbytes / GB / t_ms}
        rows.append(row)
        print(f"  {name:>24}: rlprobe {row['rlprobe_ms']:6.2f} ms ({row['rlprobe_gb_s']:5.2f} GB/s) | numpy multi-pass "
              f"{row['numpy_multipass_ms']:6.2f} ms ({row['numpy_multipass_gb_s']:5.2f} GB/s, x{t_np / t_ours:.1f}) | "
              f"msprobe formulas (f32) {row['msprobe_formulas_ms']:6.2f} ms ({row['msprobe_formulas_gb_s']:5.2f} GB/s, "
              f"x{t_ms / t_ours:.1f})")
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        p = argparse.ArgumentParser()
        p.add_argument("--child", nargs=3)
        p.add_argument("--workers", type=int, default=2)
        ns = p.parse_args()
        child(ns.child[0], ns.child[1], ns.child[2], ns.workers)
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=4.0, help="size of EACH float32 file in GB (default 4 = 1e9 elements)")
    p.add_argument("--dir", default=None, help="where to write the files (default: the temp dir)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--modes", default="pread,mmap,pair_metrics,naive-mmap")
    p.add_argument("--cold", action="store_true", help="also run each mode after evicting the files from the page cache")
    p.add_argument("--keep", action="store_true", help="keep the files")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--kernel-only", action="store_true")
    p.add_argument("--files-only", action="store_true")
    p.add_argument("--json", default=None, help="write all figures to this file")
    args = p.parse_args()
    out = {}
    if not args.kernel_only:
        out["files"] = files_part(args)
    if not args.files_only:
        out["kernel"] = kernel_part(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()

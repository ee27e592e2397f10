"""The Triton gradient kernel alone (issue 17): its time and GB/s per launch shape, against the
device's copy bandwidth measured in the same run.

    python benchmarks/grad_kernel_sweep.py                     # on a GPU: the MLP's and the decoder's gradients
    TRITON_INTERPRET=1 python benchmarks/grad_kernel_sweep.py --device cpu --smoke   # checks the script

Gradients: float32 tensors (randn, every 7th element 0) shaped like the parameters of
benchmarks/grad_gpu_overhead.py's workloads (mlp: 537M elements in 64 tensors; decoder: 953M in
147). For every launch shape (BLOCK elements a tile, x num_warps; a program reads 16 tiles), the
two kernels of an L2 step (bounds -1, 0, 1, packed signs) are timed alone with CUDA events over
--iters launches after one that compiles; GB/s = (gradient bytes read + sign bytes written) /
time. The copy bandwidth is a device-to-device copy of as many bytes (read + write counted).
Every shape's stats and signs are checked against the shipped shape's (counts, signs, max, min
exactly; norms to 1e-6). For the shipped shape also: L1; the whole `launch` (kernels and the copy
of stats and signs to a pinned host slot) and the torch-ops fallback (torch_grads._launch_device,
with its copy), each timed on the wall clock from the call until the device is idle, one launch
at a time, and the training thread's own time to issue each. Prints tables
and one JSON line (`--json FILE` writes it too). Under the interpreter the times mean nothing:
the run only checks the script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grad_gpu_overhead import DECODER, DECODER_SMOKE, make_decoder, make_model  # noqa: E402

from rlprobe.frameworks import torch_grads, triton_grad_kernel  # noqa: E402

BOUNDS = [-1.0, 0.0, 1.0]
TILES = 16  # tiles a program reads (CHUNK = TILES * BLOCK)


# --smoke: the same architectures, tiny enough for the interpreter (~1,000 and ~4,000 elements)
MLP_TINY = (1, 16, 32)
DECODER_TINY = {**DECODER_SMOKE, "layers": 1, "dim": 16, "heads": 2, "ffn": 32, "vocab": 32}


def shapes(workload: str, smoke: bool) -> list[tuple[int, ...]]:
    """Parameter shapes, from a model built on the meta device (no memory)."""
    if workload == "mlp":
        model = make_model(*MLP_TINY, "meta") if smoke else make_model(16, 2048, 8192, "meta")
    else:
        model = make_decoder(DECODER_TINY if smoke else DECODER, "meta")
    return [tuple(p.shape) for p in model.parameters()]


def make_grads(dims: list[tuple[int, ...]], device: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    grads = []
    for shape in dims:
        g = torch.randn(shape, device=device).reshape(-1)
        g[::7] = 0.0
        grads.append(g)
    return grads


class Timer:
    """Milliseconds per call of fn: CUDA events around `iters` calls, or the wall clock on the CPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], object], iters: int) -> float:
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters


def host_ms(fn: Callable[[], Callable[[], object]], iters: int, timer: Timer) -> tuple[float, float]:
    """(the calling thread's median time to issue fn, the median time until fn's device work and
    copies, on every stream, are done), one launch at a time: each launch's host slot is given
    back before the next, as the writer thread does."""
    issue, done = [], []
    for _ in range(iters):
        timer.sync()
        t0 = time.perf_counter()
        finish = fn()
        issue.append((time.perf_counter() - t0) * 1e3)
        timer.sync()
        done.append((time.perf_counter() - t0) * 1e3)
        release(finish())
    return statistics.median(issue), statistics.median(done)


def release(batch) -> None:
    if getattr(batch, "release", None) is not None:
        batch.release()


def results(kernel: triton_grad_kernel.GradStatsKernel, flats, n: int) -> tuple[np.ndarray, np.ndarray]:
    lay = kernel._layout
    raw = lay.payload.cpu().numpy()
    return raw[: n * lay.k * 8].view(np.float64).reshape(n, lay.k).copy(), raw[n * lay.k * 8:].copy()


def agree(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    (sa, ga), (sb, gb) = a, b
    return (np.array_equal(ga, gb) and np.array_equal(sa[:, [0, 1, 3, 4, 5, 6]], sb[:, [0, 1, 3, 4, 5, 6]])
            and np.allclose(sa[:, 2], sb[:, 2], rtol=1e-6))


def sweep_workload(name: str, args: argparse.Namespace, timer: Timer) -> dict:
    flats = make_grads(shapes(name, args.smoke), args.device)
    n = len(flats)
    elements = sum(f.numel() for f in flats)
    read = sum(f.numel() * f.element_size() for f in flats)
    sign_bytes = sum((f.numel() + 7) // 8 for f in flats)
    moved = read + sign_bytes
    # the device's copy bandwidth over as many bytes
    src = torch.empty(read, dtype=torch.uint8, device=args.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_ms = timer(lambda: dst.copy_(src), args.iters)
    copy_gbps = 2 * read / copy_ms / 1e6
    del src, dst
    out: dict = {"tensors": n, "elements": elements, "gradient_bytes": read, "sign_bytes": sign_bytes,
                 "copy_ms": copy_ms, "copy_gbps": copy_gbps, "shapes": []}
    default = triton_grad_kernel.GradStatsKernel()
    default.run_kernels(flats, BOUNDS)
    reference = results(default, flats, n)
    for block in args.blocks:
        for warps in args.warps:
            kernel = triton_grad_kernel.GradStatsKernel(block=block, chunk=TILES * block, num_warps=warps)
            t0 = time.perf_counter()
            kernel.run_kernels(flats, BOUNDS)  # compiles this shape
            timer.sync()
            compile_s = time.perf_counter() - t0
            ms = timer(lambda: kernel.run_kernels(flats, BOUNDS), args.iters)
            same = agree(results(kernel, flats, n), reference)
            out["shapes"].append({"block": block, "warps": warps, "ms": ms, "gbps": moved / ms / 1e6,
                                  "of_copy": moved / ms / 1e6 / copy_gbps, "agrees": same,
                                  "first_call_s": compile_s})
            print(f"  {name}: BLOCK {block:5d} x {warps:2d} warps  {ms:8.3f} ms  {moved / ms / 1e6:8.1f} GB/s  "
                  f"({100 * moved / ms / 1e6 / copy_gbps:5.1f}% of copy)  {'agrees' if same else 'DIFFERS'}  "
                  f"(first call {compile_s:.1f} s)", flush=True)
    best = min(out["shapes"], key=lambda r: r["ms"])
    out["best"] = {k: best[k] for k in ("block", "warps", "ms", "gbps", "of_copy")}
    # the shipped shape: L2 alone, L1 alone, whole launches and the torch-ops fallback
    out["shipped"] = {"block": triton_grad_kernel.BLOCK, "warps": triton_grad_kernel.NUM_WARPS,
                      "L2_kernels_ms": timer(lambda: default.run_kernels(flats, BOUNDS), args.iters)}
    l1 = triton_grad_kernel.GradStatsKernel()
    l1.run_kernels(flats, None)
    out["shipped"]["L1_kernels_ms"] = timer(lambda: l1.run_kernels(flats, None), args.iters)
    device = torch.device(args.device)
    triton_launch = lambda: default.launch(flats, BOUNDS)[0]  # noqa: E731
    torch_launch = lambda: torch_grads._launch_device(flats, "L2", BOUNDS, device)[0]  # noqa: E731
    for label, fn in (("triton", triton_launch), ("torch ops", torch_launch)):
        release(fn()())  # warm (the torch path makes its pinned buffers once)
        issue, done = host_ms(fn, args.iters, timer)
        out["shipped"][f"{label} L2 launch+copy ms"] = done
        out["shipped"][f"{label} L2 issue ms (host)"] = issue
    del flats
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workloads", default="mlp,decoder")
    ap.add_argument("--blocks", default="1024,2048,4096")
    ap.add_argument("--warps", default="4,8,16")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="tiny models' shapes, small blocks (checks the script)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with TRITON_INTERPRET=1 ... --device cpu --smoke to check the script")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("--device cpu runs the kernels under the Triton interpreter: set TRITON_INTERPRET=1")
    if args.smoke:
        args.blocks, args.warps, args.iters = "16,32", "1", 1
    args.blocks = [int(b) for b in args.blocks.split(",")]
    args.warps = [int(w) for w in args.warps.split(",")]
    timer = Timer(args.device)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu (Triton interpreter)"
    print(f"{device}: Triton gradient kernel, L2 (3 bounds, signs), float32 gradients", flush=True)
    report = {"device": device, "triton": __import__("triton").__version__, "workloads": {}}
    for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        r = report["workloads"][name] = sweep_workload(name, args, timer)
        s, best = r["shipped"], r["best"]
        print(f"\n{name}: {r['elements'] / 1e6:.0f}M elements in {r['tensors']} tensors "
              f"({r['gradient_bytes'] / 1e9:.2f} GB read, {r['sign_bytes'] / 1e6:.1f} MB of signs written)")
        print(f"  device-to-device copy         {r['copy_ms']:8.3f} ms  {r['copy_gbps']:8.1f} GB/s (read + write)")
        print(f"  best shape: BLOCK {best['block']} x {best['warps']} warps  {best['ms']:8.3f} ms  "
              f"{best['gbps']:8.1f} GB/s ({100 * best['of_copy']:.1f}% of copy)")
        print(f"  shipped shape BLOCK {s['block']} x {s['warps']} warps: L2 kernels {s['L2_kernels_ms']:.3f} ms, "
              f"L1 kernels {s['L1_kernels_ms']:.3f} ms")
        for label in ("triton", "torch ops"):
            print(f"  {label:9s} L2 launch + copy to host {s[f'{label} L2 launch+copy ms']:8.3f} ms until the device "
                  f"is idle, {s[f'{label} L2 issue ms (host)']:7.3f} ms of it to issue on the training thread")
    line = json.dumps(report)
    print(line)
    if args.json:
        Path(args.json).write_text(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

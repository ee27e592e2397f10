"""Gradient probe cost on a GPU (issue 4): the plain training step vs rlprobe L1 and L2 monitoring.

    python benchmarks/grad_gpu_overhead.py                      # the issue's workload (needs ~25 GB of GPU memory)
    python benchmarks/grad_gpu_overhead.py --device cpu --smoke  # a tiny model, to check the script itself

Workload (issue 4, "Speed", GPU): nn.Sequential of 16 blocks Linear(2048, 8192) -> GELU ->
Linear(8192, 2048) (537M parameters, float32 master weights), bf16 autocast, AdamW, a batch of
8192 x 2048 and an MSE loss. One step = zero_grad(set_to_none=True), forward, backward,
optimizer.step(), then `probe.step()` where a probe runs. Every step ends with
torch.cuda.synchronize(), so a step's wall time includes all device work it queued.

Modes, alternating in one process on the same model and optimizer (the step time does not
depend on the values): plain; rlprobe L1 and L2 through the full product path: a Probe in a
temporary directory, `probe.monitor_grads(model, optimizer=opt, name="mlp", level=...,
bounds=[-1, 0, 1])`, stats Parquet parts and one signs.npy per step written by the background
writer, and `close()` timed separately. Per mode: `--warmup` steps, then `--steps` timed steps;
the median step of each run, then the median over `--repeat` repetitions. Targets: L2 adds at
most 5 %, L1 at most 3 % to the plain step (msprobe 8.1.2 L2: 55 ms -> 4,756 ms on an H200).
Prints a table and one JSON line (`--json FILE` writes it too).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import rlprobe


def make_model(layers: int, width: int, hidden: int, device: str) -> torch.nn.Module:
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, width)]
    return torch.nn.Sequential(*blocks).to(device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(mode: str, model, opt, x, target, args, tmp: Path) -> dict:
    probe = None
    dump = tmp / f"dump-{mode}-{time.monotonic_ns()}"
    if mode != "plain":
        probe = rlprobe.Probe(dump, rank=0, world_size=1)
        probe.monitor_grads(model, optimizer=opt, name="mlp", level=mode, bounds=[-1.0, 0.0, 1.0])
    autocast = torch.autocast(device_type=x.device.type, dtype=torch.bfloat16)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast:
            out = model(x)
        loss = (out.float() - target).pow(2).mean()
        loss.backward()
        opt.step()
        if probe is not None:
            probe.step()
        sync(args.device)

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    result = {"step_ms": statistics.median(times) * 1e3}
    if probe is not None:
        t0 = time.perf_counter()
        probe.close()
        result["close_ms"] = (time.perf_counter() - t0) * 1e3
        signs = list(dump.rglob("signs.npy"))
        result["sign_bytes_per_step"] = sum(f.stat().st_size for f in signs) / max(1, len(signs))
        result["dump_bytes"] = sum(f.stat().st_size for f in dump.rglob("*") if f.is_file())
        shutil.rmtree(dump, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--levels", default="L1,L2")
    ap.add_argument("--smoke", action="store_true", help="a tiny model and few steps (checks the script)")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.layers, args.width, args.hidden, args.batch = 2, 64, 128, 32
        args.steps, args.warmup, args.repeat = 3, 1, 1
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu --smoke to check the script")
    torch.manual_seed(0)
    model = make_model(args.layers, args.width, args.hidden, args.device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=args.device)
    target = torch.randn(args.batch, args.width, device=args.device)
    modes = ["plain", *[m.strip() for m in args.levels.split(",") if m.strip()]]
    tmp = Path(tempfile.mkdtemp(prefix="grad-gpu-", dir=args.tmp))
    res: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        for r in range(args.repeat):
            for mode in modes:
                res[mode].append(run(mode, model, opt, x, target, args, tmp))
            print(f"rep {r}: " + ", ".join(f"{m} {res[m][-1]['step_ms']:.1f} ms" for m in modes), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    plain = statistics.median(x["step_ms"] for x in res["plain"])
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    summary = {"device": device, "params": params, "plain_step_ms": plain}
    print(f"\n{device}: MLP {args.layers} x ({args.width}->{args.hidden}->{args.width}), {params / 1e6:.0f}M "
          f"parameters, bf16 autocast, AdamW, batch {args.batch}x{args.width}; medians of {args.repeat} repetitions "
          f"of {args.steps} steps")
    print(f"  plain        {plain:9.1f} ms/step")
    for mode in modes[1:]:
        ms = statistics.median(x["step_ms"] for x in res[mode])
        close = statistics.median(x["close_ms"] for x in res[mode])
        added = 100 * (ms / plain - 1)
        goal = {"L1": 3, "L2": 5}.get(mode)
        summary[mode] = {"step_ms": ms, "added_pct": added, "close_ms": close,
                         "sign_bytes_per_step": res[mode][0]["sign_bytes_per_step"]}
        print(f"  rlprobe {mode}   {ms:9.1f} ms/step  {added:+.1f}%" + (f" (goal <= {goal}%)" if goal else "")
              + f"  close {close:.0f} ms, signs {res[mode][0]['sign_bytes_per_step'] / 1e6:.1f} MB a step")
    line = json.dumps({"summary": summary, "runs": res})
    print(line)
    if args.json:
        Path(args.json).write_text(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

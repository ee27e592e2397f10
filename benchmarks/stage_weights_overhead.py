"""What the weights at a module dump (docs/modules.md, "Weights at the call") cost: the bundled PPO
example's actor (examples/ppo/config.yaml's model) in `actor_update` and `actor_compute_log_prob`
blocks of one probe, with `weights=True` and `weights=False` alternating block by block in the same
run (which goes first alternates too), paired medians.

    python benchmarks/stage_weights_overhead.py [--repeat 200] [--tensors]

A block's time runs from entering `probe.stage` to leaving it: the forward (and for actor_update the
loss's backward) with the dump's hooks, and with weights the fingerprints (on the CPU computed in
the block's thread). The writer thread's work (rows, files) is off the training thread
and not in the figure; it is drained at each step. The machine is shared: read the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import rlprobe
from rlprobe.demo import load_config, load_example_module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=200, help="blocks per stage and setting")
    ap.add_argument("--tensors", action="store_true", help="module tensors as .npy as well")
    args = ap.parse_args()
    ppo = load_example_module()
    cfg = load_config()
    m = cfg["model"]
    torch.set_num_threads(1)  # as the example runs
    torch.manual_seed(0)
    max_len = m["prompt_len"] + m["response_len"]
    actor = ppo.TinyLM(m["vocab"], m["d_model"], m["layers"], m["heads"], max_len, m["vocab"])
    seq = torch.randint(0, m["vocab"], (cfg["ppo"]["batch_size"] // cfg["ppo"]["micro_batches"], max_len))
    times: dict[tuple[str, bool], list[float]] = {}
    out = Path(tempfile.mkdtemp(prefix="rlprobe-stage-weights-"))
    try:
        with rlprobe.Probe(out / "dump") as probe:
            for rep in range(args.repeat):
                for weights in ((True, False) if rep % 2 == 0 else (False, True)):
                    for stage in ("actor_compute_log_prob", "actor_update"):
                        t0 = time.perf_counter()
                        with probe.stage(stage, model=actor, tensors=args.tensors, weights=weights):
                            if stage == "actor_update":
                                ppo.token_log_probs(actor, seq, m["prompt_len"]).mean().backward()
                            else:
                                with torch.no_grad():
                                    ppo.token_log_probs(actor, seq, m["prompt_len"])
                        times.setdefault((stage, weights), []).append(time.perf_counter() - t0)
                probe.step()
        rows = probe_rows(out / "dump")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    params = sum(1 for _ in actor.parameters())
    print(f"actor: {params} parameter tensors, {sum(p.numel() for p in actor.parameters())} elements; "
          f"{args.repeat} blocks per stage and setting; tensors={args.tensors}; weight rows written: {rows}")
    for stage in ("actor_compute_log_prob", "actor_update"):
        on, off = statistics.median(times[(stage, True)]), statistics.median(times[(stage, False)])
        print(f"{stage:24s} weights on {on * 1e3:7.3f} ms  off {off * 1e3:7.3f} ms  ratio {on / off:.3f} "
              f"(+{(on - off) * 1e3:.3f} ms)")


def probe_rows(path: Path) -> int:
    return rlprobe.open(path).arrow("module_param").num_rows


if __name__ == "__main__":
    main()

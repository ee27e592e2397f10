"""The figures behind the default tolerances (docs/compare.md, "Tolerances"): the PPO example on this
CPU against the same run on the simulated second device of tests/second_device.py (every nn.Linear
accumulated in float64), clean and with each planted fault. Prints, per comparison, the first divergence
and, per key, the largest max-norm relative error max|a-b| / max(|a|inf, |b|inf) and the share of its
tolerance the noise used.

    PYTHONPATH=. python benchmarks/tolerance_noise.py --steps 3 --out /tmp/tolerance_noise
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

FAULTS = ("advantage-bug", "ref-bf16", "sampling-seed", "lr", "rollout-bf16", "stale-rollout-weights",
          "nondeterministic")


def main() -> None:
    import rlprobe
    from ppo_runs import train
    from second_device import train_on_second_device

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="/tmp/tolerance_noise")
    args = ap.parse_args()
    out = Path(args.out)
    settings = {"ppo.steps": args.steps, "rlprobe_config.grads_dump": False,
                "rlprobe_config.param_fingerprints": False}
    one = train(out / "one", None, **settings)
    for name, fault in (("noise", None), *((f, f) for f in FAULTS)):
        run = train_on_second_device(out / name, fault, **settings)
        summary = rlprobe.compare(one, run, out / f"compare-{name}", reports=False)
        first = summary["first_divergence"]
        print(f"\n{name}: first divergence", "none" if first is None else
              f"{first['key']} step {first['step']} {first['status']} (max-norm rel err {first['norm_rel_err']})")
        rows = pq.read_table(out / f"compare-{name}" / "key_data.parquet").to_pylist()
        tolerance = {k["key"]: (k["rtol"], k["atol"]) for k in summary["keys"]}
        worst: dict[str, tuple[float, float]] = {}
        for r in rows:
            rtol, atol = tolerance.get(r["key"], (None, None))
            if r["max_abs_err"] is None or rtol is None:
                continue
            scale = max(abs(r[c]) for c in ("min_a", "max_a", "min_b", "max_b") if r[c] is not None)
            used = r["max_abs_err"] / (atol + rtol * scale) if atol + rtol * scale else 0.0
            err, share = worst.get(r["key"], (0.0, 0.0))
            worst[r["key"]] = (max(err, r["norm_rel_err"] or 0.0), max(share, used))
        for key, (err, share) in worst.items():
            print(f"  {key:20s} max-norm rel err {err:.3g}   tolerance used {share:.3g}")


if __name__ == "__main__":
    main()

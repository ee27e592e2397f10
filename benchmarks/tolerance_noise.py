"""The figures behind the default tolerances (docs/across-devices.md, "Tolerances"): the PPO example on this
CPU against the same run on the simulated second device of tests/second_device.py (every nn.Linear
accumulated in float64), clean and with each planted fault. Prints, per comparison, the first divergence
and, per key, the largest max-norm relative error max|a-b| / max(|a|inf, |b|inf) and the share of its
tolerance the noise used.

    PYTHONPATH=. python benchmarks/tolerance_noise.py --steps 3 --out /tmp/tolerance_noise

With --draws N, instead: the measurement behind the control run's factor (docs/across-devices.md, "A control
run"): N independent noise draws of one kind (tests/second_device.py: the products of every nn.Linear summed
in an order drawn per call, seeds 1..N; and with such an order, inputs rounded to 14 mantissa bits, or
to TF32's 10) each compared with run A; per (key, step), the largest max-norm error of each draw;
printed, per kind, how far one draw's error exceeds another's (the ratio e_j / e_i over every pair of
draws i != j): its quantiles and largest, over all (key, step) and over those where e_j is beyond the
float32 tolerance (where the envelope decides). Steps from the first where a draw's tokens part from
A's are left out (the control run's envelope stops there too).

    PYTHONPATH=. python benchmarks/tolerance_noise.py --steps 3 --draws 5 --out /tmp/envelope_factor
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
    ap.add_argument("--draws", type=int, default=0, help="measure the control run's factor with this many draws")
    args = ap.parse_args()
    out = Path(args.out)
    settings = {"ppo.steps": args.steps, "rlprobe_config.grads_dump": False,
                "rlprobe_config.param_fingerprints": False}
    one = train(out / "one", None, **settings)
    if args.draws:
        envelope_factor(one, out, args.draws, settings)
        return
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


def draw_errors(one: Path, run: Path, out: Path) -> dict[tuple[str, int], float]:
    """Per (key, step) of float keys, the largest max-norm relative error of `run` against `one`, before the
    first step whose tokens differ."""
    import rlprobe
    from rlprobe.comparison.tolerance import FAMILIES

    rlprobe.compare(one, run, out, reports=False)
    rows = pq.read_table(out / "key_data.parquet").to_pylist()
    parted = min((r["step"] for r in rows if r["key"] in FAMILIES["tokens"] and r["status"] != "match"),
                 default=None)
    worst: dict[tuple[str, int], float] = {}
    for r in rows:
        if r["norm_rel_err"] is not None and (r["dtype_a"] or "").startswith("float") and (
                parted is None or r["step"] < parted):
            worst[(r["key"], r["step"])] = max(worst.get((r["key"], r["step"]), 0.0), r["norm_rel_err"])
    return worst


def envelope_factor(one: Path, out: Path, draws: int, settings: dict) -> None:
    from second_device import train_on_second_device

    from rlprobe.comparison.tolerance import default_rtol

    tolerance = default_rtol("float32")
    for kind, device in (("reduction order", {}), ("14 mantissa bits + reduction order", {"mantissa_bits": 14}),
                         ("TF32 + reduction order", {"mantissa_bits": 10})):
        errors = []
        for seed in range(1, draws + 1):
            name = f"{'-'.join(f'{k}{v}' for k, v in device.items()) or 'float32'}-{seed}"
            run = train_on_second_device(out / name, None, device={**device, "order_seed": seed}, **settings)
            errors.append(draw_errors(one, run, out / f"compare-{name}"))
        ratios, beyond = [], []
        for i, e_i in enumerate(errors):
            for j, e_j in enumerate(errors):
                if i == j:
                    continue
                for where, err in e_j.items():
                    if err > 0 and e_i.get(where):
                        ratios.append(err / e_i[where])
                        if err > tolerance:
                            beyond.append((err / e_i[where], where))
        ratios.sort()
        beyond.sort()

        def q(values: list[float], p: float) -> float:
            return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")

        print(f"\n{kind}: {draws} draws, {len(ratios)} ratios e_j/e_i (key, step, pair of draws)")
        print(f"  all: median {q(ratios, 0.5):.3g}, 90% {q(ratios, 0.9):.3g}, 99% {q(ratios, 0.99):.3g}, "
              f"largest {ratios[-1] if ratios else float('nan'):.3g}")
        values = [r for r, _ in beyond]
        print(f"  e_j beyond float32's tolerance {tolerance:.3g}: {len(values)} ratios; median {q(values, 0.5):.3g}, "
              f"90% {q(values, 0.9):.3g}, largest {values[-1] if values else float('nan'):.3g}"
              + (f" ({beyond[-1][1][0]} step {beyond[-1][1][1]})" if beyond else ""))
        largest = {}
        for r, (key, _) in beyond:
            largest[key] = max(largest.get(key, 0.0), r)
        for key, r in sorted(largest.items(), key=lambda kv: -kv[1]):
            print(f"    {key:20s} largest ratio {r:.3g}")


if __name__ == "__main__":
    main()

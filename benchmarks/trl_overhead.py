"""What rlprobe's TRL integration adds to a TRL step (issue 15: <= 5 % at key-data level).

    python benchmarks/trl_overhead.py                     # key data, 9 repetitions (about 2 minutes)
    python benchmarks/trl_overhead.py --level grads       # key data + gradient monitor (L1)
    python benchmarks/trl_overhead.py --smoke             # one short repetition (the test suite runs it)
    python benchmarks/trl_overhead.py --writers           # plain / attach (writer thread) / writer process, paired
    python benchmarks/trl_overhead.py --interleave        # probe on and off by turns within each run (low noise)

Workload: examples/trl_grpo's configuration (GRPOTrainer, the tiny Qwen2 built in code, 2
micro-batches of 4 completions of up to 8 tokens a step, beta 0.04 so the reference model
runs too), on the CPU. Each repetition trains twice in this process, plain and with
`attach(trainer, cfg)`, in alternating order; `--level key_data` switches on key data,
configs and TRL's metrics (rlprobe_config key_data_dump, configurations_dump, metrics_dump),
`--level grads` adds grads_dump; `--stats-only` keeps statistics without tensor files. A step's
time is the interval between TRL's consecutive
`on_step_begin` callbacks, so it holds generation, rewards, reference forward, both
micro-batches' forward and backward, the optimizer step, TRL's logging and everything rlprobe
does in them (its save calls, probe.step(), log_metrics). The first `--warmup` steps and the
last one (which ends in close()) are not timed. Per run the median step and the mean step; the
table gives the medians over repetitions and the median of each repetition's probe/plain ratio
(paired), of medians and of means. The writer takes the deferred work of a flush_interval (1 s,
~12 steps) in one go, so its cost falls on some steps more than others: the mean holds it all,
the median may not. Read both; the issue's goal is stated on the paired medians.
Before each run it waits (up to --idle-timeout s) for the CPU to be --min-idle idle for 1 s.

`--interleave`: separate runs differ by more than the probe costs (this VM's step time moves between
~55 and ~105 ms for seconds at a time, within one run and between runs), so the probe is instead
switched on and off by turns within each run and its steps compared with the steps beside them,
in ABBA cycles (on, off, off, on blocks: a drift that is linear over a cycle cancels). The probe
stays attached for the whole run; on an "off" step the benchmark sends every wrapped trainer
method straight to TRL's own and skips the probe's step callback, so nothing of rlprobe runs in
it (tests/integrations/test_trl_benchmark.py checks that the dump holds exactly the on steps).
The writer works once per flush_interval (1 s, ~13-16 steps here), after the steps whose rows it
writes, so where its work lands decides what a variant measures. One run of each a repetition:
- `alternating`: a step at a time. The training thread's share (save calls, staging, the
  wrappers), and about half of the writer's work: the rest lands on off steps.
- `steady` (the goal's figure): blocks of --steady-block steps (32), the first half of each left
  out, so that a measured on step has the writer in its steady state behind it and a measured off
  step has none of it left: the probe as a whole run would have it.
- `drained`: blocks of --block steps (12) whose last on step ends in probe.flush(), which waits
  until everything saved is written: all of the probe's work in on steps, serialised where it
  would run beside training: an upper bound.
Each figure is the median over all cycles of all repetitions of a cycle's on/off time ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "trl_grpo" / "train_grpo.py"
WRITER_PROCESS = "RLPROBE_WRITER_PROCESS"
LEVELS = {
    "key_data": {"key_data_dump": True, "configurations_dump": True, "metrics_dump": True},
    "grads": {"key_data_dump": True, "configurations_dump": True, "metrics_dump": True, "grads_dump": True},
}


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_idle_share(interval: float = 1.0) -> float:
    """Share of CPU time idle over `interval` seconds, from /proc/stat (1.0 where unavailable)."""
    def read() -> list[int] | None:
        try:
            return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None

    a = read()
    time.sleep(interval)
    b = read()
    if a is None or b is None:
        return 1.0
    delta = [y - x for x, y in zip(a, b)]
    return (delta[3] + delta[4]) / max(sum(delta), 1)


def wait_idle(min_idle: float, timeout: float) -> float:
    t0 = time.perf_counter()
    while min_idle > 0:
        share = cpu_idle_share()
        if share >= min_idle or time.perf_counter() - t0 > timeout:
            break
    return time.perf_counter() - t0


def _helper_cpu() -> float:
    """CPU seconds of this process's rlprobe writer process so far (0 where there is none)."""
    process = getattr(sys.modules.get("rlprobe.capture.writer_process"), "_process", None)
    try:
        fields = Path(f"/proc/{process.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (AttributeError, OSError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_run(ex: Any, cfg: dict[str, Any], model_dir: Path, dump: Path | None, warmup: int,
              stats_only: bool = False, cpu: dict[str, float] | None = None) -> list[float]:
    """Step times (s) of one training run; with `dump`, captured by rlprobe into it. `cpu`, when
    given, receives the per-step means of train_cpu, off_cpu and probe_cpu (ms)."""
    from transformers import TrainerCallback

    from rlprobe.integrations.trl import attach

    begins: list[float] = []
    clocks: list[tuple[float, float, float]] = []  # training thread CPU, process CPU, writer process CPU

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            begins.append(time.perf_counter())
            clocks.append((time.thread_time(), time.process_time(), _helper_cpu()))

    with tempfile.TemporaryDirectory(prefix="trl_bench_") as output_dir:
        trainer = ex.build_trainer(cfg, output_dir, model_dir)
        if dump is not None:
            run_cfg = dict(cfg, rlprobe_config={**cfg["rlprobe_config"], "dump_path": str(dump)})
            attach(trainer, run_cfg, mode="overwrite", stats_only=stats_only)
        trainer.add_callback(StepClock())
        trainer.train()
    steps = [b - a for a, b in zip(begins, begins[1:])]  # the last step (ending in close()) is not timed
    if cpu is not None:
        d = [[(y[i] - x[i]) * 1e3 for x, y in zip(clocks, clocks[1:])][warmup:] for i in range(3)]
        # means, not medians: the writer works once per flush_interval, so most steps hold none of it
        cpu["train_cpu"] = statistics.fmean(d[0])
        cpu["off_cpu"] = statistics.fmean(w * 1e3 - t for w, t in zip(steps[warmup:], d[0]))
        cpu["probe_cpu"] = statistics.fmean(p - t + h for p, t, h in zip(d[1], d[0], d[2]))
    return steps[warmup:]


class Gate:
    """Switches an attached TRLProbe on and off between steps (benchmark only, nothing in rlprobe):
    when off, every method the integration wrapped goes straight to TRL's own and the probe's step
    callback does nothing; `drain` makes an on step end with probe.flush()."""

    def __init__(self, handle: Any):
        from rlprobe.integrations import trl_guard

        capture = handle._capture
        trainer, self.probe, self.on, self.drain = handle.trainer, handle.probe, True, False
        for p in capture._patches:
            wrapped = trainer.__dict__[p.name]
            original = p.previous if p.previous is not trl_guard._MISSING else getattr(type(trainer), p.name).__get__(
                trainer)
            trainer.__dict__[p.name] = self._dispatch(wrapped, original)
        callback, self.log = capture._callback, capture.log
        end = callback.on_step_end
        callback.on_step_end = self._step_end(end)
        callback.on_log = self._on_log

    def _dispatch(self, wrapped: Any, original: Any) -> Any:
        return lambda *a, **k: (wrapped if self.on else original)(*a, **k)

    def _step_end(self, end: Any) -> Any:
        def on_step_end(args, state, control, **kwargs):
            if self.on:
                end(args, state, control, **kwargs)
                if self.drain:
                    self.probe.flush()
        return on_step_end

    def _on_log(self, args, state, control, logs=None, **kwargs):
        if self.on:  # the probe counts only its own steps: the values belong to the one just ended
            self.log(logs or {}, type("State", (), {"global_step": self.probe.current_step})())


def schedule(steps: int, block: int, first_on: bool) -> list[bool]:
    """ABBA blocks of `block` steps: on, off, off, on (or the reverse), repeated over `steps`."""
    pattern = [first_on, not first_on, not first_on, first_on]
    return [pattern[(i // block) % 4] for i in range(steps)]


def interleaved_run(ex: Any, cfg: dict[str, Any], model_dir: Path, dump: Path, warmup: int, plan: list[bool],
                    drain: bool) -> list[float]:
    """Step times (s) of one run whose probe follows `plan` after `warmup` steps with it on."""
    from transformers import TrainerCallback

    from rlprobe.integrations.trl import attach

    begins: list[float] = []
    gate: Gate | None = None

    class Switch(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            begins.append(time.perf_counter())
            i = len(begins) - 1 - warmup
            on = i < 0 or i >= len(plan) or plan[i]
            gate.on = on
            # the last on step of a block ends with everything written (drained runs only)
            gate.drain = drain and on and 0 <= i < len(plan) - 1 and not plan[i + 1]

    with tempfile.TemporaryDirectory(prefix="trl_bench_") as output_dir:
        trainer = ex.build_trainer(cfg, output_dir, model_dir)
        run_cfg = dict(cfg, rlprobe_config={**cfg["rlprobe_config"], "dump_path": str(dump)})
        gate = Gate(attach(trainer, run_cfg, mode="overwrite"))
        trainer.add_callback(Switch())
        trainer.train()
    return [b - a for a, b in zip(begins, begins[1:])][warmup:warmup + len(plan)]


def cycle_ratios(steps: list[float], plan: list[bool], block: int, skip: int = 0) -> list[float]:
    """Per ABBA cycle (4 blocks: two on, two off), the time of its on steps over that of its off
    steps, leaving out the first `skip` steps of each block: a drift that is linear over the cycle
    cancels."""
    n = 4 * block
    out = []
    for c in range(len(plan) // n):
        part = [i for i in range(c * n, (c + 1) * n) if i % block >= skip]
        on = sum(steps[i] for i in part if plan[i])
        out.append(on / sum(steps[i] for i in part if not plan[i]))
    return out


VARIANTS = ("alternating", "steady", "drained")


def variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """name -> block, skipped steps a block, drain, cycles a run (module docstring)."""
    steady = args.steady_block
    return {"alternating": {"block": 1, "skip": 0, "drain": False, "cycles": (2 if args.smoke else 12) * args.cycles},
            "steady": {"block": steady, "skip": steady // 2, "drain": False, "cycles": args.cycles},
            "drained": {"block": args.block, "skip": 0, "drain": True, "cycles": args.cycles}}


def interleave(args: argparse.Namespace, ex: Any, cfg: dict[str, Any], model_dir: Path, dump: Path) -> dict[str, Any]:
    """--interleave: per repetition one run of each variant, in turn (module docstring)."""
    runs = []
    kinds = variants(args)
    for rep in range(args.reps):
        figures: dict[str, Any] = {}
        order = VARIANTS[rep % 3:] + VARIANTS[:rep % 3]
        for name in order if rep % 2 == 0 else order[::-1]:
            v = kinds[name]
            waited = wait_idle(args.min_idle, args.idle_timeout)
            plan = schedule(4 * v["block"] * v["cycles"], v["block"], rep % 4 < 2)
            cfg["grpo"]["max_steps"] = args.warmup + len(plan) + 1
            steps = interleaved_run(ex, cfg, model_dir, dump, args.warmup, plan, v["drain"])
            on = [t for t, o in zip(steps, plan) if o]
            off = [t for t, o in zip(steps, plan) if not o]
            figures[name] = {"on_median": statistics.median(on), "off_median": statistics.median(off),
                             "cycles": cycle_ratios(steps, plan, v["block"], v["skip"]), "waited_s": round(waited, 1)}
        runs.append(figures)
        print(f"rep {rep}: step off {figures['alternating']['off_median'] * 1e3:.1f} ms (median); added, cycles: "
              + "; ".join(f"{name} " + " ".join(f"{(r - 1) * 100:+.1f}%" for r in figures[name]["cycles"][:8])
                          + (" ..." if len(figures[name]["cycles"]) > 8 else "") for name in VARIANTS), flush=True)

    summary = {"mode": "interleave", "level": args.level, "reps": args.reps, "threads": args.threads, "goal_pct": 5.0,
               "variants": kinds, "load": os.getloadavg(),
               "off_step_ms": statistics.median(r["alternating"]["off_median"] for r in runs) * 1e3}
    for name in VARIANTS:
        cycles = [c for r in runs for c in r[name]["cycles"]]
        summary[f"{name}_pct"] = (statistics.median(cycles) - 1) * 100
        summary[f"{name}_cycles"] = len(cycles)
    steady = kinds["steady"]
    notes = {"alternating": "a step at a time: the training thread's share and part of the writer's",
             "steady": f"blocks of {steady['block']}, the first {steady['skip']} of each left out: the whole "
                       "probe, writer in steady state; goal <= +5%",
             "drained": f"blocks of {args.block} ending in probe.flush(): all of it serialised, an upper bound"}
    print(f"\nTRL GRPO step, examples/trl_grpo configuration, level {args.level}, probe on and off by turns within "
          f"each run, {args.reps} repetitions, {args.threads} torch threads")
    print(f"step without the probe (median): {summary['off_step_ms']:.1f} ms; added (median of the ABBA cycles' "
          "on/off time):")
    for name in VARIANTS:
        print(f"  {name:<14}{summary[name + '_pct']:>+7.1f}%   ({summary[name + '_cycles']} cycles; {notes[name]})")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in summary['load'])}")
    return {"summary": summary, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", choices=sorted(LEVELS), default="key_data")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--steps", type=int, help="timed steps per run (default 12; not with --interleave)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--stats-only", action="store_true", help="the probe keeps statistics, no tensor files")
    ap.add_argument("--min-idle", type=float, default=0.8)
    ap.add_argument("--idle-timeout", type=float, default=30.0)
    ap.add_argument("--writers", action="store_true",
                    help="also run with RLPROBE_WRITER_PROCESS=1 (key data in a writer process)")
    ap.add_argument("--interleave", action="store_true",
                    help="probe on and off by turns within each run (alternating steps, drained blocks)")
    ap.add_argument("--block", type=int, default=12, help="--interleave: steps a block of the drained run")
    ap.add_argument("--steady-block", type=int, default=32,
                    help="--interleave: steps a block of the steady run (its first half left out)")
    ap.add_argument("--cycles", type=int, default=2,
                    help="--interleave: ABBA cycles a run (the alternating run: 12 x as many)")
    ap.add_argument("--smoke", action="store_true", help="1 repetition of 3 timed steps, no idle wait")
    ap.add_argument("--tmp", help="folder for the model and dumps (default: a temporary one)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.reps, args.steps, args.warmup, args.min_idle = 1, 3, 1, 0.0
        args.block, args.steady_block, args.cycles = 1, 2, 1
    if args.steps is None:
        args.steps = 12
    for name in ("block", "steady_block", "cycles"):
        if getattr(args, name) < 1 or (name == "steady_block" and args.steady_block < 2):
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a whole number >= "
                     f"{2 if name == 'steady_block' else 1}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    ex = load_example()
    cfg = ex.load_config()
    cfg["grpo"]["max_steps"] = args.warmup + args.steps + 1
    cfg["rlprobe_config"] = {**LEVELS[args.level], "stages": []}
    with tempfile.TemporaryDirectory(prefix="trl_overhead_", dir=args.tmp) as tmp:
        model_dir = ex.tiny.build_model_dir(Path(tmp) / "model")
        if args.interleave:
            result = interleave(args, ex, cfg, model_dir, Path(tmp) / "dump")
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
            return 0
        runs: list[dict[str, Any]] = []
        modes = ["plain", "rlprobe", *(["process"] if args.writers else [])]
        for rep in range(args.reps):
            order = modes[rep % len(modes):] + modes[:rep % len(modes)]
            order = order if rep % 2 == 0 else order[::-1]
            figures: dict[str, Any] = {}
            for mode in order:
                waited = wait_idle(args.min_idle, args.idle_timeout)
                cpu: dict[str, float] = {}
                previous = os.environ.get(WRITER_PROCESS)
                if mode == "process":
                    os.environ[WRITER_PROCESS] = "1"
                try:
                    steps = timed_run(ex, cfg, model_dir, None if mode == "plain" else Path(tmp) / "dump",
                                      args.warmup, args.stats_only, cpu)
                finally:
                    if mode == "process":
                        os.environ.pop(WRITER_PROCESS) if previous is None else os.environ.update(
                            {WRITER_PROCESS: previous})
                figures[mode] = statistics.median(steps)
                figures[f"{mode}_mean"] = statistics.fmean(steps)
                figures[f"{mode}_cpu"] = cpu
                figures[f"{mode}_waited_s"] = round(waited, 1)
            figures["ratio"] = figures["rlprobe"] / figures["plain"]
            figures["mean_ratio"] = figures["rlprobe_mean"] / figures["plain_mean"]
            if args.writers:
                figures["process_ratio"] = figures["process"] / figures["plain"]
            runs.append(figures)
            print(f"rep {rep}: " + ", ".join(f"{m} {figures[m] * 1e3:.1f} ms (train cpu "
                                             f"{figures[m + '_cpu']['train_cpu']:.1f}, off cpu "
                                             f"{figures[m + '_cpu']['off_cpu']:.1f}, probe cpu "
                                             f"{figures[m + '_cpu']['probe_cpu']:.1f})" for m in modes)
                  + f", {(figures['ratio'] - 1) * 100:+.1f}% (means {(figures['mean_ratio'] - 1) * 100:+.1f}%)",
                  flush=True)
    plain = statistics.median(r["plain"] for r in runs)
    probed = statistics.median(r["rlprobe"] for r in runs)
    paired = statistics.median(r["ratio"] for r in runs)
    summary = {"level": args.level, "reps": args.reps, "steps": args.steps, "plain_step_ms": plain * 1e3,
               "rlprobe_step_ms": probed * 1e3, "overhead_pct": (probed / plain - 1) * 100,
               "paired_overhead_pct": (paired - 1) * 100, "goal_pct": 5.0, "threads": args.threads,
               "plain_mean_step_ms": statistics.median(r["plain_mean"] for r in runs) * 1e3,
               "rlprobe_mean_step_ms": statistics.median(r["rlprobe_mean"] for r in runs) * 1e3,
               "paired_mean_overhead_pct": (statistics.median(r["mean_ratio"] for r in runs) - 1) * 100,
               "load": os.getloadavg(),
               "stats_only": args.stats_only,
               "cpu_ms": {m: {k: statistics.median(r[f"{m}_cpu"][k] for r in runs)
                              for k in ("train_cpu", "off_cpu", "probe_cpu")} for m in modes}}
    if args.writers:
        summary["process_step_ms"] = statistics.median(r["process"] for r in runs) * 1e3
        summary["paired_process_overhead_pct"] = (statistics.median(r["process_ratio"] for r in runs) - 1) * 100
    print(f"\nTRL GRPO step, examples/trl_grpo configuration, level {args.level}"
          f"{' (statistics only)' if args.stats_only else ''}, {args.reps} repetitions x {args.steps} steps, "
          f"{args.threads} torch threads")
    print(f"{'':<28}{'ms/step':>10}{'added':>10}")
    print(f"{'plain TRL':<28}{plain * 1e3:>10.1f}")
    print(f"{'with attach(trainer, cfg)':<28}{probed * 1e3:>10.1f}{summary['overhead_pct']:>+9.1f}%")
    print(f"{'paired (median of ratios)':<28}{'':>10}{summary['paired_overhead_pct']:>+9.1f}%   (goal <= +5%)")
    mean_added = summary["paired_mean_overhead_pct"]
    print(f"{'mean steps, paired':<28}{summary['rlprobe_mean_step_ms']:>10.1f}{mean_added:>+9.1f}%"
          "   (the writer's once-a-commit work shows here, not in the medians)")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in summary['load'])}")
    if args.writers:
        print(f"{'writer process':<28}{summary['process_step_ms']:>10.1f}"
              f"{summary['paired_process_overhead_pct']:>+9.1f}%   (paired; RLPROBE_WRITER_PROCESS=1)")
    columns = ("train_cpu", "off_cpu", "probe_cpu")
    print(f"per step (ms, means): {'':<6}" + "".join(f"{k:>11}" for k in columns))
    for m in modes:
        print(f"  {m:<26}" + "".join(f"{summary['cpu_ms'][m][k]:>11.1f}" for k in columns))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

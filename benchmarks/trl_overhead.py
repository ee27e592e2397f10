"""What rlprobe's TRL integration adds to a TRL step (issue 15: <= 5 % at key-data level).

    python benchmarks/trl_overhead.py                     # probe on and off by turns, 6 repetitions (~4 minutes)
    python benchmarks/trl_overhead.py --variants aligned,alternating,steady,drained   # all four interleaved figures
    python benchmarks/trl_overhead.py --separate          # plain and probed runs, 9 repetitions (the first passes')
    python benchmarks/trl_overhead.py --separate --level grads   # key data + gradient monitor (L1)
    python benchmarks/trl_overhead.py --separate --writers       # plain / writer thread / writer process, paired
    python benchmarks/trl_overhead.py --smoke             # one short repetition (the test suite runs it)

Workload: examples/trl_grpo's configuration (GRPOTrainer, the tiny Qwen2 built in code, 2
micro-batches of 4 completions of up to 8 tokens a step, beta 0.04 so the reference model
runs too), on the CPU, `--threads` torch threads (2). `--level key_data` switches on key data,
configs and TRL's metrics (rlprobe_config key_data_dump, configurations_dump, metrics_dump),
`--level grads` adds grads_dump; `--stats-only` keeps statistics without tensor files. A step's
time is the interval between TRL's consecutive `on_step_begin` callbacks, so it holds generation,
rewards, reference forward, both micro-batches' forward and backward, the optimizer step, TRL's
logging and everything rlprobe does in them (its save calls, probe.step(), log_metrics).
The first `--warmup` steps and the last one (which ends in close()) are not timed. Before each
run it waits (up to --idle-timeout s) for the CPU to be --min-idle idle for 1 s.

Interleaved (the default). Separate runs differ by more than the probe costs: this VM's step
time moves between ~55 and ~105 ms for tens of seconds at a time, within one run and between runs.
So the probe stays attached for the whole run and is switched on and off by turns; on an "off"
step the benchmark sends every wrapped trainer method straight to TRL's own and skips the probe's
step callback, so nothing of rlprobe runs in it (tests/integrations/test_trl_benchmark.py checks
that the dump holds exactly the on steps). Steps are compared in ABBA cycles (on, off, off, on
blocks: a drift that is linear over a cycle cancels). The writer works once per flush_interval
(1 s, ~10 steps here) on the work of the steps before, so where that work lands decides what is
measured. The variants (--variants; one run of each a repetition):
- `aligned` (the goal's figure): a step at a time, and the benchmark holds the writer's own timers
  back and starts its once-a-flush_interval work itself (the deferred save calls, then the commit,
  each when due by the same interval) at the beginning of an on step that another on step follows
  (ABBA's two on steps where cycles meet), so that it runs beside training as it would anywhere in a
  run, and none of it in an off step, even where a burst outlasts its step (the writer thread's CPU
  in on and off steps is read from /proc and printed: its share in off steps should be ~0).
  The interval is divided by the share of on steps (1/2), so that a batch of deferred calls and a
  commit cover as many probed steps as with the probe always on (a commit's fixed costs, Parquet
  parts and the manifest, are shared by as many steps). A figure is the on steps' time over the off
  steps' time in a window of --window (10) cycles (40 steps, ~2-3 s), widened where steps are fast
  until a window lasts the writer's interval (one or two batches and commits in each, so that the
  median of windows leaves none of them out); --aligned-cycles (80) cycles a run.
- `alternating`: a step at a time with the writer's own timers: the training thread's share; the
  writer's work lands on on and off steps alike and cancels.
- `steady`: blocks of --steady-block steps (32), the first half of each left out, so that a
  measured on step has the writer in its steady state behind it and a measured off step none of
  it; few cycles a run, so noisy.
- `drained`: blocks of --block steps (12) whose last on step ends in probe.flush(), which waits
  until everything saved is written: all of the probe's work serialised into on steps.
Each figure is the median over all cycles (windows) of all repetitions, with its interquartile range.

`--separate`: each repetition trains twice in this process, plain and with `attach(trainer, cfg)`,
in alternating order, --steps timed steps each (12). Per run the median step and the mean step;
the table gives the medians over repetitions and the median of each repetition's probe/plain
ratio (paired), of medians and of means; and the CPU a step of the training thread (train_cpu),
its time off a CPU (off_cpu) and the probe's CPU outside the training thread (probe_cpu).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
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
HELD_BACK_S = 1e6  # --interleave, aligned: the writer's own timers, while the benchmark starts its work
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
    callback does nothing; `drain` makes an on step end with probe.flush(). With `align()` the
    writer's own timers are held back and its once-per-flush_interval work (the deferred save calls,
    the commit) is started by `begin_step` at the beginning of an on step instead, when it is due (by
    the probe's interval over the share of on steps, or CALL_BATCH_COUNT save calls wait): it then runs
    beside that step's training, as the probe's own `step_ended` starts it at a step's end in a run (which
    the gate switches off: it could start work before an off step)."""

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
        self.writer, self.interval = getattr(self.probe, "writer", None) or self.probe._writer, None  # older: _writer

    def align(self, on_share: float) -> None:
        """Hold the writer's timers back; its work becomes due after flush_interval / on_share seconds,
        so that a batch (and a commit) covers as many probed steps as in a run with the probe always on."""
        self.interval, self.writer.flush_interval = self.writer.flush_interval / on_share, HELD_BACK_S
        # the probe hands due work over when a step ends (BackgroundWriter.step_ended): here begin_step does
        # that, and only before an on step that another follows, so that the work stays in on steps
        self.writer.step_ended = lambda: None

    def begin_step(self, on: bool, next_on: bool = True) -> None:
        """Switch the probe for the step beginning now; aligned, start the writer's work when due, but only
        at an on step followed by another one: a burst that outlasts its step (a batch on a busy machine) then
        still lands in on steps."""
        self.on = on
        if not on or not next_on or self.interval is None:
            return
        from rlprobe.capture.writer import CALL_BATCH_COUNT

        writer, now = self.writer, time.monotonic()
        if writer._deferred and (now - writer._deferred_since >= self.interval
                                 or writer._deferred_calls >= CALL_BATCH_COUNT):
            writer.hand_over()
        if writer.sink.pending_steps and now - writer.sink.last_flush >= self.interval:
            writer.submit(writer._commit)

    def writer_cpu(self) -> float | None:
        """CPU seconds of the writer thread so far (Linux's schedstat; None elsewhere)."""
        try:
            return int(Path(f"/proc/self/task/{self.writer._thread.native_id}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

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
                    drain: bool, align: bool = False) -> tuple[list[float], dict[str, Any]]:
    """Step times (s) of one run whose probe follows `plan` after `warmup` steps with it on, and the
    CPU seconds a step of the training thread ("train") and of the writer thread ("writer"; None
    where it cannot be read), and the aligned writer's interval ("due_s"; None when not aligned)."""
    from transformers import TrainerCallback

    from rlprobe.integrations.trl import attach

    begins: list[float] = []
    train: list[float] = []
    writer: list[float | None] = []
    gate: Gate | None = None

    def probed(i: int) -> bool:
        """Whether the probe is on at timed step `i` (on through the warm-up and after the plan)."""
        return i < 0 or i >= len(plan) or plan[i]

    class Switch(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            begins.append(time.perf_counter())
            train.append(time.thread_time())
            writer.append(gate.writer_cpu())
            i = len(begins) - 1 - warmup
            on = probed(i)
            gate.begin_step(on, probed(i + 1))
            # the last on step of a block ends with everything written (drained runs only)
            gate.drain = drain and on and 0 <= i < len(plan) - 1 and not plan[i + 1]

    with tempfile.TemporaryDirectory(prefix="trl_bench_") as output_dir:
        trainer = ex.build_trainer(cfg, output_dir, model_dir)
        run_cfg = dict(cfg, rlprobe_config={**cfg["rlprobe_config"], "dump_path": str(dump)})
        gate = Gate(attach(trainer, run_cfg, mode="overwrite"))
        if align:
            gate.align(sum(plan) / len(plan))
        trainer.add_callback(Switch())
        trainer.train()

    def per_step(clock: list) -> list[float] | None:
        if any(c is None for c in clock):
            return None
        return [b - a for a, b in zip(clock, clock[1:])][warmup:warmup + len(plan)]

    return per_step(begins), {"train": per_step(train), "writer": per_step(writer), "due_s": gate.interval}


def cycle_ratios(steps: list[float], plan: list[bool], block: int, skip: int = 0, window: int = 1) -> list[float]:
    """Per `window` ABBA cycles (4 blocks each: two on, two off), the time of their on steps over that
    of their off steps, leaving out the first `skip` steps of each block: a drift that is linear over
    a cycle cancels."""
    n = 4 * block * window
    out = []
    for c in range(len(plan) // n):
        part = [i for i in range(c * n, (c + 1) * n) if i % block >= skip]
        on = sum(steps[i] for i in part if plan[i])
        out.append(on / sum(steps[i] for i in part if not plan[i]))
    return out


def covering_window(window: int, block: int, off_step_s: float, due_s: float | None, cycles: int) -> int:
    """Cycles a figure: at least `window`, and enough that a window lasts the writer's interval `due_s`
    (None: not aligned), so that every window holds a batch and a commit and the median of windows
    cannot leave them out when steps are fast; at most the run's `cycles`."""
    if not due_s or off_step_s <= 0:
        return window
    return max(window, min(cycles, math.ceil(due_s / (4 * block * off_step_s))))


VARIANTS = ("aligned", "alternating", "steady", "drained")


def variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """name -> block, skipped steps a block, drain, align, cycles a run, cycles a figure (module docstring)."""
    steady, smoke = args.steady_block, args.smoke
    return {"aligned": {"block": 1, "skip": 0, "drain": False, "align": True, "cycles": args.aligned_cycles,
                        "window": args.window},
            "alternating": {"block": 1, "skip": 0, "drain": False, "align": False,
                            "cycles": (2 if smoke else 12) * args.cycles, "window": 1},
            "steady": {"block": steady, "skip": steady // 2, "drain": False, "align": False, "cycles": args.cycles,
                       "window": 1},
            "drained": {"block": args.block, "skip": 0, "drain": True, "align": False, "cycles": args.cycles,
                        "window": 1}}


NOTES = {"aligned": "a step at a time, the writer's once-a-second work started at an on step: the whole probe; "
                    "goal <= +5%",
         "alternating": "a step at a time: the training thread's share (the writer's lands on both)",
         "steady": "blocks of {block}, the first {skip} of each left out: the writer in steady state",
         "drained": "blocks of {block} ending in probe.flush(): all of it serialised, an upper bound"}


def interleave(args: argparse.Namespace, ex: Any, cfg: dict[str, Any], model_dir: Path, dump: Path) -> dict[str, Any]:
    """Interleaved runs: per repetition one run of each chosen variant, in turn (module docstring)."""
    runs = []
    kinds = {name: v for name, v in variants(args).items() if name in args.variants}
    chosen = [name for name in VARIANTS if name in kinds]
    for rep in range(args.reps):
        figures: dict[str, Any] = {}
        order = chosen[rep % len(chosen):] + chosen[:rep % len(chosen)]
        for name in order if rep % 2 == 0 else order[::-1]:
            v = kinds[name]
            waited = wait_idle(args.min_idle, args.idle_timeout)
            plan = schedule(4 * v["block"] * v["cycles"], v["block"], rep % 4 < 2)
            cfg["grpo"]["max_steps"] = args.warmup + len(plan) + 1
            steps, cpu = interleaved_run(ex, cfg, model_dir, dump, args.warmup, plan, v["drain"], v["align"])
            on = [t for t, o in zip(steps, plan) if o]
            off = [t for t, o in zip(steps, plan) if not o]
            window = covering_window(v["window"], v["block"], statistics.median(off), cpu["due_s"], v["cycles"])
            figures[name] = {"on_median": statistics.median(on), "off_median": statistics.median(off),
                             "cycles": cycle_ratios(steps, plan, v["block"], v["skip"], window), "window": window,
                             "waited_s": round(waited, 1),
                             # CPU seconds in on and in off steps: the training thread's, the writer's
                             **{f"{clock}_cpu_s": None if cpu[clock] is None else [
                                 sum(c for c, o in zip(cpu[clock], plan) if o),
                                 sum(c for c, o in zip(cpu[clock], plan) if not o)] for clock in ("train", "writer")},
                             "due_s": cpu["due_s"]}
        runs.append(figures)
        print(f"rep {rep}: step off {figures[chosen[0]]['off_median'] * 1e3:.1f} ms (median); added: "
              + "; ".join(f"{name} " + " ".join(f"{(r - 1) * 100:+.1f}%" for r in figures[name]["cycles"][:8])
                          + (" ..." if len(figures[name]["cycles"]) > 8 else "") for name in chosen), flush=True)

    summary = {"mode": "interleave", "level": args.level, "reps": args.reps, "threads": args.threads, "goal_pct": 5.0,
               "variants": kinds, "load": os.getloadavg(),
               "off_step_ms": statistics.median(r[chosen[0]]["off_median"] for r in runs) * 1e3}
    for name in chosen:
        figures = [c for r in runs for c in r[name]["cycles"]]
        summary[f"{name}_pct"] = (statistics.median(figures) - 1) * 100
        summary[f"{name}_cycles"] = len(figures)
        quartiles = statistics.quantiles(figures, n=4) if len(figures) > 1 else figures * 3
        summary[f"{name}_quartiles_pct"] = [(quartiles[0] - 1) * 100, (quartiles[-1] - 1) * 100]
        steps_on = sum(2 * kinds[name]["block"] * kinds[name]["cycles"] for _ in runs)  # = off steps
        train = [r[name]["train_cpu_s"] for r in runs]
        summary[f"{name}_train_cpu_added_ms"] = (sum(c[0] for c in train) - sum(c[1] for c in train)) / steps_on * 1e3
        cpu = [r[name]["writer_cpu_s"] for r in runs]
        if all(c is not None for c in cpu):
            on_s, off_s = sum(c[0] for c in cpu), sum(c[1] for c in cpu)
            summary[f"{name}_writer_ms_per_on_step"] = on_s / steps_on * 1e3
            summary[f"{name}_writer_off_share"] = off_s / (on_s + off_s) if on_s + off_s else 0.0
    print(f"\nTRL GRPO step, examples/trl_grpo configuration, level {args.level}, probe on and off by turns within "
          f"each run, {args.reps} repetitions, {args.threads} torch threads")
    print(f"step without the probe (median): {summary['off_step_ms']:.1f} ms; added (median of the on/off time "
          "ratios, interquartile range):")
    for name in chosen:
        v = kinds[name]
        used = sorted({r[name]["window"] for r in runs})
        unit = f"windows of {'/'.join(map(str, used))} cycles" if max(used) > 1 else "cycles"
        low, high = summary[f"{name}_quartiles_pct"]
        writer = f"; training thread CPU {summary[name + '_train_cpu_added_ms']:+.2f} ms an on step"
        if f"{name}_writer_off_share" in summary:
            writer += (f", writer {summary[name + '_writer_ms_per_on_step']:.2f} ms ("
                       f"{summary[name + '_writer_off_share'] * 100:.0f}% of it in off steps)")
        print(f"  {name:<12}{summary[name + '_pct']:>+7.1f}%  ({low:+.1f} ... {high:+.1f}; {summary[name + '_cycles']} "
              f"{unit}{writer})\n{'':<14}{NOTES[name].format(**v)}")
        if max(used) > v["window"]:
            print(f"{'':<14}windows widened from {v['window']} cycles to last the writer's interval "
                  f"({max(r[name]['due_s'] for r in runs):.1f} s) at this step time")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in summary['load'])}")
    return {"summary": summary, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", choices=sorted(LEVELS), default="key_data")
    ap.add_argument("--reps", type=int, help="repetitions (default 6 interleaved, 9 with --separate)")
    ap.add_argument("--steps", type=int, help="--separate: timed steps per run (default 12)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--stats-only", action="store_true", help="the probe keeps statistics, no tensor files")
    ap.add_argument("--min-idle", type=float, default=0.8)
    ap.add_argument("--idle-timeout", type=float, default=30.0)
    ap.add_argument("--writers", action="store_true",
                    help="also run with RLPROBE_WRITER_PROCESS=1 (key data in a writer process)")
    ap.add_argument("--separate", action="store_true",
                    help="plain and probed runs one after the other (the first passes' measure) instead of the "
                         "probe on and off by turns within each run")
    ap.add_argument("--interleave", action="store_true", help="the probe on and off by turns (the default)")
    ap.add_argument("--variants", default="aligned,alternating",
                    help=f"interleaved variants, comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--aligned-cycles", type=int, default=80, help="ABBA cycles a run of the aligned variant")
    ap.add_argument("--window", type=int, default=10,
                    help="aligned: cycles a figure (their on steps' time over their off steps')")
    ap.add_argument("--block", type=int, default=12, help="--interleave: steps a block of the drained run")
    ap.add_argument("--steady-block", type=int, default=32,
                    help="--interleave: steps a block of the steady run (its first half left out)")
    ap.add_argument("--cycles", type=int, default=2,
                    help="--interleave: ABBA cycles a run (the alternating run: 12 x as many)")
    ap.add_argument("--flush-interval", type=float,
                    help="the probe's flush_interval (rlprobe_config), seconds (default: the probe's, 1 s)")
    ap.add_argument("--smoke", action="store_true", help="1 repetition of 3 timed steps, no idle wait")
    ap.add_argument("--tmp", help="folder for the model and dumps (default: a temporary one)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.separate and args.interleave:
        ap.error("--separate and --interleave: choose one")
    for flag in ("writers", "stats_only", "steps"):
        if not args.separate and getattr(args, flag) not in (None, False):
            ap.error(f"--{flag.replace('_', '-')} is a flag of --separate runs; add --separate")
    if args.smoke:
        args.reps, args.steps, args.warmup, args.min_idle = 1, 3, 1, 0.0
        args.block, args.steady_block, args.cycles, args.aligned_cycles, args.window = 1, 2, 1, 2, 1
    if args.steps is None:
        args.steps = 12
    if args.reps is None:
        args.reps = 9 if args.separate else 6
    for name in ("reps", "block", "steady_block", "cycles", "aligned_cycles", "window"):
        if getattr(args, name) < 1 or (name == "steady_block" and args.steady_block < 2):
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a whole number >= "
                     f"{2 if name == 'steady_block' else 1}")
    if args.flush_interval is not None and not 0 <= args.flush_interval < math.inf:
        ap.error(f"--flush-interval {args.flush_interval}: expected seconds, a finite number >= 0")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        ap.error(f"--variants {','.join(args.variants)}: expected one or more of {', '.join(VARIANTS)}, "
                 "comma-separated")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    ex = load_example()
    cfg = ex.load_config()
    cfg["grpo"]["max_steps"] = args.warmup + args.steps + 1
    cfg["rlprobe_config"] = {**LEVELS[args.level], "stages": []}
    if args.flush_interval is not None:
        cfg["rlprobe_config"]["flush_interval"] = args.flush_interval
    with tempfile.TemporaryDirectory(prefix="trl_overhead_", dir=args.tmp) as tmp:
        model_dir = ex.tiny.build_model_dir(Path(tmp) / "model")
        if not args.separate:
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

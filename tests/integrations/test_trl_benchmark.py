"""benchmarks/trl_overhead.py runs end to end (its figures are measured, never asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_trl_overhead_script_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import trl_overhead

    out = tmp_path / "r.json"
    assert trl_overhead.main(["--separate", "--smoke", "--threads", "1", "--tmp", str(tmp_path),
                              "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    summary, runs = result["summary"], result["runs"]
    assert summary["level"] == "key_data" and summary["reps"] == 1 and summary["steps"] == 3
    assert len(runs) == 1 and runs[0]["plain"] > 0 and runs[0]["rlprobe"] > 0
    assert summary["overhead_pct"] == (runs[0]["rlprobe"] / runs[0]["plain"] - 1) * 100
    assert "with attach(trainer, cfg)" in capsys.readouterr().out
    assert set(summary["cpu_ms"]) == {"plain", "rlprobe"}
    assert summary["cpu_ms"]["rlprobe"]["train_cpu"] > 0
    sys.modules.pop("trl_overhead", None)


def test_interleaved_off_steps_run_nothing_of_the_probe(tmp_path, monkeypatch):
    """--interleave compares steps with the probe on and off in one run: an off step must hold no
    capture at all (its key data, metrics and step are missing from the dump), an on step all of it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import trl_overhead

    from rlprobe.lake.reader import open_dump

    ex = trl_overhead.load_example()
    cfg = ex.load_config()
    cfg["rlprobe_config"] = {**trl_overhead.LEVELS["key_data"], "stages": []}
    plan = trl_overhead.schedule(8, 2, False)
    assert plan == [False, False, True, True, True, True, False, False]
    cfg["grpo"]["max_steps"] = 1 + len(plan) + 1
    model_dir = ex.tiny.build_model_dir(tmp_path / "model")
    steps, cpu = trl_overhead.interleaved_run(ex, cfg, model_dir, tmp_path / "dump", 1, plan, drain=True)
    assert len(steps) == len(plan) and all(t > 0 for t in steps)
    assert len(cpu["train"]) == len(plan) and all(c > 0 for c in cpu["train"])
    assert cpu["writer"] is not None and len(cpu["writer"]) == len(plan)  # Linux: the writer thread's CPU a step
    dump = open_dump(tmp_path / "dump")
    # the warm-up step, the four on steps and the untimed last step: six probe steps, each complete
    key_steps = dump.arrow("key_data").column("step").to_pylist()
    assert sorted(set(key_steps)) == list(range(6))
    per_step = {s: key_steps.count(s) for s in set(key_steps)}
    assert len(set(per_step.values())) == 1, per_step
    assert sorted(set(dump.arrow("scalar").column("step").to_pylist())) == list(range(6))
    assert trl_overhead.cycle_ratios([1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0], plan, 2) == [2.0]
    # the first step of each block left out: on 3 + 3, off 1 + 1
    assert trl_overhead.cycle_ratios([9.0, 1.0, 9.0, 3.0, 9.0, 3.0, 9.0, 1.0], plan, 2, skip=1) == [3.0]
    # windows of two cycles: the on steps' time over the off steps' time of both cycles together
    alternating = trl_overhead.schedule(8, 1, True)
    assert trl_overhead.cycle_ratios([2.0, 1.0, 1.0, 2.0, 3.0, 1.0, 1.0, 5.0], alternating, 1, window=2) == [3.0]
    # a window lasts at least the writer's interval: 2 s at 48 ms steps needs 11 cycles of 4 steps, not 10
    assert trl_overhead.covering_window(10, 1, 0.048, 2.0, 80) == 11
    assert trl_overhead.covering_window(10, 1, 0.070, 2.0, 80) == 10
    assert trl_overhead.covering_window(10, 1, 0.05, None, 80) == 10
    assert trl_overhead.covering_window(1, 1, 0.01, 2.0, 2) == 2  # never more than the run's cycles
    sys.modules.pop("trl_overhead", None)


def test_aligned_run_starts_the_writer_s_work_in_on_steps(tmp_path, monkeypatch):
    """The aligned variant holds the writer's own timers back and starts its due work (deferred save
    calls, the commit) at the beginning of on steps: the run's dump must still hold every on step,
    complete, the writer must have worked in on steps, and its interval must be the probe's."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import trl_overhead

    from rlprobe.lake.reader import open_dump

    ex = trl_overhead.load_example()
    cfg = ex.load_config()
    # due at every on step: each one hands the deferred calls over and commits
    cfg["rlprobe_config"] = {**trl_overhead.LEVELS["key_data"], "stages": [], "flush_interval": 0.0}
    plan = trl_overhead.schedule(8, 1, True)
    cfg["grpo"]["max_steps"] = 1 + len(plan) + 1
    model_dir = ex.tiny.build_model_dir(tmp_path / "model")
    seen, started = [], []
    original = trl_overhead.Gate.begin_step

    def begin_step(gate, on, next_on=True):
        seen.append((on, gate.interval, gate.writer.flush_interval, len(gate.writer.sink.manifest["committed_steps"])))
        assert gate.writer.step_ended() is None and "step_ended" in gate.writer.__dict__  # the gate's, a no-op
        submit, hand_over, calls = gate.writer.submit, gate.writer.hand_over, []
        gate.writer.submit = lambda *a, **k: (calls.append("commit"), submit(*a, **k))
        gate.writer.hand_over = lambda: (calls.append("calls"), hand_over())
        try:
            original(gate, on, next_on)
        finally:
            del gate.writer.submit, gate.writer.hand_over
        started.append((on, next_on, calls))

    monkeypatch.setattr(trl_overhead.Gate, "begin_step", begin_step)
    steps, cpu = trl_overhead.interleaved_run(ex, cfg, model_dir, tmp_path / "dump", 1, plan, drain=False,
                                              align=True)
    writer = cpu["writer"]
    assert len(steps) == len(plan) and writer is not None
    assert {(interval, held) for _, interval, held, _ in seen} == {(0.0, trl_overhead.HELD_BACK_S)}  # 0 / (1/2)
    # the writer's own timers never fire: the steps are committed during the run by the commits begin_step starts
    committed = [n for *_, n in seen]
    assert committed == sorted(committed) and committed[-1] >= sum(plan)
    assert sum(w for w, on in zip(writer, plan) if on) > 0
    # started only at an on step followed by another (a burst outlasting its step stays in on steps), and there
    timed = started[1:1 + len(plan)]  # after the warm-up step
    assert [(on, nxt) for on, nxt, _ in timed] == list(zip(plan, plan[1:] + [True]))
    assert {(on, nxt) for on, nxt, calls in timed if calls} == {(True, True)}
    assert all("calls" in calls for on, nxt, calls in timed if on and nxt)  # due at each (interval 0)
    assert any("commit" in calls for *_, calls in timed)
    dump = open_dump(tmp_path / "dump")
    key_steps = dump.arrow("key_data").column("step").to_pylist()
    assert sorted(set(key_steps)) == list(range(1 + sum(plan) + 1))  # warm-up, on steps, the last step
    assert len({key_steps.count(s) for s in set(key_steps)}) == 1
    sys.modules.pop("trl_overhead", None)


def test_interleave_smoke_and_bad_arguments(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import trl_overhead

    out = tmp_path / "r.json"
    assert trl_overhead.main(["--smoke", "--threads", "1", "--tmp", str(tmp_path), "--json", str(out),
                              "--variants", "drained,steady,alternating,aligned"]) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["mode"] == "interleave"
    run = result["runs"][0]
    # the aligned run's 2 cycles make one window where 4 steps are shorter than the writer's interval
    windows = 2 // run["aligned"]["window"]
    assert [summary[f"{v}_cycles"] for v in ("aligned", "alternating", "steady", "drained")] == [windows, 2, 1, 1]
    assert 0.0 <= summary["aligned_writer_off_share"] <= 1.0
    assert summary["steady_pct"] == (run["steady"]["cycles"][0] - 1) * 100
    assert summary["drained_pct"] == (run["drained"]["cycles"][0] - 1) * 100
    assert "blocks of 2, the first 1 of each left out" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        trl_overhead.main(["--interleave", "--steady-block", "1"])
    assert "--steady-block 1: expected a whole number >= 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        trl_overhead.main(["--variants", "aligned,fast"])
    assert "--variants aligned,fast: expected one or more of aligned, alternating, steady, drained" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        trl_overhead.main(["--writers"])
    assert "--writers is a flag of --separate runs; add --separate" in capsys.readouterr().err
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(SystemExit):
            trl_overhead.main(["--flush-interval", bad])
        assert f"--flush-interval {float(bad)}: expected seconds, a finite number >= 0" in capsys.readouterr().err
    sys.modules.pop("trl_overhead", None)

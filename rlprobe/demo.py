"""`rlprobe demo`: plant a fault in a tiny real PPO run and watch rlprobe find it.

1. Run the PPO example twice, as a baseline and with the fault, capturing key data, configs,
   scalars and gradients (the two runs go in parallel, one process each).
2. Compare them with the bundled pipelines/compare.yaml.
3. Where the summary advises a module dump, run both again with exactly that rlprobe_config
   (stage and step) and compare again, which names the first diverging module.
4. Print the chain of conclusions and where the reports are.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from rlprobe.capture.config import apply_overrides
from rlprobe.errors import ProbeError
from rlprobe.lake.sql_runner import resource_dir

FAULTS = ("ref-bf16", "nondeterministic", "advantage-bug", "sampling-seed", "lr")
# faults whose differences are of rounding size, which the demo compares bitwise (tolerance 0)
BITWISE_FAULTS = ("nondeterministic",)


def example_dir() -> Path:
    return resource_dir("examples") / "ppo"


def load_config(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    return apply_overrides(yaml.safe_load((example_dir() / "config.yaml").read_text(encoding="utf-8")), overrides)


def run_training(cfg: dict[str, Any], runs: dict[str, str | None], out: Path) -> dict[str, Path]:
    """Train once per entry of `runs` (name -> fault or None), in parallel processes."""
    procs = {}
    dumps = {}
    for name, fault in runs.items():
        run_cfg = copy.deepcopy(cfg)
        dump = out / "dumps" / name
        run_cfg["rlprobe_config"]["dump_path"] = str(dump)
        cfg_file = out / "configs" / f"{name}.yaml"
        cfg_file.parent.mkdir(parents=True, exist_ok=True)
        cfg_file.write_text(yaml.safe_dump(run_cfg, sort_keys=False), encoding="utf-8")
        cmd = [sys.executable, str(example_dir() / "tiny_ppo.py"), "--config", str(cfg_file)]
        if fault:
            cmd += ["--fault", fault]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        dumps[name] = dump
    for name, proc in procs.items():
        output, _ = proc.communicate()
        if proc.returncode != 0:
            raise ProbeError(f"the PPO example ({name}) failed with exit code {proc.returncode}:\n{output[-3000:]}")
    return dumps


def compare_runs(a: Path, b: Path, out: Path, bitwise: bool = False) -> dict[str, Any]:
    """Run the bundled pipelines/compare.yaml on two dumps; returns its summary. `bitwise`: tolerance 0, every
    difference a divergence (a nondeterministic reduction differs by rounding only: docs/across-devices.md, Tolerances)."""
    from rlprobe.pipeline.runner import run_pipeline
    from rlprobe.pipeline.spec import load_pipeline

    # absolute paths: the pipeline resolves relative ones against its YAML file's folder
    pipeline = load_pipeline(resource_dir("pipelines") / "compare.yaml",
                             [f"runs.a={Path(a).resolve()}", f"runs.b={Path(b).resolve()}", f"output={out.resolve()}",
                              "history=null",  # the demo keeps no history
                              *(["compare.key_data.tolerance.rtol=0", "compare.key_data.tolerance.atol=0"]
                                if bitwise else [])])
    return run_pipeline(pipeline).summary


def run_demo(fault: str = "ref-bf16", out: str | Path = "./rlprobe_demo", *, steps: int | None = None,
             say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the whole demo; returns {"key_data": summary, "modules": summary or None, "chain": [...]}."""
    if fault not in FAULTS:
        raise ProbeError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
    out = Path(out)
    started = time.perf_counter()
    cfg = load_config({"ppo.steps": steps} if steps else None)
    say(f"[1/4] training the tiny PPO model twice (baseline, and with fault '{fault}'), capturing key data and gradients")
    dumps = run_training(cfg, {"baseline": None, "faulted": fault}, out)
    say("[2/4] comparing the two runs (pipelines/compare.yaml)")
    bitwise = fault in BITWISE_FAULTS  # both runs on one CPU: a difference of rounding is the fault itself
    first = compare_runs(dumps["baseline"], dumps["faulted"], out / "compare", bitwise)
    chain = [_key_data_line(first)]
    modules = None
    next_config = first.get("next_config")
    if next_config:
        stage_cfg = next_config["rlprobe_config"]
        step = stage_cfg["step_start"]
        say(f"[3/4] the summary advises a module dump of {stage_cfg['stages'][0]} at step {step}: running both again with it")
        cfg2 = copy.deepcopy(cfg)
        cfg2["rlprobe_config"].update({k: v for k, v in stage_cfg.items() if k != "dump_path"})
        cfg2["ppo"]["steps"] = step + 1
        dumps2 = run_training(cfg2, {"baseline_modules": None, "faulted_modules": fault}, out)
        say("[4/4] comparing the module dumps")
        modules = compare_runs(dumps2["baseline_modules"], dumps2["faulted_modules"], out / "compare_modules", bitwise)
        chain.append(_module_line(modules))
    else:
        say("[3/4] no module dump advised: the suspect is not a model")
    say("")
    say("verdict: " + " -> ".join(line for line in chain if line))
    say(f"suspect: {first.get('suspect')}")
    say(f"next: {first.get('advice')}")
    say(f"reports: {out / 'compare' / 'report.xlsx'}, {out / 'compare' / 'summary.md'}"
        + (f", {out / 'compare_modules' / 'report.xlsx'}" if modules else ""))
    say(f"done in {time.perf_counter() - started:.0f} s")
    return {"key_data": first, "modules": modules, "chain": chain}


def _key_data_line(summary: dict[str, Any]) -> str:
    first = summary.get("first_divergence")
    if first is None:
        return "no divergence in key data"
    return f"step {first['step']}: {first['key']} differs first ({summary.get('suspect', '').split(' -> ')[-1]})"


def _module_line(summary: dict[str, Any] | None) -> str:
    mod = (summary or {}).get("module_first_divergence")
    if not mod:
        return "no module differs"
    inputs = "inputs equal, " if mod.get("inputs_match") else ""
    return f"first diverging module: {mod['module']} ({inputs}{mod['io']} differs, stage {mod['stage']})"


def load_example_module():
    """The PPO example as a module (for tests that call its functions directly)."""
    spec = importlib.util.spec_from_file_location("rlprobe_tiny_ppo", example_dir() / "tiny_ppo.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module

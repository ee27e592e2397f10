"""Start-up of `rlprobe compare`: two one-step dumps holding one 4-element tensor, `-o OUT`, the
default reports (issue 18: <= 1 s whole command, with pandas installed and without).

    python benchmarks/startup.py [--repeat 9] [--baseline /work/wt-int] [--formats msprobe,rlprobe] [--tmp DIR]
                                 [--bytecode]

Runs `python -m rlprobe.cli compare A B -o OUT` from this checkout and, with --baseline, from
another checkout (PYTHONPATH points at the checkout, so the two are compared on the same
interpreter and libraries), alternating which goes first, each rep on fresh output folders.
Every run is timed twice: wall clock and the child's CPU time (user + system, steadier on a
shared machine).

--bytecode: each checkout is measured as installed, from a copy of its package (and bundled sql/,
pipelines/, examples/) whose modules are byte-compiled first, as pip does when it installs a wheel.
Without it the checkouts' own sources are imported; where PYTHONDONTWRITEBYTECODE is set (this VM)
no .pyc is ever written there, so every run compiles each rlprobe module it imports (~0.5 MB of
source for a comparison: about a quarter of the start-up's instructions, docs/compare.md).

"Without pandas": a folder put first on PYTHONPATH holds a `pandas` package whose import raises
ImportError, so every library sees pandas as not installed (pyarrow's and DuckDB's checks
included). "With pandas": the installed pandas, as TRL and most ML environments have it.

Prints medians per variant, the paired ratio baseline / this checkout (median over reps),
the load average, and whether the 1 s target is met. compare_speed.py imports
`make_tiny_dumps` and `startup_seconds` from here for its "beyond start-up" figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent
TARGET_S = 1.0
NO_PANDAS = 'raise ImportError("pandas hidden by benchmarks/startup.py: measuring start-up without pandas")\n'


def make_tiny_dumps(root: Path, fmt: str = "msprobe") -> tuple[Path, Path]:
    """Two one-step dumps A and B under `root`, each holding one 4-element float32 tensor `x`
    (B's differs by 1e-3): msprobe's SingleSave layout (.npy, no statistics file) or an rlprobe dump."""
    dumps = []
    for name, value in (("a", np.ones(4, np.float32)), ("b", np.full(4, 1.001, np.float32))):
        path = root / f"tiny_{fmt}_{name}"
        if fmt == "msprobe":
            d = path / "data" / "x" / "step0" / "rank0" / "micro_step0"
            d.mkdir(parents=True)
            np.save(d / "x.npy", value)
        elif fmt == "rlprobe":
            code = ("import sys, numpy as np, rlprobe\n"
                    "with rlprobe.Probe(sys.argv[1]) as p:\n"
                    f"    p.save({{'x': np.array({value.tolist()}, np.float32)}})\n"
                    "    p.step()\n")
            subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=_env(CHECKOUT, None))
        else:
            raise ValueError(f"unknown dump format {fmt!r}: msprobe or rlprobe")
        dumps.append(path)
    return dumps[0], dumps[1]


def installed_copy(checkout: Path, into: Path) -> Path:
    """A copy of `checkout`'s package and bundled folders under `into`, its modules byte-compiled
    (what `pip install` leaves: a .pyc beside each module, read at import even where
    PYTHONDONTWRITEBYTECODE forbids writing one)."""
    import compileall

    into.mkdir(parents=True)
    shutil.copytree(checkout / "rlprobe", into / "rlprobe", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("sql", "pipelines", "examples"):  # rlprobe.lake.sql_runner finds them beside the package
        if (checkout / name).is_dir():
            shutil.copytree(checkout / name, into / name)
    if not compileall.compile_dir(into / "rlprobe", quiet=1):
        raise RuntimeError(f"byte-compiling the copy of {checkout} in {into} failed")
    return into


def _env(checkout: Path, hide_pandas_dir: Path | None) -> dict[str, str]:
    paths = ([str(hide_pandas_dir)] if hide_pandas_dir else []) + [str(checkout)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def startup_seconds(checkout: Path, a: Path, b: Path, out: Path,
                    hide_pandas_dir: Path | None = None) -> tuple[float, float]:
    """(wall s, CPU s) of one `rlprobe compare a b -o out` run from `checkout`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rlprobe.cli", "compare", str(a), str(b), "-o", str(out)],
                          cwd=checkout, env=_env(checkout, hide_pandas_dir), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"rlprobe compare from {checkout} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--baseline", type=Path, help="Another checkout to measure in the same run (e.g. /work/wt-int).")
    ap.add_argument("--formats", default="msprobe,rlprobe", help="Dump formats, comma-separated.")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--json", type=Path, help="Also write the figures to this file.")
    ap.add_argument("--bytecode", action="store_true",
                    help="Measure each checkout from a byte-compiled copy of its package (as installed).")
    args = ap.parse_args(argv)
    checkouts = {"this": CHECKOUT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    sources = dict(checkouts)
    work = Path(tempfile.mkdtemp(prefix="bench-startup-", dir=args.tmp))
    try:
        if args.bytecode:
            checkouts = {who: installed_copy(path, work / f"installed-{who}") for who, path in checkouts.items()}
        hide = work / "hide_pandas"
        (hide / "pandas").mkdir(parents=True)
        (hide / "pandas" / "__init__.py").write_text(NO_PANDAS)
        load_before = os.getloadavg()
        runs: dict[str, dict[str, list[float]]] = {}
        for fmt in args.formats.split(","):
            a, b = make_tiny_dumps(work, fmt)
            for rep in range(args.repeat):
                for pandas in ("with pandas", "without pandas"):
                    order = list(checkouts) if rep % 2 == 0 else list(reversed(checkouts))
                    for who in order:
                        out = work / f"out-{fmt}-{who}-{pandas[:4]}-{rep}"
                        hidden = hide if pandas == "without pandas" else None
                        wall, cpu = startup_seconds(checkouts[who], a, b, out, hidden)
                        row = runs.setdefault(f"{fmt}, {pandas}, {who}", {"wall": [], "cpu": []})
                        row["wall"].append(wall)
                        row["cpu"].append(cpu)
                        shutil.rmtree(out, ignore_errors=True)
        report = _summary(runs, sources, load_before, os.getloadavg())
        report["bytecode"] = args.bytecode
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps({"summary": report, "runs": runs}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _summary(runs: dict[str, dict[str, list[float]]], checkouts: dict[str, Path], load_before, load_after) -> dict:
    report: dict = {"checkouts": {k: str(v) for k, v in checkouts.items()},
                    "load_average_1_5_15_min": {"before": [round(x, 2) for x in load_before],
                                                "after": [round(x, 2) for x in load_after]},
                    "medians": {}, "paired_ratio_baseline_over_this": {}, "target_wall_s": TARGET_S}
    for name, row in runs.items():
        report["medians"][name] = {k: round(statistics.median(v), 3) for k, v in row.items()}
    for name, row in runs.items():
        if name.endswith(", this") and name.replace(", this", ", baseline") in runs:
            base = runs[name.replace(", this", ", baseline")]
            report["paired_ratio_baseline_over_this"][name.removesuffix(", this")] = {
                k: round(statistics.median(b / t for b, t in zip(base[k], row[k])), 2) for k in row}
    report["target_met"] = {name.removesuffix(", this"): report["medians"][name]["wall"] <= TARGET_S
                            for name in runs if name.endswith(", this")}
    return report


if __name__ == "__main__":
    sys.exit(main())

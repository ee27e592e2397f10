"""rlprobe.cli.startup: a command that closed its outputs ends the process without interpreter
teardown, with its exit code, flushed output and exit handlers; otherwise the usual way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import atexit, sys, threading, time
import click
from rlprobe.cli.startup import outputs_closed, run

class Noisy:  # a finalizer that only interpreter teardown runs
    def __del__(self):
        sys.stdout.write(" torn-down")
        sys.stdout.flush()

keep = Noisy()
atexit.register(lambda: sys.stdout.write(" atexit-ran"))

@click.command()
@click.option("--code", type=int, default=0)
@click.option("--closed/--open", default=True)
@click.option("--thread", is_flag=True)
def cmd(code, closed, thread):
    sys.stdout.write("output")  # buffered, no newline: must be flushed
    if thread:
        threading.Thread(target=time.sleep, args=(0.3,)).start()
    if closed:
        outputs_closed()
    raise click.exceptions.Exit(code)

run(cmd)
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", PROGRAM, *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("code", [0, 1, 3])
def test_closed_outputs_end_without_teardown(code):
    done = _run("--code", str(code))
    assert done.returncode == code, done.stderr
    assert done.stdout == "output atexit-ran", done.stdout  # flushed, handlers run, no teardown


@pytest.mark.parametrize("args", [("--open",), ("--thread",)])
def test_otherwise_the_usual_teardown(args):
    done = _run("--code", "1", *args)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("output atexit-ran") and "torn-down" in done.stdout, done.stdout


def test_a_usage_error_exits_the_usual_way():
    done = _run("--code", "notanumber")
    assert done.returncode == 2 and "Invalid value" in done.stderr, done.stderr


def test_a_profiled_run_ends_the_usual_way(tmp_path):
    """python -m cProfile writes its file once the program returns: the teardown is kept."""
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(tmp_path / "prof"), str(script)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "prof").stat().st_size > 0

"""rlprobe compare's output folder: what killed comparisons leave is removed by the next one (never
a live one's folder), and an output that cannot be written is exit 3 with the earlier files kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlprobe
from rlprobe.pipeline.compare_command import compare
from rlprobe.report.output_folder import MANIFEST

# a comparison paused while it writes its files into its work folder, until killed
_PAUSED = """
import sys, time
from pathlib import Path
from rlprobe.pipeline.compare_command import compare

def pause(folder):
    Path(sys.argv[4]).write_text("paused")
    time.sleep(600)

compare(sys.argv[1], sys.argv[2], sys.argv[3], extra_files=pause)
"""


def _dump(path: Path, shift: float = 0.0) -> Path:
    with rlprobe.Probe(path) as p:
        for step in range(2):
            p.save({"log_prob": np.linspace(-2, -1, 64, dtype=np.float32) + shift * step,
                    "responses": np.arange(8) + step})
            p.step()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {"a": _dump(root / "a"), "b": _dump(root / "b", 1e-3)}


@pytest.fixture
def paused():
    """start(a, b, out) -> a process comparing into `out`, paused; killed at teardown."""
    started: list[subprocess.Popen] = []

    def start(a: Path, b: Path, out: Path) -> subprocess.Popen:
        mark = out.parent / f"paused-{len(started)}"
        proc = subprocess.Popen([sys.executable, "-c", _PAUSED, str(a), str(b), str(out), str(mark)])
        started.append(proc)
        while not mark.exists():  # waits for the process, whatever its speed; fails only if it died
            try:
                code = proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"the paused comparison exited with {code} before pausing")
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _squeezed(text: str) -> str:
    return "".join(text.split())


def _hidden(out: Path) -> set[str]:
    return {p.name for p in out.iterdir() if p.name.startswith(".")}


def _beside(out: Path) -> set[str]:
    """The work folders (and their locks) of comparisons into `out`: beside it, never in it."""
    return {p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")}


def test_rerun_removes_what_killed_comparisons_left_and_keeps_a_live_ones(tmp_path, runs, paused):
    out = tmp_path / "out"
    killed = paused(runs["a"], runs["b"], out)
    killed.kill()
    killed.wait()
    left = _beside(out)
    assert any((tmp_path / n).is_dir() for n in left) and not out.exists()  # killed before publishing
    live = paused(runs["a"], runs["b"], out)
    live_files = _beside(out) - left
    summary = compare(runs["a"], runs["b"], out)
    assert summary["first_divergence"]["key"] == "log_prob"
    assert _beside(out) == live_files  # the killed run's folder went; the live run's stayed
    assert json.loads((out / "summary.json").read_text())["first_divergence"]["step"] == 1
    live.kill()
    live.wait()
    compare(runs["a"], runs["a"], out)
    assert _beside(out) == set() and _hidden(out) == {MANIFEST}


def test_full_disk_is_exit_3_naming_out_and_keeps_the_earlier_output(tmp_path, runs, mounts):
    disk = tmp_path / "disk"
    limit = None
    if not mounts(disk, "size=512k"):
        disk.mkdir()
        limit = 4096  # without a small file system: files may not grow past 4 KiB (RLIMIT_FSIZE)
    out = disk / "out"
    compare(runs["a"], runs["a"], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    if limit is None:  # fill what is left
        fd = os.open(disk / "filler", os.O_CREAT | os.O_WRONLY)
        try:
            while True:
                os.write(fd, b"\0" * 65536)
        except OSError:
            pass
        finally:
            os.close(fd)

    def set_limit() -> None:
        if limit is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run([sys.executable, "-m", "rlprobe.cli", "compare", str(runs["a"]), str(runs["b"]),
                             "-o", str(out), "--quiet"], capture_output=True, text=True, preexec_fn=set_limit)
    message = "".join(result.stderr.split())  # compared without spaces: wrapped at any width, paths too
    assert result.returncode == 3, result.stderr
    assert _squeezed(f"error: output directory {out} cannot be written: ") in message, result.stderr
    assert _squeezed("No space left on device" if limit is None else "File too large") in message, result.stderr
    assert _squeezed("its earlier files are kept") in message and "Traceback" not in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing half-written, no leftovers

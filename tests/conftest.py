"""Shared pytest fixtures."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # Under pytest-xdist each worker, and the processes its tests start, gets its share of the cores
    # for OpenMP/BLAS thread pools (torch, numpy): on 2 cores, `-n 2` with two threads per worker ran
    # slower than one process; with one thread each, faster. Set before torch is imported.
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _share = max(1, _cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, str(_share))


#: msprobe-written dumps and msprobe's own outputs, kept in the repository (tests/fixtures/README.md)
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch):
    """Commands print to tests as to a pipe, whatever the caller's environment forces: FORCE_COLOR
    (set by many CI systems) would make rich write colour codes and a live progress bar there.
    COLUMNS stays as it is: no output may depend on it."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """Folder with the msprobe fixtures (msprobe dumps and msprobe's own comparison output)."""
    return FIXTURES


@pytest.fixture
def mounts():
    """mount(dir, options) -> bool: a tmpfs (e.g. "size=1m" for a small disk, "ro,size=1m" for a
    read-only one) at `dir`, False where mounting is not allowed; every mount made is lazily
    unmounted at teardown."""
    made: list[Path] = []

    def mount(directory: Path, options: str) -> bool:
        directory.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
                           capture_output=True, text=True)
        if r.returncode == 0:
            made.append(directory)
        return r.returncode == 0

    try:
        yield mount
    finally:
        for d in reversed(made):
            if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(d)], capture_output=True)


# PPO example runs shared by the check and compare tests: each trains once per session, also under
# xdist (the workers share a folder and a lock per run)
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ppo" / "tiny_ppo.py"


class PpoRuns:
    """ppo_runs.get(fault) -> the dump of examples/ppo/tiny_ppo.py (3 steps) with that --fault (None: clean)."""

    def __init__(self, root: Path):
        self.root = root
        spec = importlib.util.spec_from_file_location("tiny_ppo_for_check", EXAMPLE)
        self.ex = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.ex)

    def get(self, fault: str | None) -> Path:
        name = fault or "clean"
        dump = self.root / name
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{name}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (self.root / f"{name}.done").exists():
                cfg = self.ex.load_config(EXAMPLE.with_name("config.yaml"), {"ppo.steps": 3})
                self.ex.train(cfg, dump, fault)
                (self.root / f"{name}.done").touch()
        return dump


@pytest.fixture(scope="session")
def ppo_runs(tmp_path_factory) -> PpoRuns:
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return PpoRuns(root / "check_ppo_runs")

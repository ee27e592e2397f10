"""PPO example runs shared by the check tests: each trains once per session, also under xdist
(the workers share a folder and a lock per run)."""

from __future__ import annotations

import fcntl
import importlib.util
import os
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ppo" / "tiny_ppo.py"


class PpoRuns:
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

"""The bundled PPO example (examples/ppo/tiny_ppo.py) run for tests: in this process, or on 2
real gloo ranks with the same global batch, as torchrun would start it."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlprobe.demo import example_dir

REPO = Path(__file__).resolve().parents[1]


def _tiny_ppo():
    spec = importlib.util.spec_from_file_location("tiny_ppo_for_tests", example_dir() / "tiny_ppo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(out: Path, fault: str | None = None, **overrides: Any) -> Path:
    """One run in this process; `overrides`: config paths, as `--set` takes them."""
    ppo = _tiny_ppo()
    ppo.train(ppo.load_config(example_dir() / "config.yaml", overrides), str(out), fault)
    return out


def train_two_ranks(out: Path, fault: str | None = None, **overrides: Any) -> Path:
    """The same run on 2 gloo ranks (DistributedDataParallel), each rank its own process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [a for k, v in overrides.items() for a in ("--set", f"{k}={str(v).lower()}")]
    if fault is not None:
        args += ["--fault", fault]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen([sys.executable, str(example_dir() / "tiny_ppo.py"), "--out", str(out), *args],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        output = p.communicate(timeout=180)[0]
        assert p.returncode == 0, output
    return out

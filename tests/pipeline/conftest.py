"""Small dumps written through rlprobe.Probe, and helpers to write pipeline files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main


def make_dump(path: Path, *, bump: float = 0.0, tps: float = 100.0, loss_shift: float = 0.0) -> Path:
    """3 steps x 2 micro steps of responses (int) and log_prob (float); B differs from step 2 by `bump`."""
    with rlprobe.Probe(path, rank=0, world_size=1) as p:
        for step in range(3):
            for micro in range(2):
                p.save({"responses": np.arange(6) + micro,
                        "log_prob": np.linspace(-2.0, -1.0, 8, dtype=np.float32) + (bump if step == 2 else 0.0)})
            p.log_metrics({"e2e_tps": tps, "loss": 1.0 + step + loss_shift, "timing/update": 2.0})
            p.step()
    return path


@pytest.fixture(scope="session")
def dumps(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pipeline_dumps")
    return {"a": make_dump(root / "a"), "same": make_dump(root / "same"),
            "b": make_dump(root / "b", bump=1e-3, tps=90.0)}


def _write_yaml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _cli(*args) -> "object":
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def write_yaml():
    return _write_yaml


@pytest.fixture
def cli():
    return _cli

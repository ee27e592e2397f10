"""A few steps of key data, a config and a metric: the dump the readers' tests break one file of."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import rlprobe


def small_dump(path: Path, steps: int, responses: bool = False) -> Path:
    """`steps` steps of log_prob (8 float32), with `responses` 4 integers a step too, and a loss a step."""
    with rlprobe.Probe(path) as p:
        p.save_config({"lr": 0.1})
        for step in range(steps):
            data = {"log_prob": np.linspace(-2, -1, 8, dtype=np.float32) + step}
            if responses:
                data["responses"] = np.arange(4) + step
            p.save(data)
            p.log_metrics({"loss": float(step)})
            p.step()
    return path

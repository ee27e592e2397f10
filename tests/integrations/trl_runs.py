"""Trained TRL runs shared by the integration tests: each run trains once per test session, also
under pytest-xdist (the workers share a folder and a lock per run; the second worker to want a
run reuses the first one's dump)."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo" / "train_grpo.py"


def example() -> Any:
    """examples/trl_grpo/train_grpo.py as a module (it imports its tiny.py from beside itself)."""
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Runs:
    """`runs.get(name, **how)`: the dump of a run trained by examples/trl_grpo with `how`."""

    def __init__(self, root: Path):
        self.root = root
        self.ex = example()
        self.model_dir = root / "tiny_qwen2"
        with locked(root / "tiny_qwen2.lock"):
            self.ex.tiny.build_model_dir(self.model_dir)

    def get(self, name: str, fault: str | None = None, probe: bool = True, **overrides: Any) -> Path:
        """`fault_<name>` runs plant the example's fault of that name (underscores for dashes)."""
        if fault is None and name.startswith("fault_"):
            fault = name[len("fault_"):].replace("_", "-")
        dump = self.root / name
        with locked(self.root / f"{name}.lock"):
            if not (dump / "DONE").exists():
                shutil.rmtree(dump, ignore_errors=True)
                trainer = self.ex.train(self.ex.load_config(overrides=overrides), out=dump, fault=fault,
                                        model_dir=self.model_dir, probe=probe)
                history = [h for h in trainer.state.log_history if "loss" in h]
                losses = [repr(h["loss"]) for h in history]
                dump.mkdir(parents=True, exist_ok=True)
                (dump / "losses.txt").write_text("\n".join(losses), encoding="utf-8")
                import torch

                torch.save({k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
                           dump / "final_weights.pt")
                (dump / "DONE").write_text("", encoding="utf-8")
        return dump

"""The dumps that benchmarks/compare_speed.py compares (issue 18): many small tensors.

- ``msprobe_small``: msprobe-format (SingleSave) dumps of 100 steps x 4 micro-batches x 8 keys, four of
  [4, 64] and four of [4, 512] float32 (3,200 pairs, ~47 MB for both runs); run B differs in one key from
  step 50 on.
- ``rlprobe_small``: rlprobe dumps of 200 steps x 8 ranks x 16 keys of 4 x 64 float32 (25,600 pairs),
  written by real ``rlprobe.Probe`` objects, one per rank; run B differs in one key from step 100 on.
- ``tiny``: one step, one 4-element tensor in each run (the command's start-up).
- ``large``: msprobe-format dumps of 8 keys (four float32 256 x 4096, token ids 256 x 4096 stored as
  float32, prompts 256 x 512, two 0-d losses) x 8 steps x 4 micro-batches, ~660 MB each; run B differs
  in log_prob from step 4 on.

Each is written once into a cache folder and reused while its parameters are unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

MS_STEPS, MS_MICRO = 100, 4
MS_KEYS = {f"small{i}": (4, 64) for i in range(4)} | {f"wide{i}": (4, 512) for i in range(4)}
RL_STEPS, RL_RANKS, RL_KEYS = 200, 8, 16


def _cached(root: Path, params: dict, write) -> Path:
    """`root`, written by `write(folder)` unless the cache holds it with these parameters; written into
    a folder of its own and renamed, so that two benchmarks sharing a cache never see half a dump."""
    marker = root.with_suffix(".json")
    if root.exists() and marker.exists() and json.loads(marker.read_text()) == params:
        return root
    fresh = root.with_name(f".{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    write(fresh)
    marker.unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    fresh.rename(root)
    marker.write_text(json.dumps(params))
    return root


def write_msprobe_entry(root: Path, key: str, step: int, micro: int, value: np.ndarray) -> None:
    """One tensor as msprobe's SingleSave writes it: the .npy beside a JSON of its statistics."""
    d = root / "data" / key / f"step{step}" / "rank0" / f"micro_step{micro}"
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / f"{key}.npy", value)
    stats = {"max": float(value.max()), "min": float(value.min()), "mean": float(value.mean()),
             "norm": float(np.linalg.norm(value)), "shape": list(value.shape)}
    (d / f"{key}.json").write_text(json.dumps({"data": stats}, indent=4))


def _msprobe_run(root: Path, perturb_from: int | None) -> None:
    rng = np.random.default_rng(0)
    for step in range(MS_STEPS):
        for micro in range(MS_MICRO):
            for key, shape in MS_KEYS.items():
                value = rng.standard_normal(shape, dtype=np.float32)
                if perturb_from is not None and key == "small1" and step >= perturb_from:
                    value = value + np.float32(1e-4)
                write_msprobe_entry(root, key, step, micro, value)


def msprobe_small(cache: Path) -> tuple[Path, Path]:
    params = {"steps": MS_STEPS, "micro": MS_MICRO, "keys": {k: list(v) for k, v in MS_KEYS.items()}, "v": 1}
    a = _cached(cache / "ms_small_a", params, lambda p: _msprobe_run(p, None))
    b = _cached(cache / "ms_small_b", params, lambda p: _msprobe_run(p, MS_STEPS // 2))
    return a, b


def _rlprobe_rank(root: Path, rank: int, perturb_from: int | None, ranks: int = RL_RANKS) -> None:
    import rlprobe

    rng = np.random.default_rng(rank)
    keys = [f"key{k:02d}" for k in range(RL_KEYS)]
    with rlprobe.Probe(str(root), rank=rank, world_size=ranks, run_id="bench-small", flush_interval=0) as p:
        for step in range(RL_STEPS):
            batch = {k: rng.standard_normal((4, 64), dtype=np.float32) for k in keys}
            if perturb_from is not None and step >= perturb_from:
                batch["key03"] = batch["key03"] + np.float32(1e-4)
            p.save(batch)
            p.step()


def _rlprobe_run(root: Path, perturb_from: int | None, ranks: int = RL_RANKS) -> None:
    for rank in range(ranks):  # rank 0 first: it writes the run manifest
        _rlprobe_rank(root, rank, perturb_from, ranks)


def rlprobe_small(cache: Path, ranks: int = RL_RANKS) -> tuple[Path, Path]:
    """The rlprobe_small pair of dumps; `ranks` other than 8 (benchmarks/compare_scaling.py) gives as many
    pairs per rank in dumps of their own."""
    params = {"steps": RL_STEPS, "ranks": ranks, "keys": RL_KEYS, "shape": [4, 64], "v": 1}
    name = "rl_small" if ranks == RL_RANKS else f"rl_small_r{ranks}"
    a = _cached(cache / f"{name}_a", params, lambda p: _rlprobe_run(p, None, ranks))
    b = _cached(cache / f"{name}_b", params, lambda p: _rlprobe_run(p, RL_STEPS // 2, ranks))
    return a, b


def tiny(cache: Path) -> tuple[Path, Path]:
    def write(root: Path) -> None:
        d = root / "data" / "x" / "step0" / "rank0" / "micro_step0"
        d.mkdir(parents=True)
        np.save(d / "x.npy", np.ones(4, np.float32))

    return _cached(cache / "tiny_a", {"v": 1}, write), _cached(cache / "tiny_b", {"v": 1}, write)


LARGE_KEYS = {"log_prob": (256, 4096), "old_log_prob": (256, 4096), "ref_log_prob": (256, 4096),
              "advantages": (256, 4096), "responses": (256, 4096), "prompts": (256, 512), "kl_loss": (),
              "loss": ()}
LARGE_STEPS, LARGE_MICRO = 8, 4


def _large_run(root: Path, perturb_from: int | None) -> None:
    rng = np.random.default_rng(0)
    for step in range(LARGE_STEPS):
        for micro in range(LARGE_MICRO):
            for key, shape in LARGE_KEYS.items():
                if key in ("responses", "prompts"):
                    value = rng.integers(0, 50000, shape).astype(np.float32)
                else:
                    value = rng.standard_normal(shape, dtype=np.float32)
                if perturb_from is not None and key == "log_prob" and step >= perturb_from:
                    value = value + np.float32(1e-4)
                write_msprobe_entry(root, key, step, micro, value)


def large(cache: Path) -> tuple[Path, Path]:
    params = {"steps": LARGE_STEPS, "micro": LARGE_MICRO, "keys": {k: list(v) for k, v in LARGE_KEYS.items()},
              "v": 1}
    return (_cached(cache / "large_a", params, lambda p: _large_run(p, None)),
            _cached(cache / "large_b", params, lambda p: _large_run(p, 4)))

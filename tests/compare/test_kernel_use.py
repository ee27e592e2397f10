"""rlprobe.comparison.small_pairs: whether `rlprobe compare` loads numba ahead, from run A's files."""

from __future__ import annotations

import numpy as np

import rlprobe
from rlprobe.comparison.small_pairs import may_run_compiled_kernels


def _msprobe(path, tensors: dict[str, np.ndarray]):
    for key, value in tensors.items():
        d = path / "data" / key / "step0" / "rank0" / "micro_step0"
        d.mkdir(parents=True)
        np.save(d / f"{key}.npy", value)
    return rlprobe.open(path)


def _rlprobe(path, tensors: dict[str, np.ndarray], stats_only: bool = False):
    with rlprobe.Probe(path, stats_only=stats_only) as p:
        p.save(tensors)
        p.step()
    return rlprobe.open(path)


def test_a_few_small_tensors_need_no_numba(tmp_path):
    small = {f"k{i}": np.ones(7, np.float64) for i in range(15)}  # 15 files of 7 float64: numpy compares them
    assert not may_run_compiled_kernels(_msprobe(tmp_path / "m", small))
    assert not may_run_compiled_kernels(_rlprobe(tmp_path / "r", small))


def test_many_files_or_a_larger_one_load_numba(tmp_path):
    many = {f"k{i}": np.ones(1, np.float32) for i in range(16)}  # batches run compiled code from 16 pairs on
    assert may_run_compiled_kernels(_msprobe(tmp_path / "m1", many))
    assert may_run_compiled_kernels(_rlprobe(tmp_path / "r1", many))
    larger = {"x": np.ones(8, np.float64)}  # one chunk of 8 elements: the compiled kernel
    assert may_run_compiled_kernels(_msprobe(tmp_path / "m2", larger))
    assert may_run_compiled_kernels(_rlprobe(tmp_path / "r2", larger))


def test_statistics_only_needs_no_numba(tmp_path):
    assert not may_run_compiled_kernels(_rlprobe(tmp_path / "s", {"x": np.ones(4096, np.float32)}, stats_only=True))


def test_a_dump_too_large_to_walk_says_yes(tmp_path):
    root = tmp_path / "wide"
    for i in range(600):  # more entries than the walk looks at, none of them a tensor
        (root / "data" / f"d{i}").mkdir(parents=True)
    (root / "data" / "d0" / "x.npy").write_bytes(b"")
    assert may_run_compiled_kernels(type("D", (), {"format": "msprobe", "path": root})())
    small = tmp_path / "small"
    (small / "data").mkdir(parents=True)
    assert not may_run_compiled_kernels(type("D", (), {"format": "msprobe", "path": small})())

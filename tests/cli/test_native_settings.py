"""rlprobe.cli.startup: the `rlprobe` command sets the native libraries' environment before they
load (mimalloc's transparent huge pages off, numpy's OpenBLAS on one thread), never over a value the
user set and never for a library already loaded; and the libraries do read what it sets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

import rlprobe
from rlprobe.cli.startup import SETTINGS, command_line_settings

ROOT = Path(__file__).resolve().parents[1]


# what else bounds OpenBLAS's threads (the suite's conftest sets OMP_NUM_THREADS under pytest-xdist)
_BLAS_THREADS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in SETTINGS and k not in _BLAS_THREADS and not k.startswith("MIMALLOC_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def test_only_variables_the_user_left_unset_for_libraries_not_yet_loaded():
    assert command_line_settings({}, {}) == {"MIMALLOC_ALLOW_THP": "0", "OPENBLAS_NUM_THREADS": "1"}
    assert command_line_settings({"MIMALLOC_ALLOW_THP": "1"}, {}) == {"OPENBLAS_NUM_THREADS": "1"}
    assert command_line_settings({}, {"numpy": object()}) == {"MIMALLOC_ALLOW_THP": "0"}
    assert command_line_settings({}, {"numpy": object(), "pyarrow": object()}) == {}


def _dump(path: Path) -> Path:
    with rlprobe.Probe(path) as p:
        p.save({"log_prob": np.linspace(-2, -1, 8, dtype=np.float32)})
        p.step()
    return path


def test_the_command_turns_pyarrow_s_huge_pages_off_unless_the_user_chose(tmp_path):
    """pyarrow's allocator (mimalloc on Linux wheels) prints its options with MIMALLOC_VERBOSE=1:
    under `rlprobe compare` allow_thp is 0; a value the user set is kept."""
    assert pa.default_memory_pool().backend_name == "mimalloc"  # what the setting is for
    a, b = _dump(tmp_path / "a"), _dump(tmp_path / "b")
    for user, expected in ((None, "0"), ("1", "1")):
        extra = {"MIMALLOC_VERBOSE": "1"} | ({"MIMALLOC_ALLOW_THP": user} if user else {})
        out = tmp_path / f"out-{user}"
        done = subprocess.run([sys.executable, "-m", "rlprobe.cli", "compare", str(a), str(b), "-o", str(out),
                               "--quiet"], env=_env(**extra), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"option 'allow_thp': {expected}" in done.stderr, done.stderr[:3000]
        assert (out / "report.xlsx").is_file()


def test_numpy_starts_no_blas_threads_under_the_command_s_settings():
    """OpenBLAS reads OPENBLAS_NUM_THREADS when numpy loads: after apply_for_command_line the process
    has only its main thread once numpy is imported (without it, one thread a core)."""
    program = ("from rlprobe.cli.startup import apply_for_command_line; apply_for_command_line(); "
               "import numpy, os; print(len(os.listdir('/proc/self/task')))")
    done = subprocess.run([sys.executable, "-c", program], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    if (os.cpu_count() or 1) > 1:  # the test would pass without the setting on one core
        bare = subprocess.run([sys.executable, "-c", "import numpy, os; print(len(os.listdir('/proc/self/task')))"],
                              env=_env(), capture_output=True, text=True, timeout=120)
        assert int(bare.stdout.strip()) > 1, "numpy starts no BLAS threads here: the test shows nothing"

"""rlprobe.numba_cache: every kernel is cached in one user folder, whoever imported numba first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, cache_home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    # RLPROBE_AOT=0: these are about numba's JIT cache (and build no ahead-of-time module in tmp_path)
    env.update(XDG_CACHE_HOME=str(cache_home), PYTHONPATH=str(ROOT), NUMBA_DEBUG_CACHE="1", RLPROBE_AOT="0")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_kernels_cache_in_the_user_folder_when_numba_was_imported_first(tmp_path):
    code = ("import numba, numpy as np\n"  # a user's process that loaded numba before rlprobe
            "from rlprobe.comparison.pair_kernels import kernel_for\n"
            "x = np.arange(3, dtype=np.int64)\n"
            "print(kernel_for(np.dtype(np.int64))(x, x, 0, 3)[1])\n")
    first = _run(code, tmp_path / "cache")
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.strip().splitlines()[-1] == "3.0"  # a count, as the kernels return it: float64
    folder = tmp_path / "cache" / "rlprobe" / "numba"
    assert any(folder.rglob("pair_kernels._int_kernel-*.nbi")), sorted(folder.rglob("*"))
    second = _run(code, tmp_path / "cache")  # a second process loads the kernel instead of compiling it
    assert second.returncode == 0, second.stderr[-2000:]
    log = second.stdout  # NUMBA_DEBUG_CACHE prints to stdout
    assert "data loaded from" in log and "_int_kernel" in log and "data saved to" not in log


def test_a_users_numba_cache_dir_is_left_alone(tmp_path):
    code = ("import os, numba\n"
            "import rlprobe.checks.token_kernel\n"
            "from numba.core import config\n"
            "print(os.environ['NUMBA_CACHE_DIR'], config.CACHE_DIR)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "mine")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(tmp_path / "mine")] * 2


def test_compare_compiles_only_the_kernels_its_pairs_run(tmp_path):
    """A cold cache: comparing float32 tensors compiles the float kernel, never the integer one
    (seconds each); numba itself is loaded ahead, in a thread, while the statistics are read.
    (100 elements: tensors under numpy_kernels.SEQUENTIAL_BELOW are compared without numba.)"""
    import numpy as np

    for name, value in (("a", 1.0), ("b", 2.0)):
        d = tmp_path / name / "data" / "x" / "step0" / "rank0" / "micro_step0"
        d.mkdir(parents=True)
        np.save(d / "x.npy", np.full(100, value, np.float32))
    code = ("import threading\nfrom rlprobe.cli import main\ntry:\n"
            f"    main(['compare', {str(tmp_path / 'a')!r}, {str(tmp_path / 'b')!r},"
            f" '-o', {str(tmp_path / 'out')!r}])\n"
            "finally:  # the warm-up thread too has finished what it does\n"
            "    [t.join() for t in threading.enumerate() if t.name == 'rlprobe-warm-up']\n")
    done = _run(code, tmp_path / "cache")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 mismatch" in done.stdout
    cached = {p.name.split("-")[0] for p in (tmp_path / "cache" / "rlprobe" / "numba").rglob("*.nbi")}
    assert "pair_kernels._float_kernel" in cached and "pair_kernels._int_kernel" not in cached, cached


def test_loading_numba_in_a_thread_while_a_kernel_loads(tmp_path):
    """`rlprobe compare` loads numba in a thread while the first pair may load its kernel: the two
    refreshed numba's registries at once ("ValueError: generator already executing")."""
    code = ("import threading, numpy as np\n"
            "from rlprobe.numba_cache import load_numba\n"
            "errors = []\n"
            "threading.excepthook = lambda args: errors.append(repr(args.exc_value))\n"
            "t = threading.Thread(target=load_numba)\n"
            "t.start()\n"
            "from rlprobe.comparison.pair_kernels import kernel_for\n"
            "x = np.arange(100, dtype=np.float32)\n"
            "n = kernel_for(np.dtype(np.float32))(x, x, 0, 100)[1]\n"
            "t.join()\n"
            "print(n, errors)\n")
    cache = tmp_path / "cache"
    _run(code, cache)  # compiles the kernel: the runs below load it from the cache, the fast path that raced
    for _ in range(4):
        done = _run(code, cache)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "100.0 []", done.stdout[-2000:]


def test_every_module_with_kernels_names_the_cache_folder():
    """numba checks a cached kernel against its own file only: every module defining kernels is in
    KERNEL_MODULES, so a change to any of them gives a fresh cache folder."""
    from rlprobe.numba_cache import KERNEL_MODULES

    package = ROOT / "rlprobe"
    with_kernels = {str(p.relative_to(package)) for p in package.rglob("*.py")
                    if "numba.njit" in p.read_text(encoding="utf-8") or "@njit" in p.read_text(encoding="utf-8")}
    assert with_kernels and with_kernels <= set(KERNEL_MODULES), sorted(with_kernels - set(KERNEL_MODULES))
    assert all((package / m).is_file() for m in KERNEL_MODULES)


def test_a_changed_kernel_source_gets_a_new_cache_folder(tmp_path):
    """batch_kernels compiles pair_kernels' element kernel into its batch: after only pair_kernels.py
    changed, numba would load the batch with the old element kernel from its cache."""
    import shutil

    from rlprobe.numba_cache import KERNEL_MODULES, kernel_sources_digest

    copy = tmp_path / "rlprobe"
    for name in KERNEL_MODULES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "rlprobe" / name, copy / name)
    before = kernel_sources_digest(str(copy))
    assert before == kernel_sources_digest()
    with open(copy / "comparison" / "pair_kernels.py", "a", encoding="utf-8") as f:
        f.write("\n# changed\n")
    assert kernel_sources_digest(str(copy)) != before


def test_a_cached_kernel_loads_without_numbas_registries_and_a_compilation_after_it_works(tmp_path):
    """A kernel found in the cache is loaded without installing numba's lowering registries (~0.4 s of
    CPU: numba.np.arraymath among them); a kernel compiled later in the same process (the cache cold for
    it) installs them then and gives the right result, and so does one more call of the cached one."""
    warm = ("import numpy as np\n"
            "from rlprobe.comparison.pair_kernels import kernel_for\n"
            "x = np.arange(100, dtype=np.float32)\n"
            "print(kernel_for(np.dtype(np.float32))(x, x[::-1].copy(), 0, 100)[3])\n")
    assert _run(warm, tmp_path / "cache").returncode == 0  # compiles the float kernel into the cache
    code = warm + ("import sys\n"
                   "print('numba.np.arraymath' in sys.modules)\n"
                   "i = np.arange(5, dtype=np.int64)\n"
                   "print(kernel_for(np.dtype(np.int64))(i, i + 2, 0, 5)[3])\n"  # not cached: compiled here
                   "print('numba.np.arraymath' in sys.modules)\n"
                   "print(kernel_for(np.dtype(np.float32))(x, x + 1, 0, 100)[1])\n")
    done = _run(code, tmp_path / "cache")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if not line.startswith("[cache]")]
    assert lines == ["99.0", "False", "2.0", "True", "0.0"], done.stdout[-3000:]
    assert "pair_kernels._float_kernel" in done.stdout and "data loaded from" in done.stdout

"""Ahead-of-time compiled kernels (rlprobe.numba_cache.compiled_module, rlprobe/numba_build.py): the same bits
as numba's JIT kernels, the JIT path when none is built or a build failed, one build at a time, and a
cache folder named after everything that shapes the machine code."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def aot_compare():
    """The compare family's module, built in the user's cache once (kept there for later runs and commands:
    a test run pays no build per process, and none where an earlier run or command built it)."""
    from rlprobe.numba_build import build
    from rlprobe.numba_cache import aot_folder, aot_module_name

    path = build("compare")
    if path is None and shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: rlprobe keeps numba's JIT kernels (tested below)")
    assert path is not None, open(os.path.join(aot_folder(), "compare.failed")).read()
    import importlib.util

    spec = importlib.util.spec_from_file_location(aot_module_name("compare"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bits(values) -> list[bytes]:
    return [np.float64(v).tobytes() if isinstance(v, float) else int(v).to_bytes(8, "little", signed=True)
            for v in values]


def _pairs(dtype, rng):
    """Pairs that reach every branch: lengths around the vector width and the block (2,048), ranges
    starting inside a block, equal runs, NaN, ±inf, -0.0, denormals, overflowing float64 differences."""
    for n in (1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65, 2047, 2048, 2049, 6000, 70001):
        a = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4)).astype(dtype)
        b = (a * (1 + rng.standard_normal(n) * 1e-3)).astype(dtype)
        b[: n // 3] = a[: n // 3]
        yield a, b
        if np.issubdtype(dtype, np.floating) and n >= 9:
            c = b.copy()
            c[n // 2] = np.nan
            c[n // 4] = -np.inf
            c[-1] = -0.0
            c[n // 5] = np.finfo(dtype).tiny / 4
            d = a.copy()
            d[n // 4] = np.finfo(dtype).max
            d[n // 3] = -np.finfo(dtype).max
            yield d, c
        if dtype == np.int64:
            yield (rng.integers(-2 ** 62, 2 ** 62, n), rng.integers(-2 ** 62, 2 ** 62, n))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_the_ahead_of_time_element_kernel_gives_the_jit_kernels_bits(aot_compare, dtype):
    from rlprobe.compare.compiled import _PAIR_EXPORTS
    from rlprobe.compare.pair_kernels import kernel_for

    aot, jit = getattr(aot_compare, _PAIR_EXPORTS[np.dtype(dtype)]), kernel_for(np.dtype(dtype))
    rng = np.random.default_rng(18)
    checked = 0
    for a, b in _pairs(dtype, rng):
        n = a.size
        for start, stop in ((0, n), (n // 3, n), (n // 7, n - n // 5)):
            assert _bits(aot(a, b, start, stop)) == _bits(jit(a, b, start, stop)), (dtype, n, start, stop)
            checked += 1
    assert checked > 40


def test_the_ahead_of_time_batch_gives_the_jit_batchs_bits(aot_compare, tmp_path):
    from rlprobe.compare import batch_kernels
    from rlprobe.compare.small_pairs import _path_bytes

    rng = np.random.default_rng(7)
    paths = []
    for i, (a, b) in enumerate(p for dtype in (np.float32, np.float64, np.int64) for p in _pairs(dtype, rng)):
        for side, x in (("a", a), ("b", b)):
            np.save(tmp_path / f"{i}{side}.npy", x)
        paths.append((tmp_path / f"{i}a.npy", tmp_path / f"{i}b.npy"))
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    paths.append((tmp_path / "bad.npy", tmp_path / "missing.npy"))
    names, starts = _path_bytes([p[0] for p in paths] + [p[1] for p in paths])
    n = len(paths)
    out = []
    for functions in (aot_compare, batch_kernels):
        info, sizes = np.zeros((2 * n, 4), np.int64), np.empty(2 * n, np.int64)
        buf = functions.read_files(names, starts, 1 << 20, info, sizes)
        picked = np.flatnonzero((info[:n, 0] == 0) & (info[:n, 1] == info[n:, 1]))
        ints, floats = np.empty((picked.size, 6), np.int64), np.empty((picked.size, 5), np.float64)
        functions.compare_batch(buf, info, picked, picked + n, ints, floats)
        out.append((info.tobytes(), sizes.tobytes(), ints.tobytes(), floats.tobytes()))  # buf: padding not set
    assert out[0] == out[1]
    assert picked.size == n - 1  # all but the unreadable pair


def test_compare_uses_the_built_module_without_importing_numba(aot_compare, tmp_path):
    """A comparison of larger tensors (the compiled kernels) in a fresh process: with the module built,
    numba is never imported and the kernels load in well under 50 ms of CPU."""
    code = ("import sys, time\nimport numpy as np\n"
            "t = time.thread_time()\n"
            "from rlprobe.compare.pair_metrics import pair_metrics\n"
            "from rlprobe.compare.small_pairs import warm_up\n"
            "warm_up()\n"
            "m = pair_metrics(np.arange(1000, dtype=np.float32), np.arange(1000, dtype=np.float32) + 1)\n"
            "print(m['numel'], 'numba' in sys.modules, time.thread_time() - t)\n")
    done = _python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    numel, numba_loaded, _ = done.stdout.split()
    assert (numel, numba_loaded) == ("1000", "False")


def _folder_code(body: str) -> str:
    return "from rlprobe.numba_cache import aot_folder, compiled_module\nfolder = aot_folder(create=True)\n" + body


def test_a_failed_build_leaves_the_jit_kernels_and_is_not_retried_by_commands(tmp_path):
    """A build that fails (here: an export that does not exist, as a numba whose internals moved would)
    writes <family>.failed with the reason; commands then use numba's JIT kernels, start no build, and
    compare the same."""
    code = _folder_code(
        "import os, numpy as np\n"
        "from rlprobe import numba_cache\n"
        "from rlprobe.numba_build import build\n"
        "numba_cache.AOT_FAMILIES['compare'] = (('pair_f4', 'rlprobe.compare.pair_kernels', 'no_such_kernel',\n"
        "                                        '(int64,)'),)\n"
        "numba_cache._aot_key.clear()\n"
        "folder = numba_cache.aot_folder(create=True)\n"
        "print(build('compare'))\n"
        "print('no_such_kernel' in open(os.path.join(folder, 'compare.failed')).read())\n"
        "print(compiled_module('compare'))\n"
        "from rlprobe.compare.pair_metrics import pair_metrics\n"
        "print(pair_metrics(np.arange(100.0), np.arange(100.0))['equal_count'])\n"
        "print(sorted(os.listdir(folder)))\n")
    done = _python(code, XDG_CACHE_HOME=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:5] == ["None", "True", "None", "100", "['compare.failed', 'compare.lock']"]


def test_no_build_starts_while_one_holds_the_lock_nor_with_rlprobe_aot_0(tmp_path):
    """A second process finds the lock held (a build running): it starts none and uses the JIT kernels;
    `build(wait=False)` gives up at once. RLPROBE_AOT=0 neither loads nor builds."""
    locate = _python(_folder_code("print(folder)\n"), XDG_CACHE_HOME=str(tmp_path))
    folder = Path(locate.stdout.strip())
    code = _folder_code("import os\nfrom rlprobe.numba_build import build\n"
                        "print(compiled_module('compare'), build('compare', wait=False), sorted(os.listdir(folder)))\n")
    with open(folder / "compare.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = _python(code, XDG_CACHE_HOME=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "None None ['compare.lock']"
    (folder / "compare.lock").unlink()
    off = _python(_folder_code("import os\nprint(compiled_module('compare'), os.listdir(folder))\n"),
                  XDG_CACHE_HOME=str(tmp_path), RLPROBE_AOT="0")
    assert off.stdout.strip() == "None []", off.stderr[-2000:]


def test_the_folder_is_named_after_the_sources_numba_settings_and_cpu(tmp_path):
    """Another kernel source, another NUMBA_* setting (NUMBA_OPT changes the JIT's code) or another build
    recipe give another folder; numba's cache folder and its debug output do not."""
    code = "from rlprobe.numba_cache import aot_key\nprint(aot_key())\n"
    plain = _python(code).stdout.strip()
    assert plain and _python(code).stdout.strip() == plain
    assert _python(code, NUMBA_OPT="1").stdout.strip() != plain
    assert _python(code, NUMBA_CACHE_DIR=str(tmp_path), NUMBA_DEBUG_CACHE="1").stdout.strip() == plain
    copy = tmp_path / "rlprobe"
    shutil.copytree(ROOT / "rlprobe", copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "compare" / "batch_kernels.py", "a", encoding="utf-8") as f:
        f.write("\n# changed\n")
    changed = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)  # not this checkout
    assert changed.stdout.strip() not in ("", plain), changed.stderr[-2000:]

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

from rlprobe.comparison.partials import WIDTH

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=600)


def _built(family: str):
    """The family's module, built in the user's cache once (kept there for later runs and commands: a test run
    pays no build per process, and none where an earlier run or command built it)."""
    from rlprobe.numba_build import build
    from rlprobe.numba_cache import aot_folder, aot_module_name

    path = build(family)
    if path is None and shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: rlprobe keeps numba's JIT kernels (tested below)")
    assert path is not None, open(os.path.join(aot_folder(), f"{family}.failed")).read()
    import importlib.util

    spec = importlib.util.spec_from_file_location(aot_module_name(family), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def aot_compare():
    return _built("compare")


@pytest.fixture(scope="session")
def aot_check():
    return _built("check")


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
    from rlprobe.comparison.pair_metrics import _PAIR_EXPORTS
    from rlprobe.comparison.pair_kernels import kernel_for

    aot, jit = getattr(aot_compare, _PAIR_EXPORTS[np.dtype(dtype)]), kernel_for(np.dtype(dtype))
    rng = np.random.default_rng(18)
    checked = 0
    for a, b in _pairs(dtype, rng):
        n = a.size
        for start, stop in ((0, n), (n // 3, n), (n // 7, n - n // 5)):
            assert _bits(aot(a, b, start, stop)) == _bits(jit(a, b, start, stop)), (dtype, n, start, stop)
            checked += 1
    assert checked > 40


def _pair_files(tmp_path, seed):
    """_pairs of the three dtypes saved as .npy files, and an unreadable pair last: (paths, their starts, pairs)."""
    from rlprobe.comparison.small_pairs import path_bytes

    rng = np.random.default_rng(seed)
    paths = []
    for i, (a, b) in enumerate(p for dtype in (np.float32, np.float64, np.int64) for p in _pairs(dtype, rng)):
        for side, x in (("a", a), ("b", b)):
            np.save(tmp_path / f"{i}{side}.npy", x)
        paths.append((tmp_path / f"{i}a.npy", tmp_path / f"{i}b.npy"))
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    paths.append((tmp_path / "bad.npy", tmp_path / "missing.npy"))
    names, starts = path_bytes([p[0] for p in paths] + [p[1] for p in paths])
    return names, starts, len(paths)


def test_the_ahead_of_time_batch_gives_the_jit_batchs_bits(aot_compare, tmp_path):
    from rlprobe.comparison import batch_kernels

    names, starts, n = _pair_files(tmp_path, 7)
    out = []
    for functions in (aot_compare, batch_kernels):
        info, sizes = np.zeros((2 * n, 4), np.int64), np.empty(2 * n, np.int64)
        whole = np.zeros(2 * n, np.int64), np.full(2 * n, -1, np.int64)  # offsets 0, lengths -1: whole files
        buf = functions.read_files(names, starts, *whole, 1 << 20, info, sizes)
        picked = np.flatnonzero((info[:n, 0] == 0) & (info[:n, 1] == info[n:, 1]))
        rows = np.empty((picked.size, WIDTH), np.float64)
        functions.compare_batch(buf, info, picked, picked + n, rows)
        out.append((info.tobytes(), sizes.tobytes(), rows.tobytes()))  # buf: padding not set
    assert out[0] == out[1]
    assert picked.size == n - 1  # all but the unreadable pair


def test_the_ahead_of_time_mapped_pairs_give_the_jit_kernels_bits(aot_compare, tmp_path):
    """mapped_kernels.compare_mapped (larger pairs, mapped, chunk by chunk: chunks of 3,000 elements here) built
    ahead of time gives the JIT's partials and codes, bit for bit, and leaves unreadable pairs to the per-pair path."""
    from rlprobe.comparison import mapped_kernels

    names, starts, n = _pair_files(tmp_path, 8)
    first_row = np.arange(n + 1, dtype=np.int64) * 30
    out = []
    for function in (aot_compare.compare_mapped, mapped_kernels.compare_mapped):
        info = np.zeros((n, 4), np.int64)
        rows = np.zeros((30 * n, WIDTH), np.float64)
        function(names, starts, np.zeros(2 * n, np.int64), np.full(2 * n, -1, np.int64), 1 << 40, 3000, info, first_row,
                 rows)
        out.append((info.tobytes(), rows.tobytes()))
    assert out[0] == out[1]
    assert (info[:-1, 0] == 0).all() and info[-1, 0] == 1 and info[:, 3].max() == 24  # 70,001 elements: 24 chunks


def test_compare_uses_the_built_module_without_importing_numba(aot_compare, tmp_path):
    """A comparison of larger tensors (the compiled kernels) in a fresh process: with the module built,
    numba is never imported and the kernels load in well under 50 ms of CPU."""
    code = ("import sys, time\nimport numpy as np\n"
            "t = time.thread_time()\n"
            "from rlprobe.comparison.pair_metrics import pair_metrics\n"
            "from rlprobe.comparison.small_pairs import warm_up\n"
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
        "numba_cache.AOT_FAMILIES['compare'] = (('pair_f4', 'rlprobe.comparison.pair_kernels', 'no_such_kernel',\n"
        "                                        '(int64,)'),)\n"
        "numba_cache._aot_key.clear()\n"
        "folder = numba_cache.aot_folder(create=True)\n"
        "print(build('compare'))\n"
        "print('no_such_kernel' in open(os.path.join(folder, 'compare.failed')).read())\n"
        "print(compiled_module('compare'))\n"
        "from rlprobe.comparison.pair_metrics import pair_metrics\n"
        "print(pair_metrics(np.arange(100.0), np.arange(100.0))['equal_count'])\n"
        "print(sorted(os.listdir(folder)))\n")
    done = _python(code, XDG_CACHE_HOME=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:5] == ["None", "True", "None", "100", "['compare.failed', 'compare.lock']"]


def test_a_module_built_after_a_process_looked_is_taken_by_its_next_call(aot_compare, tmp_path):
    """A process that found no module (its build left to the background, here none started: a failed one) uses
    the JIT kernels; once the module is in the folder, its next call takes it (a long pipeline or notebook,
    and this suite's workers, which look before the fixtures build), and keeps it."""
    code = _folder_code(
        "import os, shutil\n"
        "open(os.path.join(folder, 'compare.failed'), 'w').close()  # no background build from this process\n"
        "print(compiled_module('compare'), compiled_module('compare'))\n"
        f"shutil.copy({aot_compare.__file__!r}, folder)\n"
        "taken = compiled_module('compare')\n"
        "print(taken is not None and taken is compiled_module('compare'))\n")
    done = _python(code, XDG_CACHE_HOME=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["None None", "True"]


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
    with open(copy / "comparison" / "batch_kernels.py", "a", encoding="utf-8") as f:
        f.write("\n# changed\n")
    changed = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)  # not this checkout
    assert changed.stdout.strip() not in ("", plain), changed.stderr[-2000:]


# --------------------------------------------------------------------------------------
# check's token kernels (the "check" family)

def _token_pairs(rng):
    """(a, b, mask) pairs of log-probs: widths across the position buckets (1 .. 5,000 tokens, odd), NaN and
    ±inf on either side (masked and not), all-masked and unmasked rows, readonly (mapped) arrays."""
    for rows, width in ((1, 1), (1, 7), (3, 17), (2, 64), (5, 33), (4, 1025), (2, 5000)):
        a = -rng.random((rows, width)) * 6.0
        b = a + rng.normal(0, 0.05, a.shape) * 10.0 ** rng.integers(-4, 1)
        mask = rng.random(a.shape) > 0.3
        if width >= 7:
            a[0, width // 2], b[-1, width // 3], b[0, 1] = np.nan, np.inf, -np.inf
            mask[-1, :] = False
            b[0, 2] = a[0, 2]
        yield a, b, mask
        yield a, b, np.ones(a.shape, bool)
        frozen = a.copy(), b.copy()
        for x in frozen:
            x.flags.writeable = False
        yield (*frozen, mask)


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float64, np.float64), (np.float64, np.float32),
                                    (np.float32, np.float64)])
def test_the_ahead_of_time_token_kernel_gives_the_jit_kernels_bits(aot_check, dtypes):
    from rlprobe.checks.compiled import ROWS_EXPORTS
    from rlprobe.checks.token_figures import LOG_THRESHOLDS, PROBABILITY_OF, PairFigures, mask_bytes
    from rlprobe.checks.token_kernel import reduce_rows

    aot = getattr(aot_check, ROWS_EXPORTS[tuple(np.dtype(d) for d in dtypes)])
    rng = np.random.default_rng(16)
    checked = 0
    for a, b, mask in _token_pairs(rng):
        a, b = a.astype(dtypes[0]), b.astype(dtypes[1])
        m = mask_bytes(mask)
        for eps in (0.2, 1.5):  # 1.5: no lower bound (-inf)
            lo = np.log(1.0 - eps) if eps < 1 else -np.inf
            out = []
            for kernel in (aot, reduce_rows):
                f, sums = PairFigures(), np.zeros(7)
                seq_sum, seq_n = np.zeros(a.shape[0]), np.zeros(a.shape[0], np.int64)
                kernel(a, b, m, lo, np.log(1.0 + eps), PROBABILITY_OF, LOG_THRESHOLDS, sums, f.hist, None,
                       f.pos_count, f.pos_sum, f.pos_max, f.prob_count, f.prob_sum, seq_sum, seq_n)
                out.append([x.tobytes() for x in (sums, f.hist, f.pos_count, f.pos_sum, f.pos_max, f.prob_count,
                                                  f.prob_sum, seq_sum, seq_n)])
            assert out[0] == out[1], (dtypes, a.shape, eps)
            checked += 1
    assert checked == 42


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float64, np.float64), (np.float64, np.float32),
                                    (np.float32, np.float64)])
def test_the_ahead_of_time_maxima_kernel_gives_the_jit_kernels_bits(aot_check, dtypes):
    from rlprobe.checks.compiled import ROWS_EXPORTS, maxima_kernel
    from rlprobe.checks.token_figures import mask_bytes
    from rlprobe.checks.token_kernel import reduce_maxima

    name = ROWS_EXPORTS[tuple(np.dtype(d) for d in dtypes)].replace("reduce_rows", "reduce_maxima")
    aot = getattr(aot_check, name)
    checked = 0
    for a, b, mask in _token_pairs(np.random.default_rng(17)):
        a, b, m = a.astype(dtypes[0]), b.astype(dtypes[1]), mask_bytes(mask)
        assert maxima_kernel(a, b, m) is not reduce_maxima  # the built module's, where built
        out = [np.zeros(3, np.int64), np.zeros(3, np.int64)]
        aot(a, b, m, out[0])
        reduce_maxima(a, b, m, out[1])
        assert out[0].tobytes() == out[1].tobytes(), (dtypes, a.shape)
        checked += int(out[0][0] > 0)
    assert checked >= 18  # pairs with tokens counted


def _small_dump(path):
    """A run whose token pairs go through the batch kernel: odd widths, NaN/±inf, masks, several steps and keys."""
    import rlprobe

    rng = np.random.default_rng(3)
    with rlprobe.Probe(path, flush_interval=0) as probe:
        for step in range(5):
            old = -rng.random((3, 29 + step), dtype=np.float32) * 4
            rollout = old + rng.normal(0, 0.03, old.shape).astype(np.float32)
            rollout[0, step] = (np.nan, np.inf, -np.inf, 0.0, 1e30)[step]
            probe.save({"rollout_log_prob": rollout, "old_log_prob": old, "log_prob": old - np.float32(1e-4),
                        "response_mask": rng.random(old.shape) > 0.2})
            probe.step()
    return path


def _table_bits(tables) -> dict:
    """Every column of every table, floats as their bits."""
    out = {}
    for name, table in tables.items():
        for column in table.column_names:
            values = table.column(column).to_numpy(zero_copy_only=False)
            out[name, column] = values.tobytes() if values.dtype.kind == "f" else list(values)
    return out


def test_the_ahead_of_time_batch_kernel_gives_the_jit_tables(aot_check, tmp_path, monkeypatch):
    """token_tables' batch of small pairs (compiled reads included) and its pair-by-pair path give the same
    tables, as bits, through the ahead-of-time kernels as through numba's JIT kernels."""
    from rlprobe.checks import compiled, token_batch
    from rlprobe.checks.inputs import stats_table
    from rlprobe.checks.token_batch_kernel import reduce_batch
    from rlprobe.checks.token_kernel import reduce_rows
    from rlprobe.checks.token_tables import token_tables
    from rlprobe.lake.reader import open_dump

    dump = open_dump(_small_dump(tmp_path / "d"))
    got, rows_kernel = {}, compiled.rows_kernel
    assert rows_kernel(*(np.zeros((1, 1), t) for t in (np.float32, np.float32, np.uint8))) is not reduce_rows
    for small in (token_batch.SMALL, -1):  # -1: every key pair by pair (reduce_pair)
        monkeypatch.setattr(token_batch, "SMALL", small)
        for aot in (True, False):
            monkeypatch.setattr(token_batch, "batch_kernel", lambda: aot_check.reduce_batch if aot else reduce_batch)
            monkeypatch.setattr(compiled, "rows_kernel", rows_kernel if aot else lambda *arrays: reduce_rows)
            got[small, aot] = _table_bits(token_tables(dump, stats_table(dump), 0.2, workers=1))
    assert got[token_batch.SMALL, True] == got[token_batch.SMALL, False]
    assert got[-1, True] == got[-1, False]
    assert len(got[-1, True][("token_steps", "pair")]) == 10  # on_policy and rollout_vs_old, 5 steps


def test_check_uses_the_built_module_without_importing_numba(aot_check, tmp_path):
    """A fresh process reducing a run's token pairs, batched and pair by pair: with the module built, numba is
    never imported."""
    path = _small_dump(tmp_path / "d")
    code = ("import sys\nfrom rlprobe.checks import token_batch\nfrom rlprobe.checks.inputs import stats_table\n"
            "from rlprobe.checks.token_tables import token_tables\nfrom rlprobe.lake.reader import open_dump\n"
            f"dump = open_dump({str(path)!r})\n"
            "n = [len(token_tables(dump, stats_table(dump), 0.2, workers=2)['token_steps'])]\n"
            "token_batch.SMALL = -1\n"
            "n.append(len(token_tables(dump, stats_table(dump), 0.2, workers=2)['token_steps']))\n"
            "print(n, 'numba' in sys.modules)\n")
    done = _python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "[10, 10] False"

"""Start-up of the command (issue 18): what a run loads. pandas is installed here (the dev extra
brings it with TRL), and pyarrow and DuckDB would import it; the command must not."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

import rlprobe
from rlprobe.cli.startup import refused

# loaded by nothing the default `rlprobe compare` of tensor dumps does (numba: its kernels are compiled at
# install, rlprobe/comparison/kernels.pyx)
NEVER_LOADED = ("pandas", "scipy", "cffi", "torch", "mindspore", "ray", "matplotlib", "polars", "transformers",
                "numba")

RUN_AND_LIST_MODULES = """
import json, sys
from rlprobe.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"exit": code, "loaded": sorted(m for m in %r if m in sys.modules)}))
""" % (NEVER_LOADED,)


def _run_cli(*args) -> dict:
    proc = subprocess.run([sys.executable, "-c", RUN_AND_LIST_MODULES, *map(str, args)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _msprobe_dump(path, value):
    d = path / "data" / "x" / "step0" / "rank0" / "micro_step0"
    d.mkdir(parents=True)
    np.save(d / "x.npy", value)
    return path


def _rlprobe_dump(path, value):
    with rlprobe.Probe(path) as p:
        p.save({"log_prob": value})
        p.step()
    return path


def test_pandas_is_installed_so_the_start_up_tests_mean_something():
    assert importlib.util.find_spec("pandas") is not None, "install the dev extra (TRL brings pandas)"


@pytest.mark.parametrize("make_dump", [_msprobe_dump, _rlprobe_dump], ids=["msprobe", "rlprobe"])
def test_compare_loads_no_pandas_nor_other_unused_packages(tmp_path, make_dump):
    a = make_dump(tmp_path / "a", np.ones(4, np.float32))
    b = make_dump(tmp_path / "b", np.full(4, 2.0, np.float32))
    result = _run_cli("compare", a, b, "-o", tmp_path / "out")
    assert result == {"exit": 0, "loaded": []}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_divergence"]["max_abs_err"] == 1.0  # it did compare the tensors
    assert (tmp_path / "out" / "report.xlsx").stat().st_size > 0


def test_sql_and_info_load_no_pandas(tmp_path):
    a = _rlprobe_dump(tmp_path / "a", np.ones(4, np.float32))
    assert _run_cli("sql", a, "SELECT key, max FROM key_data", "--format", "json") == {"exit": 0, "loaded": []}
    assert _run_cli("info", a, "--json") == {"exit": 0, "loaded": []}


REFUSED_CHECK = """
import importlib.util, sys
from rlprobe.cli.startup import UNUSED, refused

missing = [n for n in UNUSED if n not in sys.modules]
assert missing, "rlprobe.cli.startup itself imported every package it refuses"
with refused():
    for name in missing:
        try:
            importlib.util.find_spec(name)
        except ModuleNotFoundError as e:
            assert "not loaded by the rlprobe command" in str(e), e
        else:
            raise AssertionError(f"find_spec({name!r}) found it inside refused()")
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise AssertionError(f"{name} imported inside refused()")
assert all(importlib.util.find_spec(n) is not None for n in missing if n == "pandas")
assert not any(type(f).__name__ == "_Refuse" for f in sys.meta_path)
print(len(missing))
"""


def test_refused_packages_import_as_if_missing_and_come_back_after():
    # in a fresh interpreter: in the test process, other tests may already have imported every one of them
    proc = subprocess.run([sys.executable, "-c", REFUSED_CHECK], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) >= 1


def test_refused_leaves_an_imported_package_alone():
    with refused(("json",)):
        import json as again  # already imported: nothing changes
    assert again is json

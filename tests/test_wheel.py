"""Build the wheel, install it into a fresh virtual environment and run rlprobe from there.

A file missing from the wheel (sql/, pipelines/, examples/, a module) fails here, not on a
user's machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SMOKE = """
import json, sys
import numpy as np
import importlib.metadata as metadata
import rlprobe
from rlprobe.lake.sql_runner import resource_dir
# the distribution's name is this project's own (the registry's `rlprobe` is another project)
assert metadata.version('rlprobe-numerics') == rlprobe.__version__, metadata.version('rlprobe-numerics')
assert [d.metadata['Name'] for d in metadata.distributions() if d.metadata['Name'].lower() == 'rlprobe'] == []
assert 'site-packages' in rlprobe.__file__, rlprobe.__file__
import rlprobe.comparison.kernels, rlprobe.comparison.file_kernels, rlprobe.checks.kernels, rlprobe.frameworks.cpu_grad_kernel
for name in ('sql', 'pipelines', 'examples'):
    assert 'site-packages' in str(resource_dir(name)), resource_dir(name)
assert (resource_dir('sql') / 'info_key_data.sql').is_file()
assert (resource_dir('examples') / 'capture_key_data.py').is_file()
with rlprobe.Probe(sys.argv[1]) as p:
    p.save({'responses': np.arange(6).reshape(2, 3), 'log_prob': np.zeros(3, np.float32)})
    p.step()
print('ok')
"""


def test_wheel_installs_and_runs(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
                   check=True, cwd=tmp_path)
    wheel = next(dist.glob("rlprobe_numerics-*.whl"))  # the registry's `rlprobe` is another project
    # every kernel source of the checkout travels compiled, for this platform, and no source of one does
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = sorted(p.relative_to(REPO).with_suffix("").as_posix() for p in (REPO / "rlprobe").rglob("*.pyx"))
    assert kernels, "expected the compiled kernels' sources (rlprobe/**/*.pyx)"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    assert [k for k in kernels if k + suffix not in names] == [], sorted(names)
    assert [n for n in names if n.endswith((".pyx", ".pxd", ".c", ".h"))] == []
    assert "-none-any" not in wheel.name, wheel.name  # tagged for the platform its modules were compiled on
    # the fresh environment must see only what the wheel installed, not a checkout on PYTHONPATH
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, cwd=tmp_path, env=clean_env)
    out = subprocess.run([str(py), "-c", SMOKE, str(tmp_path / "dump")], capture_output=True, text=True, cwd=tmp_path,
                         env=clean_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    info = subprocess.run([str(env_dir / "bin" / "rlprobe"), "info", "--json", str(tmp_path / "dump")],
                          capture_output=True, text=True, cwd=tmp_path, env=clean_env)
    assert info.returncode == 0, info.stderr
    summary = json.loads(info.stdout)
    assert summary["complete"] is True
    compared = subprocess.run([str(env_dir / "bin" / "rlprobe"), "compare", str(tmp_path / "dump"), str(tmp_path / "dump"),
                               "-o", str(tmp_path / "out"), "--quiet"], capture_output=True, text=True, cwd=tmp_path,
                              env=clean_env)
    assert compared.returncode == 0, compared.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["counts"] == {"match": 2}
    assert {k["key"]: k["dtypes"] for k in summary["keys"]} == {"log_prob": "float32", "responses": "int64"}


def test_a_machine_without_a_c_compiler_is_told_what_the_kernels_need(tmp_path):
    copy = tmp_path / "checkout"
    kernel = copy / "rlprobe" / "comparison"
    kernel.mkdir(parents=True)
    for name in ("kernels.pyx", "kernels.pxd", "float_lanes.h"):
        (kernel / name).write_bytes((REPO / "rlprobe" / "comparison" / name).read_bytes())
    (copy / "hatch_build.py").write_bytes((REPO / "hatch_build.py").read_bytes())
    built = subprocess.run([sys.executable, "hatch_build.py", "rlprobe/comparison/kernels.pyx"], cwd=copy,
                           env={**os.environ, "CC": str(tmp_path / "no-such-cc")}, capture_output=True, text=True,
                           timeout=300)
    assert built.returncode != 0
    assert "compiling rlprobe's kernels (rlprobe/comparison/kernels.pyx) failed" in built.stderr, built.stderr
    assert "no-such-cc" in built.stderr and "They need a C compiler: gcc or clang" in built.stderr
    assert list(copy.rglob("*.so")) == []

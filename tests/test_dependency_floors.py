"""rlprobe's runtime dependencies are pinned to ranges the tests run on: the suite itself runs on the
newest release of each range (what pip installs), and here a set of core tests runs again with every
dependency at the lowest version pyproject.toml allows (a virtual environment beside this one, the
heavy frameworks taken from it). docs/dependencies.md says why each floor is where it is."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]

# what each floor must hold up: the areas the floors broke before they were raised (docs/dependencies.md)
CORE_TESTS = [
    "tests/report",  # pyarrow: workbook cells of a sliced column
    "tests/test_console.py",  # rich: wrapped text
    "tests/cli/test_console_width.py", "tests/pipeline/test_history.py",  # DuckDB: timestamps with a zone
    "tests/compare/test_pair_kernels.py", "tests/check/test_token_kernels.py",  # Cython, setuptools: the kernels' bits
    "tests/frameworks/test_cpu_grad_kernel.py",
    "tests/compare/test_compare_run.py", "tests/check/test_single_run_rules.py",  # DuckDB's SQL
    "tests/capture/test_stats_properties.py",  # numpy: 0-d bfloat16 tensors
    "tests/lake/test_statistics_stack.py", "tests/lake/test_tensor_pack.py",
]


# what the checkout copy for the floors' build holds (the kernels are compiled there, not in this checkout)
COPIED = ("rlprobe", "sql", "pipelines", "examples", "tests", "benchmarks", "hatch_build.py", "pyproject.toml",
          "README.md")


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the dev extra brings tomli
        import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def runtime_requirements(this_python: bool = False) -> list[Requirement]:
    """pyproject.toml's runtime requirements (with `this_python`, those whose marker this Python meets: a floor
    can differ by Python version where an older release has no wheel for a newer Python)."""
    requirements = [Requirement(r) for r in _pyproject()["project"]["dependencies"]]
    return [r for r in requirements if not this_python or r.marker is None or r.marker.evaluate()]


def build_requirements() -> list[Requirement]:
    """What builds the compiled kernels (pyproject's build-system, but the build backend hatchling, whose
    hook only calls them)."""
    return [r for r in map(Requirement, _pyproject()["build-system"]["requires"]) if r.name != "hatchling"]


def floor(req: Requirement) -> str:
    lows = [s.version for s in req.specifier if s.operator == ">="]
    assert len(lows) == 1, f"pyproject.toml: {req}: expected one lower bound (>=)"
    return lows[0]


def test_every_runtime_dependency_has_a_floor_and_a_ceiling():
    for req in runtime_requirements() + build_requirements():
        floor(req)
        assert any(s.operator == "<" for s in req.specifier), f"pyproject.toml: {req}: expected an upper bound (<)"
        assert req.specifier.contains(floor(req)), f"pyproject.toml: {req}: its floor is outside its range"


def test_every_python_the_project_allows_gets_one_range_of_each_dependency():
    from packaging.specifiers import SpecifierSet

    project = _pyproject()["project"]
    allowed = SpecifierSet(project["requires-python"])
    versions = [f"3.{minor}" for minor in range(8, 20) if f"3.{minor}" in allowed]
    assert "3.11" in versions and versions == [f"3.{m}" for m in range(10, 10 + len(versions))], versions
    requirements = runtime_requirements()
    for version in versions:
        names = [r.name for r in requirements if r.marker is None or r.marker.evaluate({"python_version": version})]
        assert sorted(names) == sorted({r.name for r in requirements}), f"Python {version}: {names}"


def test_core_tests_pass_with_every_dependency_at_its_floor(tmp_path):
    venv = tmp_path / "floors"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # this environment's packages (torch, pytest, ...) after the venv's own, whether it is the interpreter's own
    # site-packages or itself a virtual environment (where --system-site-packages would reach past it)
    inner = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                           text=True, check=True).stdout.strip()
    outer = [p for p in site.getsitepackages() if os.path.isdir(p)]
    Path(inner, "zz_outer_environment.pth").write_text(
        f"import site; list(map(site.addsitedir, {outer!r}))\n", encoding="utf-8")
    pins = {req.name: floor(req) for req in runtime_requirements(this_python=True) + build_requirements()}
    install = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--only-binary=:all:",  # a floor without a wheel for this Python fails here
                              *(f"{name}=={version}" for name, version in pins.items())],
                             capture_output=True, text=True, timeout=420)
    assert install.returncode == 0, install.stdout + install.stderr
    probe = ("import json, importlib.metadata as m, sys; "
             "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))")
    got = subprocess.run([python, "-c", probe, *pins], capture_output=True, text=True, check=True).stdout
    installed = {name: Version(v) for name, v in json.loads(got).items()}
    assert installed == {name: Version(v) for name, v in pins.items()}  # the venv's own, not this one's newer
    # the kernels built by the floors' Cython and setuptools, in a copy of the checkout the tests then import
    copy = tmp_path / "checkout"
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"))
        else:
            shutil.copy2(source, copy / name)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(copy)}
    env.pop("PYTEST_XDIST_WORKER", None)
    built = subprocess.run([python, "hatch_build.py"], cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    where = subprocess.run([python, "-c", "import rlprobe; print(rlprobe.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).parent == copy / "rlprobe", where
    tests = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                            f"--basetemp={tmp_path / 'tests'}", *CORE_TESTS],  # not beside this run's numbered ones
                           cwd=copy, env=env, capture_output=True, text=True, timeout=480)
    assert tests.returncode == 0, f"with {pins}:\n{tests.stdout[-6000:]}\n{tests.stderr[-2000:]}"

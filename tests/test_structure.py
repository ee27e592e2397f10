"""The package's structure, read from its source with ast: data flows one way between the layers
(docs/architecture.md), no import cycles, no private name imported from another module, no
source file over 400 lines (the compiled kernels' .pyx, .pxd and .h too). Imports inside functions count (lazy imports run too), and so do imports under
`if TYPE_CHECKING:` (a type a module needs is a dependency too: a cycle of annotations is still a cycle)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import rlprobe

MAX_LINES = 400
# X must not import Y (the layer is the package under rlprobe: rlprobe.comparison.run -> comparison).
# checks (one run's checks) is a library below comparison: comparison may import it, it never imports comparison.
FORBIDDEN = {
    "comparison": {"report", "pipeline", "capture", "cli"},
    "checks": {"comparison", "report", "pipeline", "capture", "cli"},
    "report": {"comparison", "checks", "pipeline", "capture", "cli"},
    "frameworks": {"capture", "comparison", "checks", "report", "pipeline", "cli"},
    "lake": {"capture", "comparison", "checks", "report", "pipeline", "frameworks", "cli"},
    "capture": {"comparison", "checks", "report", "pipeline", "cli"},
    "pipeline": {"cli"},  # the command's own start-up (cli/startup.py) is the command's alone
}

# the compiled kernels' sources: Cython (not Python's syntax, so read for their imports line by line) and C
KERNEL_SOURCES = ("*.pyx", "*.pxd", "*.h")
_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\s+([\w, ]+)|c?import\s+([\w.]+))", re.M)


def module_files(root: Path) -> dict[str, Path]:
    """Module name -> source file of every module of the package in `root` (Python and Cython)."""
    found = {}
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.pyx")]):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, module: str, package: str) -> list[tuple[str, str]]:
    """(imported module, imported name or "") of every runtime import of `package` in `path`."""
    found: list[tuple[str, str]] = []
    is_package = path.name == "__init__.py"
    if path.suffix == ".pyx":  # absolute imports and cimports, one a line
        for base, names, plain in _CYTHON_IMPORT.findall(path.read_text(encoding="utf-8")):
            target = base or plain
            if target.split(".")[0] == package:
                found.extend((target, n.strip()) for n in names.split(",")) if base else found.append((target, ""))
        return found

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.extend((a.name, "") for a in node.names if a.name.split(".")[0] == package)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from its package
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] == package:
                found.extend((base, a.name) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


def check_package(root: Path) -> list[tuple[str, str]]:
    """Every structure violation of the package in `root`, as (where, what) pairs."""
    package = root.name
    files = module_files(root)
    violations: list[tuple[str, str]] = []
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            violations.append((path.relative_to(root.parent).as_posix(), "lines"))
        layer = module.split(".")[1] if "." in module else ""
        for target, name in imports(path, module, package):
            submodule = f"{target}.{name}" if name and f"{target}.{name}" in files else None
            imported = submodule or target
            if imported in files and imported != module:
                graph[module].add(imported)
            private = name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            if private and not submodule and target != module:
                violations.append((module, f"{target}.{name}"))
            target_layer = imported.split(".")[1] if "." in imported else ""
            if target_layer in FORBIDDEN.get(layer, ()):
                violations.append((module, imported))
    for pattern in KERNEL_SOURCES[1:]:  # .pyx are modules above
        for path in sorted(root.rglob(pattern)):
            if len(path.read_text(encoding="utf-8").splitlines()) > MAX_LINES:
                violations.append((path.relative_to(root.parent).as_posix(), "lines"))
    for cycle in _cycles(graph):
        violations.append(("cycle", " -> ".join(cycle)))
    return sorted(set(violations))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_rlprobe_has_no_structure_violations():
    assert check_package(Path(rlprobe.__file__).parent) == []


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for folder in [pkg, *(p for p in pkg.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return pkg


def test_the_checker_finds_each_kind_of_violation(tmp_path):
    pkg = _package(tmp_path, {
        "lake/reader.py": "def f():\n    from pkg.comparison import run  # lazy, still a runtime import\n",
        "comparison/run.py": "from pkg.comparison.modules import helper\n",
        "comparison/modules.py": "from pkg.comparison.run import _private\nhelper = 1\n",
        "report/xlsx.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.comparison import run\n"
                          + "x = 1\n" * (MAX_LINES + 1),
        "report/csv.py": "from . import xlsx\nfrom ..pipeline import runner\n",
        "pipeline/runner.py": "import pkg.comparison.run\nimport pkg.report.xlsx\n",
    })
    assert check_package(pkg) == [
        ("cycle", "pkg.comparison.modules -> pkg.comparison.run"),
        ("pkg.comparison.modules", "pkg.comparison.run._private"),
        ("pkg.lake.reader", "pkg.comparison.run"),
        ("pkg.report.csv", "pkg.pipeline.runner"),
        ("pkg.report.xlsx", "pkg.comparison.run"),  # under TYPE_CHECKING: seen all the same
        ("pkg/report/xlsx.py", "lines"),
    ]


def test_the_checker_reads_the_kernels_imports_and_sizes(tmp_path):
    pkg = _package(tmp_path, {
        "lake/kernels.pyx": "from libc.stdint cimport int64_t\nfrom pkg.comparison.kernels cimport partials\n",
        "comparison/kernels.pyx": "import pkg.report.xlsx\n", "report/xlsx.py": "",
        "checks/loops.h": "/* */\n" * (MAX_LINES + 1)})
    assert check_package(pkg) == [("pkg.comparison.kernels", "pkg.report.xlsx"),
                                  ("pkg.lake.kernels", "pkg.comparison.kernels"), ("pkg/checks/loops.h", "lines")]


def test_the_checker_passes_a_one_way_package(tmp_path):
    pkg = _package(tmp_path, {
        "lake/reader.py": "import json\n",
        "comparison/run.py": "from pkg.lake import reader\nfrom pkg.lake.reader import open_dump\n",
        "report/xlsx.py": "from pkg.lake.reader import open_dump\n",
        "pipeline/runner.py": "def run():\n    from pkg.comparison import run\n    from pkg.report import xlsx\n",
    })
    assert check_package(pkg) == []


@pytest.mark.parametrize("source", ["from pkg.report import xlsx\n", "def f():\n    import pkg.pipeline.runner\n",
                                    "from pkg.capture.probe import Probe\n"])
@pytest.mark.parametrize("layer", ["comparison", "checks"])
def test_a_new_upward_import_of_compare_or_check_fails(tmp_path, source, layer):
    pkg = _package(tmp_path, {f"{layer}/run.py": source, "report/xlsx.py": "", "pipeline/runner.py": "",
                              "capture/probe.py": "Probe = 1\n"})
    assert [v for v in check_package(pkg) if v[0] == f"pkg.{layer}.run"]


def test_check_may_be_imported_by_compare_but_never_imports_it(tmp_path):
    pkg = _package(tmp_path, {"comparison/run.py": "from pkg.checks.run import check_dump\n",
                              "checks/run.py": "def check_dump():\n    from pkg.comparison import verdict\n",
                              "comparison/verdict.py": "", "report/check_report.py": "from pkg.checks import run\n"})
    assert check_package(pkg) == [("pkg.checks.run", "pkg.comparison.verdict"),
                                  ("pkg.report.check_report", "pkg.checks.run")]


def test_an_import_cycle_of_annotations_only_is_a_cycle(tmp_path):
    """Two modules that import each other's types under TYPE_CHECKING form a cycle (the type belongs in a
    module below both, or in a Protocol): capture/calls.py holds those of the capture writer and monitors."""
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.capture.{} import {}\n"
    pkg = _package(tmp_path, {"capture/probe.py": guarded.format("grads", "GradMonitor") + "class Probe: ...\n",
                              "capture/grads.py": guarded.format("probe", "Probe") + "class GradMonitor: ...\n"})
    assert check_package(pkg) == [("cycle", "pkg.capture.grads -> pkg.capture.probe")]


def test_nothing_below_the_command_imports_its_package(tmp_path):
    """rlprobe/cli/ (the commands and their start-up work) is the top: a pipeline or a layer that imports it fails."""
    pkg = _package(tmp_path, {"cli/startup.py": "", "pipeline/compare_command.py": "from pkg.cli import startup\n",
                              "lake/reader.py": "def f():\n    from pkg.cli.startup import refused\n"})
    assert check_package(pkg) == [("pkg.lake.reader", "pkg.cli.startup"),
                                  ("pkg.pipeline.compare_command", "pkg.cli.startup")]

"""Build rlprobe's compiled kernels: every ``rlprobe/**/*.pyx``, translated by Cython and compiled by
the C compiler setuptools finds, when pip builds the package (docs/performance.md "Compiled kernels").

hatchling runs `NativeKernels` for every build: a wheel carries the modules (and is tagged for the
platform), an editable install builds them in place beside their sources. ``python hatch_build.py
[FILE.pyx ...]`` rebuilds them in place by hand (all of them, or the ones named) after a kernel changed.

The flags keep IEEE arithmetic as written: no fused multiply-add (the sums' bits do not depend on
whether the machine has FMA), no fast-math; -fno-trapping-math and -fno-math-errno only let the compiler
vectorise and inline sqrt, which change no result.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "rlprobe"
CFLAGS = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno", "-Wno-unreachable-code"]


def kernel_sources(names: list[str] | None = None) -> list[Path]:
    """The .pyx files to build: every one in the package, or the named ones."""
    if not names:
        return sorted(PACKAGE.rglob("*.pyx"))
    paths = [Path(n).resolve() for n in names]
    for path in paths:
        if path.suffix != ".pyx" or not path.is_file():
            raise SystemExit(f"hatch_build.py: {path}: expected an existing .pyx file under {PACKAGE}")
    return paths


def module_name(source: Path) -> str:
    return ".".join(source.relative_to(ROOT).with_suffix("").parts)


def build(sources: list[Path], out_dir: Path) -> list[Path]:
    """Compile `sources` into extension modules under `out_dir` (laid out as the package); returns them."""
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext
    from setuptools.errors import CompileError, ExecError, LinkError

    # a module is rebuilt when a header beside it changed too (one header may include another)
    extensions = [Extension(module_name(s), [str(s.relative_to(ROOT))], include_dirs=[str(s.parent)],
                            depends=[str(h.relative_to(ROOT)) for h in sorted(s.parent.glob("*.h"))],
                            extra_compile_args=CFLAGS) for s in sources]
    cwd = os.getcwd()
    os.chdir(ROOT)  # the extensions' paths are relative to the checkout
    try:
        modules = cythonize(extensions, language_level=3, quiet=True, compiler_directives={
            "boundscheck": False, "wraparound": False, "cdivision": True, "initializedcheck": False})
        with tempfile.TemporaryDirectory() as temp:
            command = build_ext(Distribution({"ext_modules": modules}))
            command.build_lib = str(out_dir)
            command.build_temp = temp
            command.parallel = os.cpu_count() or 1
            command.ensure_finalized()
            try:
                command.run()
            except (CompileError, ExecError, LinkError) as e:
                names = ", ".join(str(s.relative_to(ROOT)) for s in sources)
                raise SystemExit(f"hatch_build.py: compiling rlprobe's kernels ({names}) failed: {e}\n"
                                 "They need a C compiler: gcc or clang (on Debian `apt-get install gcc`), or the "
                                 "one the CC variable names.") from None
            return [Path(p) for p in command.get_outputs()]
    finally:
        os.chdir(cwd)


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run by hand without hatchling
    BuildHookInterface = object


class NativeKernels(BuildHookInterface):
    """hatchling's build hook: compile the kernels into the wheel, or in place for an editable install."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return  # an sdist carries the sources and this file
        sources = kernel_sources()
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version == "editable":
            build(sources, ROOT)
            return
        self._out = tempfile.TemporaryDirectory()
        for path in build(sources, Path(self._out.name)):
            build_data["force_include"][str(path)] = str(path.relative_to(self._out.name))

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        out = getattr(self, "_out", None)
        if out is not None:
            out.cleanup()


if __name__ == "__main__":
    built = build(kernel_sources(sys.argv[1:]), ROOT)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    print("\n".join(str(p.relative_to(ROOT)) for p in built) or f"hatch_build.py: no .pyx under {PACKAGE}",
          f"({suffix})" if built else "")

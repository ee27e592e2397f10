"""Build the ahead-of-time compiled kernels of rlprobe.numba_cache.AOT_FAMILIES into the user's cache
(``python -m rlprobe.numba_build [FAMILY ...]``; every family without one). A fresh process then imports
a family's kernels as an extension module (~1 ms) instead of importing numba and loading its cache
(~0.35 s of CPU holding the GIL, issue 18).

numba.pycc compiles each exported function as numba's JIT would, for the same CPU: the host's name and
features (numba's JIT asks LLVM for both; pycc's default is the architecture's generic model, whose
vector width would reassociate the float kernel's sums differently), with the same flags, and the
exported wrappers release the GIL as ``nogil=True`` dispatchers do. One build at a time per family and
cache folder (an exclusive lock on ``<family>.lock``); the module is written to a temporary name and
renamed, so a reader sees a whole module or none. A build that fails (no C compiler, no setuptools, a
numba whose internals moved) leaves ``<family>.failed`` with its error, and rlprobe keeps the JIT
path until the key changes or this command is run again.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import os
import shutil
import sys
import tempfile
import traceback
import warnings

from rlprobe.numba_cache import AOT_FAMILIES, aot_folder, aot_module_name

__all__ = ["build", "main"]


#: an exported function's fastmath, as its dispatcher's (pycc compiles the Python function: the options of its
#: decorator are lost, those of the kernels it calls are kept by their dispatchers)
_FASTMATH: dict[object, object] = {}


def _patch_numba_for_the_jit_target() -> None:
    """pycc's codegen for the JIT's target (host CPU name and features), GIL-releasing wrappers and each exported
    function's own fastmath flags (token_kernel.reduce_rows': without them its sums were rounded otherwise)."""
    import numba.pycc.compiler as pycc_compiler
    from numba.core.codegen import AOTCPUCodegen

    if getattr(pycc_compiler, "_rlprobe_patched", False):
        return
    AOTCPUCodegen._customize_tm_features = lambda self: self._get_host_cpu_features()
    flags_class, compile_extra = pycc_compiler.Flags, pycc_compiler.compile_extra

    def flags():
        made = flags_class()
        made.release_gil = True  # as the JIT kernels' nogil=True
        return made

    def compile_with_the_functions_flags(typingctx, targetctx, func, args, return_type, flags, *rest, **named):
        if _FASTMATH.get(func):
            flags = flags.copy()
            flags.fastmath = _FASTMATH[func]
        return compile_extra(typingctx, targetctx, func, args, return_type, flags, *rest, **named)

    pycc_compiler.Flags, pycc_compiler.compile_extra = flags, compile_with_the_functions_flags
    pycc_compiler._rlprobe_patched = True


def _compile(family: str, folder: str) -> str:
    """Compile `family` into folder (through a temporary folder beside it); the module's path."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba.pycc is deprecated (kept in numba 0.68: see pyproject's pin)
        from numba.pycc import CC
    _patch_numba_for_the_jit_target()
    name = aot_module_name(family)
    cc = CC(name, source_module=__name__)
    cc.target_cpu = "host"
    for export, module_name, attribute, signature in AOT_FAMILIES[family]:
        function = getattr(importlib.import_module(module_name), attribute)
        python_function = getattr(function, "py_func", function)
        _FASTMATH[python_function] = getattr(function, "targetoptions", {}).get("fastmath")
        cc.export(export, signature)(python_function)
    work = tempfile.mkdtemp(prefix=f".{family}-", dir=folder)
    try:
        cc.output_dir = work
        cc.compile()
        path = os.path.join(folder, cc.output_file)
        os.replace(os.path.join(work, cc.output_file), path)
        return path
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(family: str, wait: bool = True) -> str | None:
    """The path of `family`'s module in the user's cache, built now if missing (None: no cache folder,
    another build holds the lock and `wait` is False, or the build failed: see <family>.failed)."""
    folder = aot_folder(create=True)
    if folder is None:
        return None
    with open(os.path.join(folder, f"{family}.lock"), "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return None
        done = [f for f in os.listdir(folder) if f.startswith(aot_module_name(family) + ".")]
        if done:
            return os.path.join(folder, done[0])
        failed = os.path.join(folder, f"{family}.failed")
        try:
            path = _compile(family, folder)
        except Exception:  # noqa: BLE001 - any failure leaves the JIT path, with the reason on disk
            with open(failed, "w", encoding="utf-8") as f:
                f.write(traceback.format_exc())
            return None
        if os.path.exists(failed):
            os.remove(failed)
        return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlprobe.numba_build", description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", metavar="FAMILY",
                        help=f"kernel families to build ({', '.join(AOT_FAMILIES)}; default: all)")
    parser.add_argument("--background", action="store_true",
                        help="as started by rlprobe: give up at once when another build holds the lock")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.families) - set(AOT_FAMILIES))
    if unknown:
        parser.error(f"unknown kernel families {unknown}: expected some of {list(AOT_FAMILIES)}")
    # the callees pycc types are compiled by numba's JIT too: into a scratch cache, not the user's (whose
    # folder would then hold kernels no command of the user's compiled)
    scratch = tempfile.mkdtemp(prefix="rlprobe-aot-jit-")
    os.environ["NUMBA_CACHE_DIR"] = scratch
    status = 0
    for family in args.families or list(AOT_FAMILIES):
        path = build(family, wait=not args.background)
        if not args.background:
            print(f"{family}: {path or 'not built (see ' + str(aot_folder()) + f'/{family}.failed)'}")
        status |= path is None and not args.background
    shutil.rmtree(scratch, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

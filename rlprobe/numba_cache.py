"""Where numba keeps its compiled kernels: shared by the comparison kernels and the CPU gradient
kernel, so neither has to import the other to set it; numba loaded ahead of the first kernel; and the
kernels compiled ahead of time (AOT_FAMILIES, compiled_module: imported without numba, built by
rlprobe/numba_build.py; docs/performance.md "Comparison: start-up")."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from typing import Any

#: the modules that define numba kernels (tests/test_numba_cache.py keeps the list whole). numba
#: checks a cached function against its own file only, so a kernel compiled into another one
#: (pair_kernels' element kernel into batch_kernels' batch) was loaded stale after only the first
#: file changed; the cache folder is named after the contents of all of them instead (and of
#: lake/regular_files.py, whose READ_FLAGS the compiled readers open files with, and of comparison/partials.py,
#: whose layout of the partials the batch kernels write)
KERNEL_MODULES = ("comparison/pair_kernels.py", "comparison/batch_kernels.py",
                  "comparison/mapped_kernels.py", "comparison/partials.py", "lake/regular_files.py",
                  "checks/token_kernel.py", "checks/token_figures.py", "checks/token_batch_kernel.py",
                  "lake/npy_header.py", "lake/libc.py",
                  "frameworks/cpu_grad_kernel.py")


def kernel_sources_digest(package_dir: str | None = None) -> str:
    """A digest of the kernel modules' sources (of this package, or of the rlprobe at `package_dir`)."""
    root = package_dir or os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha1()
    for name in KERNEL_MODULES:
        digest.update(name.encode() + b"\0")
        try:
            with open(os.path.join(root, name), "rb") as f:
                digest.update(f.read())
        except OSError:
            digest.update(b"(missing)")
    return digest.hexdigest()[:16]


def use_user_cache_dir() -> None:
    """Point numba's on-disk cache at a user cache dir unless the user chose one:
    ``~/.cache/rlprobe/numba/<kernel_sources_digest()>``.

    ``cache=True`` would otherwise try to write next to the installed package, which fails
    for read-only installs, and each module that imported numba first would keep its kernels
    in a different place (a second compilation, seconds, instead of a load from the cache).
    Call it before a module defines kernels: numba reads the variable at import, and a
    dispatcher reads numba's config when it is made, so where numba was already imported
    (by the user, or another library) its config is set the same way, unless the user set
    NUMBA_CACHE_DIR. Nothing is changed when the directory cannot be created.
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "rlprobe", "numba", kernel_sources_digest())
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    if not os.access(path, os.W_OK | os.X_OK):
        return
    os.environ["NUMBA_CACHE_DIR"] = path
    config = getattr(sys.modules.get("numba.core.config"), "CACHE_DIR", None)
    if config == "":  # numba loaded before the variable was set: its config read it as unset
        sys.modules["numba.core.config"].CACHE_DIR = path


_import_lock = threading.Lock()


def import_numba() -> None:
    """Import numba (and its CPU target's registry) in one thread at a time: two threads importing it
    at once can meet in its circular imports, and Python then raises _DeadlockError in one of them.
    Every rlprobe module that defines kernels calls it (after use_user_cache_dir) before `import numba`.
    Kernels found in the cache then load without numba's lowering registries (_light_cache_loads)."""
    with _import_lock:
        import numba.core.registry  # noqa: F401

        _light_cache_loads()


def _light_cache_loads() -> None:
    """Make numba's CPU target load a cached kernel without first installing every lowering registry.

    numba refreshes its target context before looking in the cache (``Cache.load_overload``), and the
    first refresh of a process imports and installs the implementations of all it can compile (numba.np,
    numba.cpython, typed containers, ...: ~0.43 s of CPU, two thirds of numba's load, issue 18). A cached
    kernel is machine code: loading it needs numba's runtime (NRT, which its code calls to allocate and
    count references) only. So the refresh called from ``load_overload`` does just that, and any other (a
    kernel compiled: a cold cache, a new signature; numba's own lazy refreshes while typing) is the full
    one. Nothing changes where numba's internals are not as expected."""
    from numba.core.registry import cpu_target

    context = cpu_target.target_context
    if "refresh" in vars(context):  # done already (or set by someone else: left alone)
        return
    try:
        from numba.core.caching import Cache
        from numba.core.runtime import rtsys

        load_overload = Cache.load_overload.__code__
        full = context.refresh
    except (ImportError, AttributeError):
        return

    def refresh() -> None:
        if sys._getframe(1).f_code is not load_overload:
            full()
            return
        rtsys.initialize(context)  # once per process; later calls return at once

    context.refresh = refresh


def load_numba() -> None:
    """Import numba and start its runtime (~0.25 s of CPU): what the first kernel of a process pays when
    it is loaded from the cache. Compiles nothing, so a thread can pay it while the dumps are read and
    only the kernels a comparison runs get loaded or, with a cold cache, compiled (seconds a kernel; a
    compilation installs the rest of numba's registries)."""
    use_user_cache_dir()
    import_numba()
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target
    from numba.core.runtime import rtsys

    # the context is made outside the compiler lock (making one takes it, under the lock of the lazy
    # attribute), its runtime started under it, as a kernel loading in another thread starts it
    target_context = cpu_target.target_context
    with global_compiler_lock:
        rtsys.initialize(target_context)


# --------------------------------------------------------------------------------------
# ahead-of-time compiled kernels (issue 18): built once by rlprobe/numba_build.py into a folder named
# after everything that shapes their machine code, imported without numba

def _array(dtype: str, ndim: int = 1, readonly: bool = False) -> str:
    return f"Array({dtype}, {ndim}, 'C', readonly={readonly})"


def _pair_signature(dtype: str) -> str:
    return f"({_array(dtype, readonly=True)}, {_array(dtype, readonly=True)}, int64, int64)"


def _rows_signature(a: str, b: str) -> str:
    """token_kernel.reduce_rows as token_figures.reduce_pair calls it (touched: None)."""
    f8, i8 = _array("float64"), _array("int64")
    return (f"({_array(a, 2)}, {_array(b, 2)}, {_array('uint8', 2)}, float64, float64, {_array('int8')}, {f8}, {f8}, "
            f"{i8}, none, {i8}, {f8}, {f8}, {i8}, {f8}, {f8}, {i8})")


def _maxima_signature(a: str, b: str) -> str:
    """token_kernel.reduce_maxima as token_maxima.reduce_maxima calls it."""
    return f"({_array(a, 2)}, {_array(b, 2)}, {_array('uint8', 2)}, {_array('int64')})"


def _batch_signature() -> str:
    """token_batch_kernel.reduce_batch as token_batch._reduce calls it."""
    u1, i8, f8 = _array("uint8"), _array("int64"), _array("float64")
    u1_2, i8_2, f8_2 = _array("uint8", 2), _array("int64", 2), _array("float64", 2)
    return (f"({_array('int32')}, int64, {_array('uint8', readonly=True)}, {i8_2}, {u1_2}, {i8}, {_array('float32')}, "
            f"{_array('float32')}, {u1}, int64, int64, float64, float64, {_array('int8')}, {f8}, {f8}, "
            f"{_array('uint8', 2, readonly=True)}, {_array('uint8', 2, readonly=True)}, {f8_2}, {i8}, {u1}, int64, "
            f"{f8}, {f8}, {f8_2}, {i8_2}, {f8_2}, {f8_2}, {i8_2}, {f8_2}, {f8}, {i8}, {i8}, {f8}, {f8}, {i8}, {i8_2})")


#: per family, the exported functions: (name in the module, defining module, its attribute, numba
#: signature as the JIT compiles it for the callers' arrays). An exported function takes
#: exactly these types, unchecked: callers pass what they pass the JIT kernels (C-contiguous, dtype)
AOT_FAMILIES: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "compare": (
        ("pair_f4", "rlprobe.comparison.pair_kernels", "_float_kernel", _pair_signature("float32")),
        ("pair_f8", "rlprobe.comparison.pair_kernels", "_float_kernel", _pair_signature("float64")),
        ("pair_i8", "rlprobe.comparison.pair_kernels", "_int_kernel", _pair_signature("int64")),
        ("read_files", "rlprobe.comparison.batch_kernels", "read_files",
         f"({_array('uint8', readonly=True)}, {_array('int64')}, {_array('int64')}, {_array('int64')}, int64, "
         f"{_array('int64', 2)}, {_array('int64')})"),
        ("compare_batch", "rlprobe.comparison.batch_kernels", "compare_batch",
         f"({_array('uint8')}, {_array('int64', 2)}, {_array('int64')}, {_array('int64')}, {_array('float64', 2)})"),
        ("compare_mapped", "rlprobe.comparison.mapped_kernels", "compare_mapped",
         f"({_array('uint8', readonly=True)}, {_array('int64')}, {_array('int64')}, {_array('int64')}, int64, "
         f"int64, {_array('int64', 2)}, "
         f"{_array('int64')}, {_array('float64', 2)})"),
    ),
    # a family per package: compare's commands do not wait for check's build, nor the other way round
    "check": tuple(
        (f"reduce_rows_{a}_{b}", "rlprobe.checks.token_kernel", "reduce_rows", _rows_signature(a, b))
        for a in ("float32", "float64") for b in ("float32", "float64")) + tuple(
        (f"reduce_maxima_{a}_{b}", "rlprobe.checks.token_kernel", "reduce_maxima", _maxima_signature(a, b))
        for a in ("float32", "float64") for b in ("float32", "float64")) + (
        ("reduce_batch", "rlprobe.checks.token_batch_kernel", "reduce_batch", _batch_signature()),),
}

_CPU_FIELDS = ("vendor_id", "model name", "flags", "cpu family", "model", "stepping")
_aot_lock = threading.Lock()
_aot_modules: dict[str, Any] = {}
_aot_looked: dict[str, int | None] = {}  # family -> the cache folder's mtime when its module was last looked for
_aot_key: list[str] = []


def aot_module_name(family: str) -> str:
    return f"rlprobe_aot_{family}"


def _first_cpu() -> bytes:
    """The identity of the first CPU in /proc/cpuinfo (not its clock: it changes)."""
    with open("/proc/cpuinfo", "rb") as f:
        block = f.read(1 << 16).split(b"\n\n", 1)[0]
    return b"\n".join(line for line in block.splitlines() if line.split(b":", 1)[0].strip().decode() in _CPU_FIELDS)


def _package_version_file(name: str) -> bytes:
    import importlib.util

    spec = importlib.util.find_spec(name)  # not imported: its _version.py is read
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(name)
    with open(os.path.join(list(spec.submodule_search_locations)[0], "_version.py"), "rb") as f:
        return f.read()


def aot_key() -> str:
    """A digest of what shapes the compiled code: the kernel sources and the build's, numba's,
    llvmlite's and numpy's versions (the module's C wrapper is built on numpy's headers: one built on
    numpy 1.x does not import under 2.x), Python's ABI, the CPU (the JIT compiles for the host's
    features), the exports and every NUMBA_* setting but the cache's (NUMBA_OPT, NUMBA_CPU_NAME, ...
    change the JIT's code too).
    Raises OSError or ImportError where one cannot be read."""
    if not _aot_key:
        from importlib.machinery import EXTENSION_SUFFIXES

        root = os.path.dirname(os.path.abspath(__file__))
        digest = hashlib.sha1(kernel_sources_digest().encode())
        with open(os.path.join(root, "numba_build.py"), "rb") as f:
            digest.update(f.read())
        import numpy

        for part in (_package_version_file("numba"), _package_version_file("llvmlite"), numpy.__version__.encode(),
                     _first_cpu(),
                     repr((sys.version, EXTENSION_SUFFIXES, AOT_FAMILIES)).encode(),
                     repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("NUMBA_")
                                 and k not in ("NUMBA_CACHE_DIR", "NUMBA_DEBUG_CACHE"))).encode()):
            digest.update(part + b"\0")
        _aot_key.append(digest.hexdigest()[:16])
    return _aot_key[0]


def aot_folder(create: bool = False) -> str | None:
    """``<user cache>/rlprobe/aot/<aot_key()>`` (None where it cannot be made or named: not Linux, whose
    /proc/cpuinfo names the CPU, or numba not installed)."""
    if not sys.platform.startswith("linux"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    try:
        path = os.path.join(base, "rlprobe", "aot", aot_key())
        if create:
            os.makedirs(path, exist_ok=True)
    except (OSError, ImportError):
        return None
    return path


def compiled_module(family: str) -> Any:
    """The family's ahead-of-time compiled module (its AOT_FAMILIES exports as functions), or None:
    the caller then uses the JIT kernels, as before. The first call of a process looks in the cache;
    when the module is missing there, it starts `python -m rlprobe.numba_build --background FAMILY`
    (detached; unless one is running, or one failed for this key: <family>.failed) and answers None,
    so the command that found it missing compiles or loads numba's JIT kernels as before and the next
    one imports the module; a later call of the same process looks again once the cache folder has
    changed (a build finished there: a pipeline or a notebook that runs on then takes the module; the
    kernels give the same bits). RLPROBE_AOT=0 turns this off (JIT kernels only, nothing built)."""
    with _aot_lock:
        if _aot_modules.get(family) is None and (family not in _aot_modules or _aot_folder_changed(family)):
            if os.environ.get("RLPROBE_AOT") == "0":
                _aot_modules[family], _aot_looked[family] = None, None  # never looked for again
            else:
                _aot_modules[family] = _load_or_build(family)
                _aot_looked[family] = _aot_folder_mtime()
        return _aot_modules[family]


def _aot_folder_changed(family: str) -> bool:
    looked = _aot_looked.get(family)
    return looked is not None and _aot_folder_mtime() != looked


def _aot_folder_mtime() -> int | None:
    folder = aot_folder()
    try:
        return None if folder is None else os.stat(folder).st_mtime_ns
    except OSError:
        return None


def _load_or_build(family: str) -> Any:
    folder = aot_folder()
    if folder is None:
        return None
    name = aot_module_name(family)
    try:
        found = [f for f in os.listdir(folder) if f.startswith(name + ".")]
    except OSError:
        found = []
    if not found:
        _start_build(family, folder)
        return None
    import importlib.util

    try:
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, found[0]))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):  # a module that does not load (a truncated copy...): the JIT path
        return None
    return module if all(hasattr(module, e[0]) for e in AOT_FAMILIES[family]) else None


def _start_build(family: str, folder: str) -> None:
    """Start the family's build, detached, unless it failed before for this key or one is running."""
    import fcntl
    import subprocess

    try:
        os.makedirs(folder, exist_ok=True)
        if os.path.exists(os.path.join(folder, f"{family}.failed")):
            return
        with open(os.path.join(folder, f"{family}.lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a build is running
            fcntl.flock(lock, fcntl.LOCK_UN)
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)}
        with open(os.path.join(folder, f"{family}.log"), "ab") as log:
            subprocess.Popen([sys.executable, "-m", "rlprobe.numba_build", "--background", family], env=env,
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    except OSError:  # BlockingIOError included
        return

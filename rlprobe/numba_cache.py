"""Where numba keeps its compiled kernels: shared by the comparison kernels and the CPU gradient
kernel, so neither has to import the other to set it; and numba loaded ahead of the first kernel."""

from __future__ import annotations

import hashlib
import os
import sys
import threading

#: the modules that define numba kernels (tests/test_numba_cache.py keeps the list whole). numba
#: checks a cached function against its own file only, so a kernel compiled into another one
#: (pair_kernels' element kernel into batch_kernels' batch) was loaded stale after only the first
#: file changed; the cache folder is named after the contents of all of them instead
KERNEL_MODULES = ("compare/pair_kernels.py", "compare/batch_kernels.py", "check/token_kernel.py",
                  "check/token_batch.py", "check/npy_reads.py",
                  "frameworks/cpu_grad_kernel.py", "frameworks/cpu_param_kernel.py")


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

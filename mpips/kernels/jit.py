"""How a kernel is compiled: ahead of time, or by numba as a process first calls it.

`make kernels` (run.ahead_build) compiles every kernel with the kinds of arguments a job
passes it into extension modules beside these sources (`_ahead_*.so`, their exports listed
in `_ahead.json`). Where that build is current (made from these very sources, for this
Python, numpy and CPU), `njit` gives each kernel as a guard over its exports (guard.c), and
a process loads no numba: a rank starts in a fraction of the time. Arguments of kinds no
export takes go to numba's JIT of the same source, in a copy of this package loaded for the
purpose (`twin`). Where there is no current build, or MPIPS_KERNELS=jit, `njit` is numba's.
Imports nothing of mpips outside this package.
"""
import hashlib
import importlib
import importlib.util
import json
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(_HERE, "_ahead.json")
TWIN = "_mpips_kernels_jit"   # the package's copy whose kernels numba compiles
# A module of this package loaded as the twin's: its kernels are always numba's.
_IN_TWIN = __name__.startswith(TWIN + ".")


def stamp() -> str:
    """What an ahead build must have been made for: the kernels' sources (this package's
    Python and C), the Python and numpy it was built against and this CPU's features."""
    h = hashlib.sha256(f"{sys.version} numpy {np.__version__}".encode())
    for name in sorted(os.listdir(_HERE)):
        if name.endswith((".py", ".c")):
            with open(os.path.join(_HERE, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
    h.update(_cpu_features())
    return h.hexdigest()


def _cpu_features() -> bytes:
    """The CPU's model and feature flags (code built for them may not run on another CPU)."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return b"?"
    wanted = (b"model name", b"flags", b"Features", b"CPU part")
    return b"\n".join(sorted({ln for ln in lines if ln.startswith(wanted)}))


class _Build:
    """The ahead build in use: the guard type and each kernel's exports."""

    def __init__(self, guarded, kernels: dict):
        self.guarded = guarded
        self.kernels = kernels


def _load() -> tuple["_Build | None", str]:
    """(the current ahead build, "") or (None, why not)."""
    if _IN_TWIN:
        return None, "the JIT copy"
    if os.environ.get("MPIPS_KERNELS", "ahead") == "jit":
        return None, "MPIPS_KERNELS=jit"
    try:
        with open(MANIFEST) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None, "no ahead build (make kernels)"
    except (OSError, ValueError) as e:
        return None, f"{MANIFEST} unreadable: {e}"
    if not isinstance(manifest, dict) or manifest.get("stamp") != stamp():
        return None, "the ahead build is not of these sources, Python, numpy or CPU"
    try:
        guard = importlib.import_module(__package__ + "._guard")
        modules: dict = {}
        kernels = {}
        for name, entries in manifest["kernels"].items():
            exports = []
            for module, export, kinds, native, entry in entries:
                if module not in modules:
                    modules[module] = importlib.import_module(f"{__package__}.{module}")
                loaded = modules[module]
                exports.append((getattr(loaded, export), bytes.fromhex(kinds))
                               + ((loaded.__file__, native, entry) if entry >= 0 else ()))
            kernels[name] = tuple(exports)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError) as e:
        return None, f"the ahead build does not load: {e}"
    return _Build(guard.Guarded, kernels), ""


_BUILD, WHY_NOT = _load()
AHEAD = _BUILD is not None
_GUARDED: list = []   # every kernel given as a guard, for `missed`


def njit(*args, **options):
    """numba.njit's decorator, `@njit(...)` or `@njit`: the kernel compiled ahead where
    there is a current build, else numba's dispatcher."""
    if _BUILD is None:
        import numba
        return numba.njit(*args, **options)
    if args and callable(args[0]):
        return _guarded(args[0])
    return _guarded


def intrinsic(func):
    """numba.extending.intrinsic, where kernels are numba's (an ahead build has them
    compiled in): else the function as it is, never called."""
    if _BUILD is None:
        from numba.extending import intrinsic as numba_intrinsic
        return numba_intrinsic(func)
    return func


def numba_name(module: str, name: str):
    """An object of numba's that kernels call (an intrinsic), where kernels are numba's;
    else None (an ahead build has it compiled in)."""
    if _BUILD is None:
        return getattr(importlib.import_module(module), name)
    return None


def _guarded(func):
    name = f"{func.__module__.rsplit('.', 1)[-1]}.{func.__name__}"
    kernel = _BUILD.guarded(name, _BUILD.kernels.get(name, ()), _Fallback(func), func)
    _GUARDED.append(kernel)
    return kernel


class _Fallback:
    """numba's JIT of a kernel, loaded the first time arguments come that no export takes."""

    def __init__(self, func):
        self.module = func.__module__.rsplit(".", 1)[-1]
        self.name = func.__name__
        self.jitted = None

    def __call__(self, *args, **kwargs):
        if self.jitted is None:
            self.jitted = getattr(twin(self.module), self.name)
        return self.jitted(*args, **kwargs)


def twin(module: str):
    """This package's module `module` loaded again, its kernels numba's dispatchers."""
    if TWIN not in sys.modules:
        import numba
        # A cache of its own: numba's entries name their module, and an entry the copy wrote
        # beside the package's own would send a process of numba's kernels after a module
        # of the copy's name.
        numba.config.CACHE_DIR = os.path.join(  # type: ignore[attr-defined]
            _HERE, "__pycache__", "jit-copy")
        spec = importlib.util.spec_from_file_location(
            TWIN, os.path.join(_HERE, "__init__.py"), submodule_search_locations=[_HERE])
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules[TWIN] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{TWIN}.{module}")


def missed() -> dict[str, int]:
    """How many calls each kernel compiled ahead has sent to numba's JIT (arguments of kinds
    its build does not take): the build's gaps."""
    return {k.name: k.misses for k in _GUARDED if k.misses}

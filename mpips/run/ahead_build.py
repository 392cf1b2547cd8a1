"""Compile the kernels ahead of time (`make kernels`): what kernels.jit loads instead of numba.

The kernels' miniature runs (warmup.compile_kernels, every role, model and option) compile
each kernel in numba with the kinds of arguments a job passes it; each of those is exported
into one extension module, `kernels/_ahead*.so`, by numba's ahead-of-time compiler, with
the call guard (kernels/guard.c) beside it, and `kernels/_ahead.json` lists the exports and
the kinds each takes. The list is written last: a build cut short is not used.

    MPIPS_KERNELS=jit python -m mpips.run.ahead_build
"""
import importlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np

from ..kernels import jit

_KERNELS = os.path.dirname(os.path.abspath(jit.__file__))
_LAYOUT_FLAG = {"C": 0x10, "F": 0x20, "A": 0}


def kinds(argtypes) -> bytes | None:
    """The guard's 4 bytes per argument (see guard.c) of numba argument types, or None if an
    argument is of a kind the guard does not check (it is then left to numba's JIT)."""
    from numba.core import types
    out = bytearray()
    for t in argtypes:
        if isinstance(t, types.Literal):   # a callee's constant argument: not called so
            return None
        if isinstance(t, types.Array):
            if not t.aligned or not isinstance(t.dtype, (types.Integer, types.Float,
                                                         types.Boolean)) or t.ndim > 15:
                return None
            dtype = np.dtype(str(t.dtype) if not isinstance(t.dtype, types.Boolean) else "?")
            out += bytes([0, ord(dtype.kind), dtype.itemsize,
                          t.ndim | _LAYOUT_FLAG[t.layout] | (0x40 if t.mutable else 0x80)])
        elif isinstance(t, (types.Integer, types.Float, types.Boolean)):
            dtype = np.dtype(str(t) if not isinstance(t, types.Boolean) else "?")
            out += bytes([1, ord(dtype.kind), dtype.itemsize, 0])
        else:
            return None
    return bytes(out)


def collect() -> list[tuple[str, str, tuple]]:
    """(module, function, argument types) of each kernel the miniature runs (and
    `make-data`'s) call from Python, the forms that take contiguous arrays first: what the
    guard will be asked for.
    Kernels numba compiles as callees of others are left out (they are compiled into their
    callers, and numba's ahead compiler fails to type some of them on their own)."""
    from numba.core.registry import CPUDispatcher

    from .warmup import compile_kernels
    called: dict = {}
    through = CPUDispatcher.__call__   # the C dispatcher's call

    def recording(dispatcher, *args, **kwargs):
        if not kwargs:
            called.setdefault(dispatcher, set()).add(
                tuple(dispatcher.typeof_pyval(a) for a in args))
        return through(dispatcher, *args, **kwargs)

    CPUDispatcher.__call__ = recording   # type: ignore[method-assign, assignment]
    try:
        compile_kernels()
        _make_data()
    finally:
        del CPUDispatcher.__call__
    found = []
    for dispatcher, forms in called.items():
        module, name = dispatcher.py_func.__module__, dispatcher.py_func.__name__
        if module.startswith(jit.__package__ + "."):
            for args in sorted(forms, key=lambda a: (_loose(a), str(a))):
                found.append((module.rsplit(".", 1)[-1], name, args))
    return sorted(found, key=lambda f: (f[0], f[1]))


def _make_data() -> None:
    """`make-data`'s kernels, each kind and format written once (tiny)."""
    from ..data.synthetic import make_data
    with tempfile.TemporaryDirectory() as scratch:
        for kind, fmt, interactions in (("ctr", "svmlight", 0), ("ctr", "libffm", 2),
                                        ("ctr", "criteo", 0), ("census", "svmlight", 0),
                                        ("dense", "svmlight", 0)):
            make_data(os.path.join(scratch, f"{kind}-{fmt}"), 20, kind=kind, fmt=fmt,
                      interactions=interactions)


def _loose(args: tuple) -> int:
    """How many arrays of `args` may be strided ('A'): forms with fewer go first (faster
    code for contiguous arrays)."""
    return sum(1 for t in args if getattr(t, "layout", "C") == "A")


def build(directory: str = _KERNELS, jobs: int = 2) -> dict:
    """Compile the ahead build into `directory` (the kernels' own, where jit looks): the
    kernels modules in `jobs` groups, each an extension module compiled by a process of its
    own, side by side. numba's ahead compiler carries typing state from one export to the
    next, and some modules' exports fail to type after others' (hashing's and keys'): a
    group that fails is split in two and each half compiled again; a module that fails
    alone stays numba's. Returns the list written."""
    if jit.AHEAD:
        raise SystemExit("mpips: the ahead build compiles with numba: run it with "
                         "MPIPS_KERNELS=jit")
    manifest_path = os.path.join(directory, os.path.basename(jit.MANIFEST))
    for name in os.listdir(directory):   # a build cut short leaves no list: none is used
        if name == os.path.basename(manifest_path) or name.startswith("_ahead_"):
            os.unlink(os.path.join(directory, name))
    started = time.monotonic()
    by_module: dict[str, list] = {}
    for module, name, args in collect():
        taken = kinds(args)
        if taken is not None and [name, taken.hex()] not in by_module.get(module, []):
            by_module.setdefault(module, []).append([name, taken.hex()])
    ordered = sorted(by_module, key=lambda m: -len(by_module[m]))
    pending = [ordered[i::jobs] for i in range(jobs)]   # about as many exports in each
    running: list = []
    built: dict[str, str] = {}   # kernels module -> the extension module holding it
    failed: list[str] = []
    count = 0
    while pending or running:
        while pending and len(running) < jobs:
            group = sorted(pending.pop(0))
            extension = f"_ahead_{count}"
            count += 1
            errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed once the child ends)
            child = subprocess.Popen(
                [sys.executable, "-m", "mpips.run.ahead_build", "--group", extension,
                 directory], stdin=subprocess.PIPE, stderr=errors, text=True,
                env={**os.environ, "MPIPS_KERNELS": "jit", "CFLAGS": _HELPER_CFLAGS})
            assert child.stdin is not None
            child.stdin.write(json.dumps({m: by_module[m] for m in group}))
            child.stdin.close()
            running.append((group, extension, child, errors))
        group, extension, child, errors = running.pop(0)
        with errors:
            if child.wait() == 0:
                built.update((m, extension) for m in group)
            elif len(group) > 1:
                pending += [group[:len(group) // 2], group[len(group) // 2:]]
            else:
                failed += group
                errors.seek(0)
                last = errors.read().strip().splitlines()[-1:]
                print(f"mpips: kernels.{group[0]} does not compile ahead: "
                      f"{last[0] if last else 'exit ' + str(child.returncode)}")
    kernels: dict[str, list] = {}
    for module, extension in built.items():
        for i, (name, taken) in enumerate(by_module[module]):
            kernels.setdefault(f"{module}.{name}", []).append(
                [extension, f"{module}__{name}__{i}", taken])
    _compile_guard(directory)
    manifest = {"stamp": jit.stamp(), "kernels": kernels,
                "exports": sum(len(v) for v in kernels.values()), "failed": failed}
    with open(manifest_path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(manifest_path + ".tmp", manifest_path)
    print(f"mpips: {manifest['exports']} kernel forms ({len(kernels)} kernels) compiled ahead "
          f"into {count} modules in {directory} in {time.monotonic() - started:.0f} s"
          + (f"; not compiled ahead (numba's at run time): {', '.join(failed)}" if failed
             else ""))
    return manifest


# numba's C helpers (NRT's allocations, the module's glue) are compiled into every extension
# module: without debugging information, and less optimised than CPython's extensions (they
# are not where the kernels spend their time), they compile in a third less time.
_HELPER_CFLAGS = "-O1 -g0"


def _build_group(extension: str, modules: dict, directory: str) -> None:
    """The exports of `modules` {kernels module: [[function, kinds hex], ...]} into
    `directory` as the extension module `extension`."""
    from numba.pycc import CC
    cc = CC(extension)
    cc.target_cpu = "host"   # as numba's JIT compiles: the stamp ties the build to this CPU
    for module, entries in modules.items():
        source = importlib.import_module(f"{jit.__package__}.{module}")
        for i, (name, taken) in enumerate(entries):
            dispatcher = getattr(source, name)
            args = tuple(_numba_type(bytes.fromhex(taken)[j:j + 4])
                         for j in range(0, len(taken) // 2, 4))
            dispatcher.compile(args)
            cc.export(f"{module}__{name}__{i}", dispatcher.overloads[args].signature)(
                dispatcher.py_func)
    with tempfile.TemporaryDirectory() as scratch:
        cc.output_dir = scratch
        cc.compile()
        for name in os.listdir(scratch):
            if name.startswith(extension) and name.endswith(".so"):
                shutil.move(os.path.join(scratch, name), os.path.join(directory, name))


def _numba_type(kind: bytes):
    """The numba type of one argument's 4 bytes of kinds (see `kinds`)."""
    from numba.core import types
    from numba.np.numpy_support import from_dtype
    dtype = from_dtype(np.dtype(f"{chr(kind[1])}{kind[2]}"))
    if kind[0] == 1:
        return dtype
    layout = "C" if kind[3] & 0x10 else "F" if kind[3] & 0x20 else "A"
    return types.Array(dtype, kind[3] & 0x0F, layout,  # type: ignore[call-overload]
                       readonly=bool(kind[3] & 0x80))


def _compile_guard(directory: str) -> None:
    """kernels/guard.c as the extension module _guard, with this Python's compiler."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    target = os.path.join(directory, "_guard" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([*compiler, "-shared", "-fPIC", "-O2",
                    f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}",
                    os.path.join(_KERNELS, "guard.c"), "-o", target + ".tmp"], check=True)
    os.replace(target + ".tmp", target)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--group"]:
        _build_group(sys.argv[2], json.load(sys.stdin), sys.argv[3])
    else:
        build()

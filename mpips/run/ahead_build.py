"""Compile the kernels ahead of time (`make kernels`): what kernels.jit loads instead of numba.

What to compile is `kernels/ahead_forms.json`, kept with the sources: each kernel the
miniature runs (warmup.compile_kernels, every role, model and option, and make-data) call
from Python, with the kinds of its arguments and its result's type, and the groups of
kernels modules that numba's ahead compiler compiles together. Each group becomes an
extension module, `kernels/_ahead_N*.so`, compiled by a process of its own, side by side,
with the call guard (kernels/guard.c) beside them, compiled with the direct entries into
each export's native function (ahead_natives); `kernels/_ahead.json` lists the exports, the
kinds each takes and its entry, written last: a build cut short is not used.

    MPIPS_KERNELS=jit python -m mpips.run.ahead_build            (make kernels)
    MPIPS_KERNELS=jit python -m mpips.run.ahead_build --forms    (the forms found again)

`--forms` runs the miniatures in numba to find the forms, builds them, and writes the
forms and the groups that compiled; tests/unit/test_ahead.py fails, saying so, when a
miniature calls a form the file lacks.
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
from . import ahead_natives

_KERNELS = os.path.dirname(jit.MANIFEST)
_LAYOUT_FLAG = {"C": 0x10, "F": 0x20, "A": 0}


def kinds(argtypes) -> bytes | None:
    """The guard's 4 bytes per argument (see guard.c) of numba argument types, or None if an
    argument is of a kind the guard does not check (it is then left to numba's JIT)."""
    from numba.core import types
    numbers = (types.Integer, types.Float, types.Boolean)
    out = bytearray()
    for t in argtypes:
        if isinstance(t, types.Array):
            if not t.aligned or not isinstance(t.dtype, numbers) or t.ndim > 15:
                return None
            dtype = _numpy_dtype(t.dtype)
            out += bytes([0, ord(dtype.kind), dtype.itemsize,
                          t.ndim | _LAYOUT_FLAG[t.layout] | (0x40 if t.mutable else 0x80)])
        elif isinstance(t, numbers):
            dtype = _numpy_dtype(t)
            out += bytes([1, ord(dtype.kind), dtype.itemsize, 0])
        else:
            return None
    return bytes(out)


def _numpy_dtype(t) -> np.dtype:
    """The numpy dtype of a numba number type (numba names its boolean 'bool')."""
    return np.dtype("?" if str(t) == "bool" else str(t))


def collect() -> list[tuple[str, str, tuple]]:
    """(module, function, argument types) of each kernel the miniature runs (and
    `make-data`'s) call from Python, the forms that take contiguous arrays first: what the
    guard will be asked for.
    Kernels numba compiles as callees of others are left out (they are compiled into their
    callers, and numba's ahead compiler fails to type some of them on their own)."""
    from numba.core.registry import CPUDispatcher
    called: dict = {}
    through = CPUDispatcher.__call__   # the C dispatcher's call

    def recording(dispatcher, *args, **kwargs):
        if not kwargs:
            called.setdefault(dispatcher, set()).add(
                tuple(dispatcher.typeof_pyval(a) for a in args))
        return through(dispatcher, *args, **kwargs)

    CPUDispatcher.__call__ = recording   # type: ignore[method-assign, assignment]
    try:
        miniatures()
    finally:
        del CPUDispatcher.__call__
    found = []
    for dispatcher, forms in called.items():
        module, name = dispatcher.py_func.__module__, dispatcher.py_func.__name__
        if module.startswith(jit.__package__ + "."):
            for args in sorted(forms, key=lambda a: (_loose(a), str(a))):
                found.append((module.rsplit(".", 1)[-1], name, args))
    return sorted(found, key=lambda f: (f[0], f[1]))


def miniatures() -> None:
    """What calls every kernel the build compiles: the warm-up's miniatures (every role,
    model and option) and `make-data`'s writers, each kind and format once (tiny)."""
    from ..data.synthetic import make_data
    from .warmup import compile_kernels
    compile_kernels()
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


FORMS = os.path.join(_KERNELS, "ahead_forms.json")


def found_forms() -> dict:
    """{kernels module: [[function, kinds hex, its result's type], ...]} of the kernels the
    miniatures call from Python (compiled in numba to run them)."""
    by_module: dict[str, list] = {}
    for module, name, args in collect():
        taken = kinds(args)
        dispatcher = getattr(importlib.import_module(f"{jit.__package__}.{module}"), name)
        result = repr(dispatcher.overloads[args].signature.return_type)
        if taken is not None and [name, taken.hex(), result] not in by_module.get(module, []):
            by_module.setdefault(module, []).append([name, taken.hex(), result])
    return by_module


def build(forms: dict, groups: list | None = None, directory: str = _KERNELS,
          jobs: int = 2) -> tuple[dict, list]:
    """Compile `forms` (see found_forms) into `directory` (the kernels' own, where jit
    looks), `groups` of kernels modules each an extension module (None: `jobs` groups of
    about as many forms), `jobs` at a time. numba's ahead compiler carries typing state from
    one export to the next, and some modules' exports fail to type after others' (hashing's
    and keys'): a group that fails is split in two and each half compiled again; a module
    that fails alone stays numba's. Returns (the list written, the groups compiled)."""
    if jit.AHEAD:
        raise SystemExit("mpips: the ahead build compiles with numba: run it with "
                         "MPIPS_KERNELS=jit")
    manifest_path = os.path.join(directory, os.path.basename(jit.MANIFEST))
    for name in os.listdir(directory):   # a build cut short leaves no list: none is used
        if name == os.path.basename(manifest_path) or name.startswith("_ahead_"):
            os.unlink(os.path.join(directory, name))
    started = time.monotonic()
    if groups is None:
        ordered = sorted(forms, key=lambda m: -len(forms[m]))
        groups = [ordered[i::jobs] for i in range(jobs)]
    pending = [sorted(m for m in g if m in forms) for g in groups]
    pending += [[m] for m in sorted(set(forms) - {m for g in groups for m in g})]
    pending = [g for g in pending if g]
    running: list = []
    built: dict[str, str] = {}   # kernels module -> the extension module holding it
    compiled: list[list] = []
    failed: list[str] = []
    count = 0
    while pending or running:
        while pending and len(running) < jobs:
            group = pending.pop(0)
            extension = f"_ahead_{count}"
            count += 1
            errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed once the child ends)
            child = subprocess.Popen(
                [sys.executable, "-m", "mpips.run.ahead_build", "--group", extension,
                 directory], stdin=subprocess.PIPE, stderr=errors, text=True,
                env={**os.environ, "MPIPS_KERNELS": "jit", "CFLAGS": _HELPER_CFLAGS})
            assert child.stdin is not None
            child.stdin.write(json.dumps({m: forms[m] for m in group}))
            child.stdin.close()
            running.append((group, extension, child, errors))
        group, extension, child, errors = running.pop(0)
        with errors:
            if child.wait() == 0:
                built.update((m, extension) for m in group)
                compiled.append(group)
            elif len(group) > 1:
                pending += [group[:len(group) // 2], group[len(group) // 2:]]
            else:
                failed += group
                errors.seek(0)
                last = errors.read().strip().splitlines()[-1:]
                print(f"mpips: kernels.{group[0]} does not compile ahead: "
                      f"{last[0] if last else 'exit ' + str(child.returncode)}")
    kernels: dict[str, list] = {}
    direct: list[tuple[str, str]] = []   # the forms with a direct entry (ahead_natives)
    for module, extension in built.items():
        for i, (name, taken, result) in enumerate(forms[module]):
            export, entry = f"{module}__{name}__{i}", -1
            if ahead_natives.has_entry(taken, result):
                entry = len(direct)
                direct.append((taken, result))
            kernels.setdefault(f"{module}.{name}", []).append(
                [extension, export, taken, ahead_natives.native_symbol(export), entry])
    _compile_guard(directory, ahead_natives.entries(direct))
    manifest = {"stamp": jit.stamp(), "kernels": kernels,
                "exports": sum(len(v) for v in kernels.values()), "failed": failed}
    with open(manifest_path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(manifest_path + ".tmp", manifest_path)
    print(f"mpips: {manifest['exports']} kernel forms ({len(kernels)} kernels) compiled ahead "
          f"into {len(compiled)} modules in {directory} in {time.monotonic() - started:.0f} s"
          + (f"; not compiled ahead (numba's at run time): {', '.join(failed)}" if failed
             else ""))
    return manifest, sorted(compiled)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--group"]:
        _build_group(argv[1], json.load(sys.stdin), argv[2])
        return
    if argv[:1] == ["--forms"]:
        forms = found_forms()
        _, compiled = build(forms)
        with open(FORMS + ".tmp", "w") as f:
            json.dump({"groups": compiled, "forms": forms}, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(FORMS + ".tmp", FORMS)
        print(f"mpips: the forms written to {FORMS}")
        return
    listed = read_forms(FORMS)
    if listed is None:
        build(found_forms())
    else:   # every group at once: their processes wait on the C compiler a part of the time
        build(*listed, jobs=max(2, len(listed[1])))


def read_forms(path: str) -> tuple[dict, list] | None:
    """(forms, groups) kept in `path`, or None, saying why, if it cannot be read as such."""
    try:
        with open(path) as f:
            listed = json.load(f)
        forms, groups = listed["forms"], listed["groups"]
        if not (isinstance(forms, dict) and isinstance(groups, list) and all(
                isinstance(e, list) and len(e) == 3 and all(isinstance(x, str) for x in e)
                for entries in forms.values() for e in entries)):
            raise ValueError("not {forms: {module: [[function, kinds, result], ...]}, groups}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"mpips: {path} unreadable ({e}): the forms found again (slower)")
        return None
    return forms, groups


# numba's C helpers (NRT's allocations, the module's glue) are compiled into every extension
# module: without debugging information, and less optimised than CPython's extensions (they
# are not where the kernels spend their time), they compile in a third less time.
_HELPER_CFLAGS = "-O1 -g0"


def _build_group(extension: str, modules: dict, directory: str) -> None:
    """The forms of `modules` {kernels module: [[function, kinds hex, result], ...]} into
    `directory` as the extension module `extension`."""
    from numba.core import types
    from numba.pycc import CC
    _release_the_gil()
    ahead_natives.keep_natives()
    cc = CC(extension)
    cc.target_cpu = "host"   # as numba's JIT compiles: the stamp ties the build to this CPU
    names = {**vars(types), "bool": types.boolean}
    for module, entries in modules.items():
        source = importlib.import_module(f"{jit.__package__}.{module}")
        for i, (name, taken, result) in enumerate(entries):
            args = tuple(_numba_type(bytes.fromhex(taken)[j:j + 4])
                         for j in range(0, len(taken) // 2, 4))
            # A numba type's repr names its constructor in numba.core.types (kept with the
            # sources, by --forms: nothing else is evaluated).
            signature = eval(result, {"__builtins__": {}}, names)(*args)
            cc.export(f"{module}__{name}__{i}", signature)(getattr(source, name).py_func)
    with tempfile.TemporaryDirectory() as scratch:
        cc.output_dir = scratch
        cc.compile()
        for name in os.listdir(scratch):
            if name.startswith(extension) and name.endswith(".so"):
                shutil.move(os.path.join(scratch, name), os.path.join(directory, name))


def _release_the_gil() -> None:
    """numba's ahead compiler to make exports that let go of the GIL while they run, as the
    kernels ask (nogil=True) and as numba's JIT makes them: its exports otherwise hold it
    for the whole call, and a rank's keep-alive thread (ranks.ulfm.KeepAlive), which calls
    MPI so that the failure detector hears from a rank in a long kernel, waited through it
    (0.9 s of a push of 20M keys that grew the table; 0.06 s with the GIL let go). It costs
    a call about 55 ns: a server's 3 kernel calls a training message, 1% of its handling."""
    from numba.core.compiler import Flags
    from numba.pycc import compiler

    class ReleasingTheGil(Flags):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.release_gil = True  # type: ignore[assignment]

    compiler.Flags = ReleasingTheGil  # type: ignore[misc]


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


def _compile_guard(directory: str, entries: str) -> None:
    """kernels/guard.c with the C source of the build's direct `entries` (ahead_natives) as
    the extension module _guard, with this Python's compiler."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    target = os.path.join(directory, "_guard" + sysconfig.get_config_var("EXT_SUFFIX"))
    with tempfile.TemporaryDirectory() as scratch:
        written = os.path.join(scratch, "entries.c")
        with open(written, "w") as f:
            f.write(entries)
        subprocess.run([*compiler, "-shared", "-fPIC", "-O2",
                        f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}",
                        os.path.join(_KERNELS, "guard.c"), written, "-o", target + ".tmp"],
                       check=True)
    os.replace(target + ".tmp", target)


if __name__ == "__main__":
    main(sys.argv[1:])

"""The kernels compiled ahead of time (kernels/jit, kernels/guard.c, run/ahead_build): the
same bits as numba's JIT, only arguments of the kinds an export takes reach it (the others go
to numba, never to compiled code that would read them as another kind), and a build that is
damaged, stale or asked off is not used."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from mpips.kernels import dense, jit, logistic, optim
from mpips.run.warmup import CompileWatch

from support import cannot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOUND_S = 60.0


@pytest.fixture(autouse=True)
def ahead():
    if not jit.AHEAD:
        cannot(f"the kernels are not compiled ahead here ({jit.WHY_NOT}): make kernels")


def _counts(kernel):
    return kernel.hits, kernel.misses


def test_a_kernel_compiled_ahead_gives_numbas_bits():
    """The exports and numba's JIT of the same source (the twin) agree to the bit on the
    kernels a minibatch and a server's table run."""
    rng = np.random.default_rng(7)
    rows, nnz, keys = 50, 400, 60
    indptr = np.sort(np.concatenate([[0, nnz], rng.integers(0, nnz, rows - 1)])).astype(np.int64)
    cols = rng.integers(0, keys, nnz).astype(np.int64)
    vals = rng.random(nnz).astype(np.float32)
    labels = (rng.random(rows) < 0.3).astype(np.float32)
    w = rng.normal(size=keys).astype(np.float32)
    twin = jit.twin("logistic")
    grads = [np.empty(keys, np.float32), np.empty(keys, np.float32)]
    losses = [f(indptr, cols, vals, labels, 3, w, g)
              for f, g in zip((logistic.logistic_gradient, twin.logistic_gradient), grads)]
    assert logistic.logistic_gradient.hits > 0
    assert losses[0] == losses[1]
    assert grads[0].tobytes() == grads[1].tobytes()

    state = [rng.random((keys, 2)).astype(np.float32) for _ in range(2)]
    state[1][:] = state[0]
    grad = rng.normal(size=(10, 1)).astype(np.float32)
    rows_ = np.arange(0, 20, 2, dtype=np.int64)
    for f, s in zip((optim.adagrad_update, jit.twin("optim").adagrad_update), state):
        f(s, rows_, grad, 0.1, 0.0, 1e-6)
    assert state[0].tobytes() == state[1].tobytes()


def test_a_kernel_compiled_ahead_lets_other_threads_run_while_it_does():
    """As numba's JIT with nogil=True: a rank's keep-alive thread (ranks.ulfm.KeepAlive) goes
    on calling MPI while a long kernel runs (a table grown, a test set's AUC), or the failure
    detector would take the rank for dead. Here a thread looks at the clock as often as it
    can, keeping each gap of more than a millisecond between two looks, while one call of
    0.2 s or more runs: no gap within the call is half of it."""
    n = 1 << 22
    scores = np.random.default_rng(3).random(n)
    labels = (np.arange(n) % 3 == 0).astype(np.float32)
    gaps, running, done = [], threading.Event(), threading.Event()

    def look():
        last = time.monotonic()
        running.set()
        while not done.is_set():
            now = time.monotonic()
            if now - last > 1e-3:
                gaps.append((last, now))
            last = now

    thread = threading.Thread(target=look)
    thread.start()
    running.wait(BOUND_S)
    hits = logistic.roc_auc.hits
    began = time.monotonic()
    logistic.roc_auc(scores, labels)
    ended = time.monotonic()
    done.set()
    thread.join(BOUND_S)
    assert logistic.roc_auc.hits == hits + 1, "the export ran it"
    assert ended - began >= 0.2, f"a call of {ended - began:.3f} s is too short to tell"
    within = max((min(b, ended) - max(a, began) for a, b in gaps), default=0.0)
    assert within < (ended - began) / 2, \
        f"the thread waited {within:.2f} s of a {ended - began:.2f} s call"


def test_arguments_of_another_kind_go_to_numba_not_to_the_export():
    """Each way an argument can differ from what an export takes (dtype, rank, layout, a
    read-only array where the kernel writes, a bool or float for an int, keywords): the call
    goes to numba's JIT, which computes it or refuses it; the export never sees it."""
    x = np.arange(8, dtype=np.float64)
    hits, misses = _counts(dense.total)
    assert dense.total(x) == 28.0
    assert _counts(dense.total) == (hits + 1, misses)
    assert dense.total(x.astype(np.float32)) == 28.0            # another dtype
    assert dense.total(x[::2]) == 12.0                          # not contiguous
    assert dense.total(x=x) == 28.0                             # by keyword
    assert _counts(dense.total) == (hits + 1, misses + 3)
    with pytest.raises(Exception):
        dense.total(x.reshape(2, 4))                            # another rank: numba refuses
    frozen = x.copy()
    frozen.setflags(write=False)
    with pytest.raises(Exception):
        dense.scale(2.0, frozen)                                # numba refuses to write it
    assert frozen.tobytes() == x.tobytes()
    with pytest.raises(Exception):
        dense.total("ab")                                       # not an array at all
    y = x.copy()
    before = _counts(dense.scale)
    dense.scale(2, y)                                           # an int for the float
    assert y.tobytes() == (2 * x).tobytes()
    assert _counts(dense.scale) == (before[0], before[1] + 1)


def test_a_call_the_build_does_not_take_is_reported_by_the_compile_watch():
    watch = CompileWatch()
    with watch.watching():
        dense.dot(np.ones(3, np.float32), np.ones(3, np.float32))
    assert any(name.startswith("dense.dot") for name in watch.compiled), watch.compiled
    quiet = CompileWatch()
    with quiet.watching():
        dense.dot(np.ones(3), np.ones(3))
    assert quiet.compiled == []


def _through_wrapper(kernel, *args):
    """`kernel` called through numba's wrapper of the export that takes `args` (not through
    its direct entry)."""
    hits = kernel.hits
    kernel(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])   # which export
    assert kernel.hits == hits + 1
    for export in kernel.exports:
        try:
            return export[0](*args)
        except TypeError:   # (another form's)
            continue
    raise AssertionError(f"no export of {kernel.name} takes these arguments")


def _alike(kernel, *args) -> None:
    """`kernel` gives the same result and leaves the same arrays through its direct entry as
    through numba's wrapper, each on its own copy of `args`."""
    mine = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    theirs = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    result = kernel(*mine)
    expected = _through_wrapper(kernel, *theirs)
    assert type(result) is type(expected) and result == expected, kernel.name
    for a, b in zip(mine, theirs):
        if isinstance(a, np.ndarray):
            assert a.tobytes() == b.tobytes(), kernel.name


def test_a_server_messages_kernels_run_through_their_native_functions_as_through_numbas():
    """The direct entries (run/ahead_natives) of the kernels a server's message calls, and of
    each kind of result (int64, uint64, float64, bool, None): their native functions give
    what numba's wrappers of them give, arrays written alike."""
    from mpips.kernels import checksum, fm, hashing, requests
    from mpips.models.optimizer import Optimizer
    from mpips.server.store import KVStore
    from mpips.wire import protocol
    from mpips.wire.placement import Placement
    for kernel in (requests.short_push, requests.pull_rows, optim.adagrad_update,
                   checksum.digest, hashing.is_sorted_unique, logistic.roc_auc, fm.fm_gradient):
        assert kernel.direct == len(kernel.exports), f"{kernel.name}: not every export"
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(1, 1 << 40, 300, dtype=np.uint64))
    n = keys.shape[0]
    push = protocol.pack(protocol.Header(protocol.Op.PUSH, ts=3, nkeys=n, width=2,
                                         flags=protocol.SAME_KEYS | protocol.CLOCK),
                         rng.normal(size=(n, 2)).astype(np.float32))
    _alike(requests.short_push, push, 0, 2, 0, np.empty((n, 2), np.float32))
    store = KVStore(1, Optimizer("adagrad", lr=0.1), capacity=1 << 10)
    pull = protocol.pack(protocol.Header(protocol.Op.PULL, ts=4, nkeys=n), keys)
    bounds, allowed, counts = Placement(1).key_check(0, True, np.zeros(1, np.int64))
    rows, meta = store._rows, store._meta   # (the table as the server's lookup reads it)
    _alike(requests.pull_rows, pull, protocol.HEADER_BYTES, bounds, allowed, counts, rows,
           meta, True, 1000, np.empty(n, np.uint64), np.empty(n, np.int64),
           np.empty((n, 1), np.float32), np.empty(n, np.uint8))
    state = rng.random((n, 2)).astype(np.float32)
    _alike(optim.adagrad_update, state, np.arange(n, dtype=np.int64),
           rng.normal(size=(n, 1)).astype(np.float32), 0.1, 0.0, 1e-6)
    acc, pending = checksum.start()
    checksum.update(acc, pending, rng.integers(0, 256, 1000, dtype=np.uint8))
    _alike(checksum.digest, acc, pending)
    _alike(hashing.is_sorted_unique, keys)
    _alike(hashing.is_sorted_unique, keys[::-1].copy())
    _alike(logistic.roc_auc, rng.random(500), (rng.random(500) < 0.4).astype(np.float32))


def test_a_kernel_that_raises_through_its_native_function_raises_as_numbas_wrapper_does():
    """A status that says the kernel raised sends the call to numba's wrapper, which raises
    the exception (here numba's for an array of negative size: a factorization machine's
    weights of no factor columns)."""
    from mpips.kernels import fm
    rows = np.array([0, 1], np.int64)
    hits = fm.fm_gradient.hits
    with pytest.raises(ValueError, match="negative"):
        fm.fm_gradient(rows, np.zeros(1, np.int64), np.ones(1, np.float32),
                       np.ones(1, np.float32), 0, np.zeros((1, 0), np.float32),
                       np.zeros((1, 0), np.float32))
    assert fm.fm_gradient.hits == hits + 1, "an export took it"


def test_a_guard_refuses_exports_it_cannot_check():
    from mpips.kernels._guard import Guarded
    with pytest.raises(TypeError):
        Guarded("x.y", ((len, b"\0\0\0"),), len, len)     # kinds: 4 bytes an argument
    with pytest.raises(TypeError):
        Guarded("x.y", ((None, b"\0" * 4),), len, len)    # not callable
    with pytest.raises(TypeError):
        Guarded("x.y", (), None, len)                      # no fallback


PROBE = """
import json, numpy as np
from mpips.kernels import dense, jit
print(json.dumps([jit.AHEAD, jit.WHY_NOT, dense.total(np.arange(4.0))]))
"""


def _probe(tree, **env) -> list:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=300, cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree), **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def tree(tmp_path):
    """A copy of mpips with its ahead build, to damage."""
    shutil.copytree(os.path.join(ROOT, "mpips"), tmp_path / "mpips",
                    ignore=shutil.ignore_patterns("*.nbi", "*.nbc"))
    return tmp_path


def test_a_copy_of_a_current_build_is_used(tree):
    assert _probe(tree)[:2] == [True, ""]


@pytest.mark.parametrize("damage, why", [
    ("manifest-truncated", "unreadable"),
    ("manifest-gone", "no ahead build"),
    ("source-edited", "not of these sources"),
    ("extension-gone", "does not load"),
    ("guard-gone", "does not load"),
    ("asked-off", "MPIPS_KERNELS=jit"),
])
def test_a_damaged_stale_or_unwanted_build_is_not_used_and_the_kernels_still_run(
        tree, damage, why):
    kernels = tree / "mpips" / "kernels"
    manifest = kernels / "_ahead.json"
    env = {}
    if damage == "manifest-truncated":
        manifest.write_text(manifest.read_text()[:100])
    elif damage == "manifest-gone":
        manifest.unlink()
    elif damage == "source-edited":
        with open(kernels / "dense.py", "a") as f:
            f.write("\n# edited\n")
    elif damage == "extension-gone":
        for path in kernels.glob("_ahead_*.so"):
            path.unlink()
    elif damage == "guard-gone":
        for path in kernels.glob("_guard*.so"):
            path.unlink()
    else:
        env["MPIPS_KERNELS"] = "jit"
    ahead, reason, total = _probe(tree, **env)
    assert not ahead and why in reason, reason
    assert total == 6.0


MISSED = """
import json, sys, numpy as np
from mpips.kernels import dense, jit
print(json.dumps([jit.AHEAD, dense.total(np.arange(4, dtype=np.{dtype}))]))
"""


@pytest.mark.parametrize("dtype", ["int16", "uint16"])
def test_numbas_cache_of_a_call_the_build_did_not_take_serves_numbas_own_processes(dtype):
    """A process of kernels compiled ahead sends an int16 array to numba, which caches what it
    compiles; a process of numba's kernels (MPIPS_KERNELS=jit) then compiles or loads the
    same form: it must not be handed the first's cache entry (which names a module only the
    first had)."""
    for env, ahead in (({}, True), ({"MPIPS_KERNELS": "jit"}, False), ({}, True)):
        done = subprocess.run([sys.executable, "-c", MISSED.format(dtype=dtype)],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env})
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1]) == [ahead, 6.0]


COVERED = """
import json
from mpips.kernels import jit
from mpips.run.ahead_build import miniatures
miniatures()
print(json.dumps([jit.AHEAD, jit.missed()]))
"""


def test_the_forms_kept_with_the_sources_cover_every_call_of_the_miniatures():
    """kernels/ahead_forms.json lists what the build compiles: every kernel call of the
    miniature runs (every role, model and option) and of make-data takes one of them. When
    this fails, a kernel or a miniature changed: `MPIPS_KERNELS=jit python -m
    mpips.run.ahead_build --forms` finds them again."""
    done = subprocess.run([sys.executable, "-c", COVERED], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    ahead, missed = json.loads(done.stdout.strip().splitlines()[-1])
    assert ahead and missed == {}, (
        f"calls no form of the ahead build takes: {missed}; run MPIPS_KERNELS=jit python -m "
        f"mpips.run.ahead_build --forms")


@pytest.mark.parametrize("text", ['{"forms": {"dense": [["total", "00"]]}, "groups": []}',
                                  '{"forms": [], "groups": []}', '{"groups": [[]]}', "{",
                                  '{"forms": {"dense": "total"}, "groups": []}'])
def test_a_damaged_forms_file_is_not_built_from(tmp_path, capsys, text):
    from mpips.run.ahead_build import FORMS, read_forms
    path = tmp_path / "forms.json"
    path.write_text(text)
    assert read_forms(str(path)) is None
    assert "unreadable" in capsys.readouterr().out
    forms, groups = read_forms(FORMS)
    assert forms and groups

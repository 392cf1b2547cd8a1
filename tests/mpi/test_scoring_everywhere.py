"""The test file scored on every rank (testscoring) against real servers: 2 servers + 2
workers. Every row is scored once, by whichever rank took its chunk, with the trained
model's weights; a server that does not answer the others' reads is named within the
timeout.

Run with: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
"""
import os
import tempfile

import numpy as np
import pytest
from mpi4py import MPI
from serving import server_for

from mpips.bounded import wait_all
from mpips.client import KVWorker
from mpips.config import TrainConfig
from mpips.errors import WaitTimeout
from mpips.evaluate import read_rows
from mpips.roles import split
from mpips.testscoring import Scoring
from mpips.worker_side import _score

pytestmark = pytest.mark.mpi(min_size=4)

ROWS, FEATURES = 30000, 3000


def held_out_file(rank: int) -> str:
    """An svmlight test file of ROWS rows, the same on every rank (each writes its own)."""
    rng = np.random.default_rng(5)
    path = os.path.join(tempfile.mkdtemp(prefix=f"mpips-scoring-{rank}-"), "test.svm")
    keys = rng.integers(0, FEATURES, (ROWS, 6))
    labels = rng.integers(0, 2, ROWS)
    with open(path, "w") as f:
        for label, row in zip(labels, keys):
            f.write(f"{label} " + " ".join(f"{k}:1" for k in sorted(set(row.tolist()))) + "\n")
    return path


def trained() -> tuple[np.ndarray, np.ndarray]:
    """(keys, gradient) worker 0 pushes: with SGD at rate 1 the model is minus it."""
    keys = np.arange(FEATURES, dtype=np.uint64)
    return keys, np.sin(keys.astype(np.float32)).reshape(-1, 1)


def margins_of_saved_model(path: str) -> np.ndarray:
    rows = read_rows(path)
    _, grad = trained()
    row_of_entry = np.repeat(np.arange(len(rows)), np.diff(rows.indptr))
    margins = np.zeros(len(rows))
    np.add.at(margins, row_of_entry, -grad[rows.indices.astype(np.int64), 0] * rows.values)
    return margins


def test_every_rank_scores_each_row_once_with_the_trained_model():
    roles = split(2, MPI.COMM_WORLD)
    cfg = TrainConfig(train="", test=held_out_file(MPI.COMM_WORLD.rank), bias=False, timeout=60)
    try:
        if roles.is_server:
            server = server_for(roles, capacity=1 << 13,
                                scoring=lambda s: Scoring(s, cfg, takes_chunks=True))
            server.run()
            margins, labels = server.scoring.results()
            assert margins.shape[0] > 0, "a server with chunks to take scores some"
        else:
            kv = KVWorker(roles, timeout=60)
            keys, grad = trained()
            kv.wait(kv.push(keys, grad if roles.index == 0 else 0 * grad, clock=True))
            kv.finish()
            wait_all([roles.group.Ibarrier()], 60, lambda: "both workers to finish")
            margins, labels, bad = _score(cfg, roles, kv)
            assert bad == 0
            kv.close()
        counts = np.array(roles.comm.allgather(margins.shape[0]))
        everything = np.empty(counts.sum())
        roles.comm.Allgatherv(margins.astype(np.float64), [everything, counts])
        expect = margins_of_saved_model(cfg.test)
        assert counts.sum() == ROWS, f"each row scored once: {counts.tolist()}"
        np.testing.assert_allclose(np.sort(everything), np.sort(expect), rtol=1e-5, atol=1e-5)
    finally:
        roles.free()


def test_a_server_that_answers_no_reads_is_named_within_the_timeout():
    roles = split(2, MPI.COMM_WORLD)
    cfg = TrainConfig(train="", test=held_out_file(MPI.COMM_WORLD.rank), bias=False, timeout=3)
    try:
        if roles.is_server and roles.index == 0:
            server = server_for(roles, capacity=1 << 13, timeout=3,
                                scoring=lambda s: Scoring(s, cfg, takes_chunks=True))
            with pytest.raises(WaitTimeout, match=r"server rank\(s\) \[1\] did not answer this "
                                                  r"server's reads of test keys within "
                                                  r"--timeout 3 s"):
                server.run()
        elif not roles.is_server:   # training over at once; they ask for no chunks
            kv = KVWorker(roles, timeout=60)
            kv.finish()
        # Server 1 is frozen to the others: it never answers, and only takes the messages
        # sent to it once server 0 has given up.
        wait_all([roles.comm.Ibarrier()], 60, lambda: "server 0 to give up")
        if roles.is_server and roles.index == 1:
            status = MPI.Status()
            while (message := roles.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)):
                message.Recv(np.empty(status.Get_count(MPI.BYTE), np.uint8))
    finally:
        roles.free()

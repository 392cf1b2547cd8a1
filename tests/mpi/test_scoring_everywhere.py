"""The test file scored on every rank (testscoring) against real servers: 2 servers + 2
workers. Every row is scored once, by whichever rank took its chunk, with the trained
model's weights; a server that does not answer the others' reads is named within the
timeout.

Run with: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
"""
import os
import shutil
import tempfile
import time

import numpy as np
import pytest
from mpi4py import MPI
from serving import server_for

from mpips.wire import protocol
from mpips.wire import tags
from mpips.ranks.bounded import wait_all
from mpips.worker.kvworker import KVWorker
from mpips.run.config import DataConfig, FaultToleranceConfig, ModelConfig, TrainConfig
from mpips.base.errors import WaitTimeout
from mpips.models.evaluate import read_rows
from mpips.ranks.roles import split
from mpips.wire.protocol import Header, Op
from mpips.job.scoring import Scoring
from mpips.job.worker_scoring import worker_share

pytestmark = pytest.mark.mpi(min_size=4)

ROWS, FEATURES = 30000, 3000
GO_TAG = 999   # the test's own word from a server to the workers


@pytest.fixture
def held_out_file():
    """held_out_file(rows): an svmlight test file of `rows` rows, the same on every rank (each
    writes its own, in a directory of its own that is removed after the test)."""
    directory = tempfile.mkdtemp(prefix=f"mpips-scoring-{MPI.COMM_WORLD.rank}-")
    yield lambda rows=ROWS: write_held_out(directory, rows)
    shutil.rmtree(directory, ignore_errors=True)


def write_held_out(directory: str, rows: int) -> str:
    rng = np.random.default_rng(5)
    path = os.path.join(directory, "test.svm")
    keys = rng.integers(0, FEATURES, (rows, 6))
    labels = rng.integers(0, 2, rows)
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


class SaysWhenItAsks(Scoring):
    """A server's scoring that tells the workers (GO_TAG) once it has asked for its first
    chunk: they ask for theirs only after both servers have, so that each server is handed
    one, by that order rather than by whose loop was idle first."""
    told = False

    def _ask_chunk(self) -> None:
        super()._ask_chunk()
        if not self.told:
            self.told = True
            for worker in self.server.roles.workers:
                self.server.roles.comm.Send(np.zeros(1, np.int64), worker, GO_TAG)


def test_every_rank_scores_each_row_once_with_the_trained_model(held_out_file):
    roles = split(2, MPI.COMM_WORLD)
    cfg = TrainConfig(data=DataConfig(train="", test=held_out_file()),
                      model=ModelConfig(bias=False),
                      faults=FaultToleranceConfig(timeout=60))
    try:
        if roles.is_server:
            server = server_for(roles, capacity=1 << 13,
                                scoring=lambda s: SaysWhenItAsks(s, cfg, takes_chunks=True))
            server.run()
            margins, labels = server.scoring.results()
            assert margins.shape[0] > 0, "a server with chunks to take scores some"
        else:
            kv = KVWorker(roles, timeout=60)
            keys, grad = trained()
            kv.wait(kv.push(keys, grad if roles.index == 0 else 0 * grad, clock=True))
            kv.finish()
            wait_all([roles.group.Ibarrier()], 60, lambda: "both workers to finish")
            wait_all([roles.comm.Irecv(np.zeros(1, np.int64), server, GO_TAG)
                      for server in roles.servers], 60, lambda: "both servers to ask for chunks")
            share = worker_share(cfg, roles, kv)
            margins = share.margins
            assert share.bad_lines == 0
            kv.close()
        counts = np.array(roles.comm.allgather(margins.shape[0]))
        everything = np.empty(counts.sum())
        roles.comm.Allgatherv(margins.astype(np.float64), [everything, counts])
        expect = margins_of_saved_model(cfg.data.test)
        assert counts.sum() == ROWS, f"each row scored once: {counts.tolist()}"
        np.testing.assert_allclose(np.sort(everything), np.sort(expect), rtol=1e-5, atol=1e-5)
    finally:
        roles.free()


def test_a_server_that_answers_no_reads_is_named_within_the_timeout(held_out_file):
    roles = split(2, MPI.COMM_WORLD)
    cfg = TrainConfig(data=DataConfig(train="", test=held_out_file()),
                      model=ModelConfig(bias=False),
                      faults=FaultToleranceConfig(timeout=3))

    def workers_done():
        # Before server 0's loop starts: a worker slow to start on a loaded machine would
        # race server 0's bound with its own silence.
        wait_all([roles.comm.Ibarrier()], 60, lambda: "the workers' FINISH and BYE sent")
    try:
        if roles.is_server and roles.index == 0:
            server = server_for(roles, capacity=1 << 13, timeout=3,
                                scoring=lambda s: Scoring(s, cfg, takes_chunks=True))
            workers_done()
            with pytest.raises(WaitTimeout, match=r"server rank\(s\) \[1\] did not answer this "
                                                  r"server's reads of test keys within "
                                                  r"--timeout 3 s"):
                server.run()
        elif not roles.is_server:   # training over at once; they ask for no chunks
            kv = KVWorker(roles, timeout=60)
            kv.finish()
            # Done, so that server 0 waits on server 1 alone: workers silent (as they would be
            # with their reads stuck at server 1 too) would race its bound with their own.
            kv.close()
            workers_done()
        else:
            workers_done()
        # Server 1 is frozen to the others: it never answers, and only takes the messages
        # sent to it once server 0 has given up.
        wait_all([roles.comm.Ibarrier()], 60, lambda: "server 0 to give up")
        if roles.is_server and roles.index == 1:
            status = MPI.Status()
            while (message := roles.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)):
                message.Recv(np.empty(status.Get_count(MPI.BYTE), np.uint8))
    finally:
        roles.free()


def test_scoring_a_chunk_longer_than_the_timeout_is_no_timeout(monkeypatch, held_out_file):
    """A server asks for its next chunk as it starts one; scoring that one may take longer
    than --timeout (a slow model): only a wait still unanswered counts, not the time a
    chunk answered long ago waited to be used. Here every batch server 1 scores takes
    0.5 s more (slowed on purpose; the lead, which hands out the chunks, is not), a
    server's chunk is 8 batches (4 s) and the timeout 3 s: server 1 answers the lead's
    reads between its batches, within 0.6 s on a loaded machine (5x under the timeout).
    The workers' FINISH is sent before the servers' loops start: a worker slow to start
    on a loaded machine (4 ranks and 2 busy processes on 2 cores) once left a server
    hearing nothing from it for 2 s."""
    rows = 32 * 8 * 2000   # a server's chunk: 1/8 of a rank's share of them
    roles = split(2, MPI.COMM_WORLD)
    cfg = TrainConfig(data=DataConfig(train="", test=held_out_file(rows)),
                      model=ModelConfig(bias=False),
                      faults=FaultToleranceConfig(timeout=3.0))
    slow = Scoring._score

    def slowed(self, batch):
        if self.server.roles.index == 1:
            time.sleep(0.5)
        slow(self, batch)

    def finish_sent():
        wait_all([roles.comm.Ibarrier()], 60, lambda: "the workers' FINISH sent")
    try:
        if roles.is_server:
            monkeypatch.setattr(Scoring, "_score", slowed)
            server = server_for(roles, capacity=1 << 13, timeout=3.0,
                                scoring=lambda s: Scoring(s, cfg, takes_chunks=True))
            finish_sent()
            server.run()
            margins, _ = server.scoring.results()
            if roles.index == 1:
                assert margins.shape[0] >= 8 * 2000, "a chunk of eight slow batches scored"
        else:
            kv = KVWorker(roles, timeout=60)
            kv.finish()
            finish_sent()
            wait_all([roles.group.Ibarrier()], 60, lambda: "both workers to finish")
            margins = worker_share(cfg, roles, kv).margins
            kv.close()
        assert roles.comm.allreduce(margins.shape[0]) == rows
    finally:
        roles.free()


def test_a_read_of_test_keys_before_a_workers_finish_waits_for_it(held_out_file):
    """Server 0 reads test keys of server 1 once every worker's FINISH has reached it; that
    READ may reach server 1 before a worker's FINISH does (they come from different ranks):
    server 1 answers it once the FINISH is in, instead of stopping the job. Here rank 0
    plays server 0 by hand and sends its READ before the workers say FINISH."""
    roles = split(2, MPI.COMM_WORLD)
    cfg = TrainConfig(data=DataConfig(train="", test=held_out_file()),
                      model=ModelConfig(bias=False),
                      faults=FaultToleranceConfig(timeout=60))
    keys = np.arange(FEATURES, dtype=np.uint64)
    mine = keys[server_for(roles).placement.owners(keys) == 1]
    try:
        if roles.is_server and roles.index == 1:
            server = server_for(roles, capacity=1 << 13,
                                scoring=lambda s: Scoring(s, cfg, takes_chunks=False))
            server.run()
        elif roles.is_server:
            out = np.empty((mine.shape[0], 1), np.float32)
            n_tags = protocol.reply_tags(roles.comm.Get_attr(MPI.TAG_UB))
            reply = roles.comm.Irecv(out, 1, protocol.reply_tag(7, n_tags))
            roles.comm.Send(protocol.pack(Header(Op.READ, ts=7, nkeys=mine.shape[0]), mine), 1,
                            tags.REQUEST_TAG)
            for worker in roles.workers:   # only now may they say FINISH
                roles.comm.Send(np.zeros(1, np.int64), worker, GO_TAG)
            wait_all([reply], 60, lambda: "server 1's answer")
            np.testing.assert_array_equal(out, 0)   # nothing trained: the final weights
            roles.comm.Send(protocol.pack(Header(Op.SCORED)), 1, tags.REQUEST_TAG)
            # The workers' messages to this stand-in (FINISH, CHUNK, BYE) and server 1's
            # SCORED: taken, so that none is left unreceived.
            taken, status = 0, MPI.Status()
            while taken < 7:
                message = roles.comm.Mprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
                buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                message.Recv(buf)
                if protocol.header(buf).op == Op.CHUNK:
                    roles.comm.Send(np.zeros(2, np.int64), status.Get_source(),
                                    protocol.reply_tag(protocol.header(buf).ts, n_tags))
                taken += 1
        if not roles.is_server:
            kv = KVWorker(roles, timeout=60)
            wait_all([roles.comm.Irecv(np.zeros(1, np.int64), 0, GO_TAG)], 60,
                     lambda: "server 0's READ to be sent")
            kv.finish()
            margins = worker_share(cfg, roles, kv).margins   # no rows: the stand-in hands out none
            assert margins.shape[0] == 0
            kv.close()
    finally:
        roles.free()


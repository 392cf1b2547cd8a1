"""Scoring the test rows on every rank once training is over, servers included.

The lead server hands out the test file in chunks (spans of rows, or of bytes of text), to
whichever rank asks (CHUNK): large ones first, smaller as the rows run out (guided
self-scheduling), so that a rank busy answering reads, or slow for any reason, takes less
and the ranks finish together. A worker scores its chunks with pulls (job.worker_scoring). A server
scores its chunks in its loop's idle turns, a small batch a turn, so that it answers the
workers' reads first: the keys it holds are read from its own table, the others asked of
their servers (READ). Every server answers READs until each has said it is done (SCORED).

Under ULFM a worker may die while scoring, and the scores it holds with it: the servers
score nothing, a worker asks for a chunk only once it has scored those it was handed, and
the lead keeps what it handed to whom. A dead worker's chunks go to the next workers that
ask, and the lead says none is left only once every living worker asks (has scored all it
was handed). Should the lead itself die meanwhile, the chunks it handed out are not known
to the next: that one answers that the hand-out was lost (LOST), and the job ends trained,
not scored (see `chunks.covered`). Pipelines and full-batch solvers share the file among the
workers in fixed parts.

No numeric loops here: keys and margins come from the workers' kernels.
"""
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..base.errors import WaitTimeout
from ..data.parquet import ParquetShard
from ..data.shards import CsrShard
from ..data.textfile import KeyIndexer, Rows, TextShard
from ..wire import messages, protocol
from ..wire.protocol import Op
from .chunks import LOST, Asked, Chunks, HandOut, HeldOutFile, concatenated

log = logging.getLogger("mpips")

SERVER_BATCH = 2000    # a server's: it answers no read while it works on one
AHEAD = 2              # a server's batches whose reads are under way at once

def core_to_spare(roles) -> bool:
    """Whether this server has a core of its own, whose idle time it can score with. On a
    node with more ranks than cores, a server scoring takes the core from a worker, and its
    rows cost more than a worker's (reads between servers, smaller batches): measured here,
    2 servers + 2 workers on 2 cores scored 15% slower with the servers taking chunks; 1 + 1
    14% faster."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    if cores <= 1:   # bound to one core (or not known): are there as many as ranks?
        cores = os.cpu_count() or 1
    return roles.ranks_on_node() <= cores


@dataclass
class _Batch:
    rows: Rows
    cols: np.ndarray
    bias_col: int
    out: np.ndarray            # weights, grouped by server
    perm: np.ndarray | None    # out[i] is of key perm[i] (None: in key order)
    replies: list = field(default_factory=list)   # MPI.Request of each remote part
    asked: list = field(default_factory=list)     # the server ranks asked
    sent: float = 0.0


class Scoring:
    """A server's part in scoring: its own chunks (if `takes_chunks`), the READs of the
    others, and (the lead) handing out the chunks; `hot`: under ULFM (see HandOut)."""

    def __init__(self, server, cfg, takes_chunks: bool = True, hot: bool = False):
        self.server = server
        self._takes_chunks = takes_chunks
        self._hot = hot
        self._hand_out_lost = False  # it came to lead after the lead that handed out died
        self._cfg = cfg
        self._model = cfg.model.spec()
        self._index = KeyIndexer(self._model.reserved_keys())
        self._test: HeldOutFile | None = None   # once training is over
        self._chunks: Chunks | None = None      # the lead's, opened at the first CHUNK
        self._handout: HandOut | None = None    # under ULFM, the lead's hand-out of them
        # (request or None, int64[2]) of a chunk asked for
        self._chunk: tuple[MPI.Request | None, np.ndarray] | None = None
        self._chunk_asked = 0.0
        # The chunk being scored, and its batches.
        self._shard: CsrShard | TextShard | ParquetShard | None = None
        self._batches: Iterator[Rows] | None = None
        self._in_flight: list[_Batch] = []
        self._ts = 0
        self._reply_tags = protocol.reply_tags(server.roles.comm.Get_attr(MPI.TAG_UB))
        self._scored: list[tuple[np.ndarray, np.ndarray]] = []   # (margins, labels) a batch
        self._scoring = set(range(len(server.roles.servers)))   # servers not done yet
        # (source, ts, keys, when) of READs before training ended
        self._early_reads: list[tuple[int, int, np.ndarray, float]] = []
        self.began: float | None = None
        self.score_s, self.bad_lines, self.units = 0.0, 0, 0

    def handlers(self) -> dict:
        return {Op.READ: self.on_read, Op.SCORED: self.on_scored, Op.CHUNK: self.on_chunk}

    @property
    def busy(self) -> bool:
        """Whether this server or another still scores (so reads may still come)."""
        return bool(self._scoring) and not self.server.gate.stopped

    @property
    def scoring_here(self) -> bool:
        """Whether this server has started scoring and not finished."""
        return self.began is not None and self.server.roles.index in self._scoring

    @property
    def waiting_for(self) -> list:
        """The servers (ranks) not yet done scoring."""
        return [self.server.roles.servers[s] for s in sorted(self._scoring)]

    def results(self) -> tuple[np.ndarray, np.ndarray]:
        """(margins, labels) of the rows this server scored."""
        return concatenated(self._scored)

    def poll(self) -> bool:
        """An idle turn of the loop: once training is over, score a batch whose weights are
        in, or ask for the next one's. Whether it did either (if not, it waits on others)."""
        me = self.server.roles.index
        self._answer_early_reads()
        if me not in self._scoring or not self.busy:
            return False
        if self.began is None:
            if not self.server.clocks.final:
                return False
            self.began = time.monotonic()
            self._test = self._test or HeldOutFile(self._cfg)
            if self._takes_chunks:
                self._ask_chunk()
        worked = self._step()
        if not self._in_flight and self._chunk is None and self._batches is None:
            self._done(me)
            self.score_s = time.monotonic() - self.began
            for index, rank in enumerate(self.server.roles.servers):
                if index != me:
                    self.server.send(messages.Scored().pack(), rank)
            return True
        self._check_time()
        return worked

    def _step(self) -> bool:
        """A batch's work at most (the reads of others are answered between): score the
        oldest batch if its weights are in, else ask for the next batch's."""
        if self._in_flight and self._answered(self._in_flight[0]):
            self._score(self._in_flight.pop(0))
            return True
        if len(self._in_flight) >= AHEAD:
            return False
        rows = next(self._batches, None) if self._batches is not None else None
        if rows is None and self._next_chunk():
            assert self._batches is not None, "_next_chunk() opened the chunk's batches"
            rows = next(self._batches, None)
        if rows is None:
            return False
        self._in_flight.append(self._ask(rows))
        return True

    def on_read(self, source: int, request, buf) -> None:
        """Another server's READ of test keys: this server's final weights of them, once
        every worker's FINISH is in here too (it may come after the READ: they come from
        different ranks) and their last clocks are applied."""
        if self.server.clocks.final:
            self.server.reply(self.server.final_weights(request.keys), source,
                              request.header.ts)
            return
        self._early_reads.append((source, request.header.ts, request.keys.copy(),
                                  time.monotonic()))

    def _answer_early_reads(self) -> None:
        if not self._early_reads:
            return
        if self.server.clocks.final:
            for source, ts, keys, _ in self._early_reads:
                self.server.reply(self.server.final_weights(keys), source, ts)
            self._early_reads.clear()
            return
        source, _, _, when = self._early_reads[0]
        if time.monotonic() - when > self.server.timeout:
            raise WaitTimeout(f"{self.server.sender(source)} read test keys while workers were "
                              f"training, and they had not all finished here within --timeout "
                              f"{self.server.timeout:g} s")

    def on_scored(self, source: int, request, buf) -> None:
        self._done(self.server.roles.servers.index(source))

    def on_chunk(self, source: int, request, buf) -> None:
        """A rank asks the lead which chunk of the test file to score."""
        roles = self.server.roles
        if self._hand_out_lost:
            self.server.reply(np.array(LOST, np.int64), source, request.header.ts)
        elif self._hot and source not in roles.servers:
            self._opened_chunks()
            assert self._handout is not None, "_opened_chunks() makes it under ULFM"
            self._handout.asking[roles.worker_index(source)] = Asked(source, request.header.ts)
            self._answer()
        else:
            self.server.reply(self._hand_out(source in roles.servers), source,
                              request.header.ts)

    def _answer(self) -> None:
        """Under ULFM: the requests for chunks the lead can answer now (see HandOut)."""
        assert self._handout is not None, "asked for chunks under ULFM: _opened_chunks() made it"
        gone = self.server.clocks.gone
        living = {w for w in range(len(self.server.roles.workers)) if w not in gone}
        for asked, span in self._handout.answers(living):
            self.server.reply(np.array(span, np.int64), asked.source, asked.ts)

    def worker_gone(self, worker: int) -> None:
        """The lead: a worker died; the chunks it was handed go to others."""
        if self._handout is None:
            return
        held = self._handout.worker_died(worker)
        if held:
            log.warning("worker %d died holding the scores of %d chunk(s) of the test file: "
                        "they go to the next workers that ask", worker, held)
        self._answer()

    def servers_gone(self, gone: set, was_lead: bool) -> None:
        """Servers `gone` (indices) died: they are not waited for. Under ULFM, a server that
        comes to lead once training is over does not know what the dead lead handed out."""
        self._scoring -= gone
        if self._hot and self.server.lead and not was_lead and self.server.clocks.all_finished:
            self._hand_out_lost = True
            log.warning("the lead server died after training: the chunks of the test file it "
                        "handed out are not known here, so the test file is not scored")

    def _opened_chunks(self) -> Chunks:
        """The lead's Chunks of the test file (and under ULFM its HandOut), at the first
        CHUNK: under ULFM only the workers take chunks."""
        if self._chunks is None:
            self._test = self._test or HeldOutFile(self._cfg)
            roles = self.server.roles
            self._chunks = self._test.chunks(len(roles.workers) + (0 if self._hot else
                                                                   len(roles.servers)))
            self._handout = HandOut(self._chunks) if self._hot else None
        return self._chunks

    def _hand_out(self, small: bool) -> np.ndarray:
        if self.server.gate.stopped:   # the job stops: a checkpoint holds the model; no scores
            return np.zeros(2, np.int64)
        return np.array(self._opened_chunks().take(small), np.int64)

    def _done(self, server: int) -> None:
        self._scoring.discard(server)

    def _ask_chunk(self) -> None:
        """Ask the lead for the next chunk (the lead takes it from its own hand-out)."""
        if self.server.lead:
            self._chunk = (None, self._hand_out(True))
            return
        self._ts += 1
        answer, lead = np.empty(2, np.int64), self.server.lead_rank
        self.server.send(protocol.pack(protocol.Header(Op.CHUNK, ts=self._ts)), lead)
        tag = protocol.reply_tag(self._ts, self._reply_tags)
        self._chunk = (self.server.roles.comm.Irecv(answer, lead, tag), answer)
        self._chunk_asked = time.monotonic()

    def _next_chunk(self) -> bool:
        """Move on to the chunk asked for, if the lead has answered: whether there is one
        (and its batches) now. The next one is asked for at once."""
        if self._shard is not None:
            self.bad_lines += self._shard.bad_lines
            self._shard = self._batches = None
        if self._chunk is None:
            return False
        request, answer = self._chunk
        if request is not None and not request.Test():
            return False
        self._chunk = None
        assert self._test is not None, "poll() opens it before asking for chunks"
        self._shard = self._test.chunk(answer, "the lead server")
        if self._shard is None:
            return False
        self._batches = self._shard.minibatches(SERVER_BATCH)
        self.units += int(answer[1] - answer[0])
        self._ask_chunk()
        return True

    def _ask(self, rows) -> _Batch:
        """Read a batch's weights: this server's keys from its table, the others' by READ."""
        server = self.server
        assert self._shard is not None, "the rows come from its batches"
        keys, cols, bias_col = self._index(rows, self._cfg.model.bias, self._shard.path)
        perm, offsets = server.placement.by_server(keys)
        grouped = keys if perm is None else keys[perm]
        batch = _Batch(rows, cols, bias_col,
                       np.empty((keys.shape[0], server.store.width), np.float32), perm,
                       sent=time.monotonic())
        self._ts += 1
        for s, rank in enumerate(server.roles.servers):
            a, b = int(offsets[s]), int(offsets[s + 1])
            if a == b:
                continue
            if s == server.roles.index:
                batch.out[a:b] = server.final_weights(grouped[a:b])
                continue
            h = protocol.Header(Op.READ, ts=self._ts, nkeys=b - a,
                                placement=server.placement.version)
            server.send(protocol.pack(h, grouped[a:b]), rank)
            tag = protocol.reply_tag(self._ts, self._reply_tags)
            batch.replies.append(server.roles.comm.Irecv(batch.out[a:b], rank, tag))
            batch.asked.append(rank)
        return batch

    @staticmethod
    def _answered(batch: _Batch) -> bool:
        return MPI.Request.Testall(batch.replies) if batch.replies else True

    def _score(self, batch: _Batch) -> None:
        weights = batch.out
        if batch.perm is not None:
            weights = np.empty_like(batch.out)
            weights[batch.perm] = batch.out
        self._scored.append((self._model.margins(batch.rows, batch.cols, batch.bias_col,
                                                 weights), batch.rows.labels))

    def _check_time(self) -> None:
        """Every wait has a bound: the oldest batch's reads, the chunk asked of the lead (each
        only while unanswered: scoring a large chunk may take longer)."""
        now, timeout = time.monotonic(), self.server.timeout
        batch = self._in_flight[0] if self._in_flight else None
        if batch and now - batch.sent > timeout and not self._answered(batch):
            raise WaitTimeout(f"server rank(s) {batch.asked} did not answer this "
                              f"server's reads of test keys within --timeout {timeout:g} s")
        request = self._chunk[0] if self._chunk else None
        if request is not None and now - self._chunk_asked > timeout and not request.Test():
            raise WaitTimeout(f"the lead server did not hand out a chunk of the test rows "
                              f"within --timeout {timeout:g} s")

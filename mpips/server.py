"""A server's event loop: receive requests, apply pushes, answer pulls when clocks allow.

One thread, one message at a time, in arrival order. MPI keeps the messages
from one worker in order, so a worker always reads its own earlier pushes.
"""
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from . import protocol
from .bounded import Backoff, wait_all
from .clocks import FINISHED, ClockTable
from .errors import ProtocolError, WaitTimeout
from .progress import Progress
from .protocol import Op
from .store import KVStore


@dataclass
class ServerStats:
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    pulls_held: int = 0       # pulls that had to wait for other workers' clocks
    busy_s: float = 0.0       # time spent handling requests (the rest is waiting for them)


# One pull served to a worker still training, recorded with --record-pulls: who read, at which
# clock, how far the slowest worker had got (-1 once all others have finished), how long the
# pull was held for the clocks, and when (seconds since the server started serving).
PULL_RECORD = np.dtype([("worker", "<i4"), ("clock", "<i8"), ("slowest", "<i8"),
                        ("held_s", "<f8"), ("t", "<f8")])


class Server:
    def __init__(self, roles, store: KVStore, clocks: ClockTable, timeout: float,
                 on_error=None, progress: Progress | None = None, record_pulls: bool = False,
                 every: tuple | None = None):
        """`every` = (seconds, callback): call callback(final=False) at each multiple of
        `seconds` while serving (skipping those missed while busy), and callback(final=True)
        once when every worker has finished training."""
        self.roles = roles
        self.store = store
        self.clocks = clocks
        self.timeout = timeout
        self.on_error = on_error
        self.progress = progress
        self.stats = ServerStats()
        self._reply_tags = protocol.reply_tags(roles.comm.Get_attr(MPI.TAG_UB))
        self._held = deque()      # pulls waiting for clocks:
                                  # [clock, worker, source, ts, keys, insert, held since]
        self._replies = []        # (request, buffer) of replies still being sent
        self._heard = np.zeros(len(roles.workers))   # when each worker last sent something
        self.pulls = [] if record_pulls else None
        self.held_s = np.zeros(len(roles.workers))   # per worker: time its pulls were held
        # Per worker, the last pulls served: ts -> (keys, rows found, table generation), so a
        # push of the same keys (SAME_KEYS) needs neither the keys nor a second lookup.
        self._pulled = [OrderedDict() for _ in roles.workers]
        self._every = every
        self._final_taken = False
        self._start = time.monotonic()

    def run(self) -> ServerStats:
        """Serve until every worker has said BYE."""
        comm = self.roles.comm
        status = MPI.Status()
        backoff = Backoff()
        buf = np.empty(1 << 16, np.uint8)
        talking = set(self.roles.workers)
        self._start = time.monotonic()
        self._heard[:] = self._start
        next_call = self._start + (self._every[0] if self._every else float("inf"))
        next_check = self._start
        while talking:
            if self._final_taken:
                next_call = float("inf")
            if time.monotonic() >= next_call:
                self._timed(final=False)
                missed = (time.monotonic() - self._start) // self._every[0]
                next_call = self._start + (missed + 1) * self._every[0]
            msg = comm.Improbe(MPI.ANY_SOURCE, protocol.REQUEST_TAG, status)
            if msg is None:
                if time.monotonic() >= next_check:
                    self._check_silence(talking)
                    self._reap_replies()
                    next_check = time.monotonic() + 0.5
                backoff.idle()
                continue
            backoff.reset()
            began = time.monotonic()
            nbytes = status.Get_count(MPI.BYTE)
            if buf.shape[0] < nbytes:
                buf = np.empty(max(nbytes, 2 * buf.shape[0]), np.uint8)
            msg.Recv([buf, nbytes, MPI.BYTE])
            self.stats.requests += 1
            self.stats.bytes_received += nbytes
            source = status.Get_source()
            if self._handle(source, buf[:nbytes]) is Op.BYE:
                talking.discard(source)
            self.stats.busy_s += time.monotonic() - began
        wait_all([r for r, _ in self._replies], self.timeout, lambda: "pull replies to be sent")
        if self.progress:
            self.progress.log(final=True)
        return self.stats

    def _timed(self, final: bool) -> None:
        began = time.monotonic()
        self._every[1](final=final)
        self.stats.busy_s += time.monotonic() - began

    def _check_silence(self, talking: set) -> None:
        """Fail if no worker that is still talking has sent anything for `timeout` seconds."""
        now = time.monotonic()
        ranks = sorted(talking)
        heard = [self._heard[self.roles.worker_index(r)] for r in ranks]
        if now - max(heard) <= self.timeout:
            return
        held = {item[2] for item in self._held}
        lines = []
        for rank, last in zip(ranks, heard):
            w = self.roles.worker_index(rank)
            clock = self.clocks.done[w]
            state = ("finished training" if clock == FINISHED else f"at clock {clock}")
            waiting = ", waiting for a pull held for the clocks" if rank in held else ""
            lines.append(f"worker {w} (rank {rank}) {state}, silent {now - last:.0f} s{waiting}")
        raise WaitTimeout(f"no worker has sent anything for {now - max(heard):.0f} s "
                          f"(--timeout {self.timeout:g}): " + "; ".join(lines))

    def _handle(self, source: int, buf: np.ndarray) -> Op:
        h, keys, values = protocol.unpack(buf)
        op = Op(h.op)
        if op is Op.ERROR:
            who = (f"worker {self.roles.worker_index(source)}" if source in self.roles.workers
                   else f"server {source}")
            if self.on_error:
                self.on_error(f"{who}: {protocol.error_text(buf)}")
            self._send(np.ones(1, np.int64), source, protocol.ERROR_ACK_TAG)
            return op
        worker = self.roles.worker_index(source)
        self._heard[worker] = time.monotonic()
        if self.progress:
            self.progress.update(worker, h)
        if op is Op.PULL:
            # READ_ONLY only spares storing unknown keys: the clocks apply to every read
            # (a finished worker's reads, such as scoring the test file, never wait).
            insert = not h.flags & protocol.READ_ONLY
            clock = self.clocks.read_clock(worker, bool(h.flags & protocol.NEXT_CLOCK))
            if self.clocks.may_read(worker, clock):
                self._serve(worker, source, h.ts, keys, insert, None)
            else:
                self._held.append([clock, worker, source, h.ts, keys.copy(), insert,
                                   self._held_since(worker, clock)])
        elif op is Op.PUSH:
            if not h.flags & protocol.SAME_KEYS:
                self.store.push(keys, values)
            elif values.shape[0]:
                self._push_same_keys(worker, h.ref, values)
            if h.flags & protocol.CLOCK:
                self.clocks.tick(worker)
                self._release()
        elif op is Op.FINISH:
            self.clocks.finish(worker)
            self._release()
            if self.clocks.all_finished and self._every and not self._final_taken:
                self._timed(final=True)
                self._final_taken = True
        elif op is Op.STATUS:
            self._send(self._status(), source, protocol.reply_tag(h.ts, self._reply_tags))
        return op

    def _status(self) -> np.ndarray:
        done = self.clocks.done
        slowest = int(np.argmin(done))
        if done[slowest] == FINISHED:
            slowest = -1
        values = {"slowest_clock": -1 if slowest < 0 else int(done[slowest]),
                  "slowest_worker": slowest, "finished": int((done == FINISHED).sum())}
        return np.array([values[f] for f in protocol.STATUS_FIELDS], np.int64)

    def _serve(self, worker, source, ts, keys, insert, held_since, keys_are_a_copy=False):
        slowest = self.clocks.record_read(worker)
        now = time.monotonic()
        held = 0.0 if held_since is None else now - held_since
        self.held_s[worker] += held
        if self.pulls is not None and self.clocks.done[worker] != FINISHED:
            self.pulls.append((worker, self.clocks.done[worker],
                               -1 if slowest == FINISHED else slowest, held, now - self._start))
        out = np.empty((keys.shape[0], self.store.width), np.float32)
        slots = self.store.find(keys, insert, out)
        if insert:
            pulled = self._pulled[worker]
            pulled[ts] = (keys if keys_are_a_copy else keys.copy(), slots,
                          self.store.generation)
            while len(pulled) > 4:   # the client reuses only its last two pulls
                pulled.popitem(last=False)
        self._send(out, source, protocol.reply_tag(ts, self._reply_tags))

    def _push_same_keys(self, worker: int, ref: int, values: np.ndarray) -> None:
        """Apply a push that reuses the keys of pull `ref` (and the rows found for it)."""
        entry = self._pulled[worker].pop(ref, None)
        if entry is None or entry[0].shape[0] != values.shape[0]:
            raise ProtocolError(f"worker {worker} pushed {values.shape[0]} values for the keys "
                                f"of pull #{ref}, which this server does not hold")
        keys, slots, generation = entry
        if generation == self.store.generation:
            self.store.update(slots, values)
        else:   # the table grew since: its rows moved
            self.store.push(keys, values)

    def _held_since(self, worker: int, clock: int) -> float | None:
        """When a pull that cannot be served yet starts waiting for other workers: now, if its
        own worker has completed the clocks before; None while it waits for that worker's own
        push (a pull sent ahead, with NEXT_CLOCK: pipelining, not a consistency wait)."""
        if self.clocks.done[worker] < clock:
            return None
        self.stats.pulls_held += 1
        return time.monotonic()

    def _release(self) -> None:
        """Serve held pulls whose clocks now allow it, oldest first."""
        still = deque()
        for item in self._held:
            clock, worker = item[0], item[1]
            if self.clocks.may_read(worker, clock):
                self._serve(*item[1:], keys_are_a_copy=True)
            else:
                if item[-1] is None:
                    item[-1] = self._held_since(worker, clock)
                still.append(item)
        self._held = still

    def pull_records(self) -> np.ndarray:
        """The recorded pulls (with record_pulls) as a PULL_RECORD array."""
        return np.array(self.pulls or [], PULL_RECORD)

    def _send(self, buf: np.ndarray, dest: int, tag: int) -> None:
        self.stats.bytes_sent += buf.nbytes
        self._replies.append((self.roles.comm.Isend(buf, dest, tag), buf))
        if len(self._replies) > 256:
            self._reap_replies()

    def _reap_replies(self) -> None:
        if self._replies:
            self._replies = [(r, b) for r, b in self._replies if not r.Test()]

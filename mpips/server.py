"""A server's event loop: receive requests, apply pushes, answer pulls when clocks allow.

One thread, one message at a time, in arrival order. MPI keeps the messages
from one worker in order, so a worker always reads its own earlier pushes.

Under BSP the pushes that complete a clock are applied together, in worker
order, once every worker has sent its own: a run is reproducible, and the model
at each clock is a consistent cut, so checkpoints are taken there, before any
read of the next clock is answered. Server 0 writes each checkpoint's manifest
once every server has reported its file. Asked to stop, or when a timed
checkpoint is due, it names the clock for it: two past its slowest worker, which
no server has passed yet.
"""
import json
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
from mpi4py import MPI

from . import protocol
from .admission import admit
from .bounded import Backoff, wait_all
from .clocks import FINISHED, ClockTable
from .errors import CheckpointsFailing, ProtocolError, WaitTimeout
from .placement import Placement
from .progress import Progress
from .protocol import Op
from .store import KVStore

log = logging.getLogger("mpips")


@dataclass
class ServerStats:
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    pulls_held: int = 0       # pulls that had to wait for other workers' clocks
    train_bytes_sent: int = 0   # bytes sent until every worker had finished training
    refound: int = 0          # SAME_KEYS pushes whose rows had moved (the table grew)
    busy_s: float = 0.0       # time spent handling requests (the rest is waiting for them)
    checkpoints: int = 0      # checkpoint files written


# One pull served to a worker still training, recorded with --record-pulls: who read, at which
# clock, how far the slowest worker had got (-1 once all others have finished), how long the
# pull was held for the clocks, and when (seconds since the server started serving).
PULL_RECORD = np.dtype([("worker", "<i4"), ("clock", "<i8"), ("slowest", "<i8"),
                        ("held_s", "<f8"), ("t", "<f8")])


# Checkpoints that fail one after another (a full or read-only disk) stop the job after this
# many: training on without a way back is a risk the user did not choose.
FAILURES_IN_A_ROW = 3


@dataclass
class CheckpointPlan:
    """When and how this server writes checkpoints. The writers report failure, they do not
    raise: a checkpoint that could not be written does not stop training by itself."""
    every: int                                      # clocks between them; 0: not by clocks
    seconds: float                                  # or seconds between them; 0: not by time
    write_shard: Callable[[int], dict]              # clock -> this server's manifest entry,
                                                    # or {"server", "error"}
    write_manifest: Callable[[int, list, dict], str | None]  # server 0: clock, entries,
                                                    # positions -> None, or why it failed
    stop_requested: Callable[[], bool] = lambda: False  # polled by every server


class Server:
    def __init__(self, roles, store: KVStore, clocks: ClockTable, timeout: float,
                 on_error=None, progress: Progress | None = None, record_pulls: bool = False,
                 every: tuple | None = None, checkpoints: CheckpointPlan | None = None,
                 positions: dict | None = None, placement: Placement | None = None):
        """`every` = (seconds, callback): call callback(final=False) at each multiple of
        `seconds` while serving (skipping those missed while busy), and callback(final=True)
        once when every worker has finished training. `positions`: where each worker stood,
        when resuming from a checkpoint."""
        self.roles = roles
        self.store = store
        self.clocks = clocks
        self.timeout = timeout
        self.on_error = on_error
        self.progress = progress
        self.checkpoints = checkpoints
        self.placement = placement or Placement(len(roles.servers))
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
        # BSP: the pushes that complete each clock, by clock then worker, until every worker
        # has completed that clock (a worker may push ahead of the others).
        self._clock_pushes = {}
        self._slowest = clocks.slowest()
        # Where each worker's next minibatch starts, from its latest clock push (checkpoints);
        # under BSP also by the clock it had reached, for checkpoints of earlier clocks.
        self.positions = dict(positions or {})
        self._history = {w: {p["clock"]: p} for w, p in self.positions.items()}
        self._applied = min([p["clock"] for p in self.positions.values()] or [0])  # BSP
        self.stop_at = None       # the clock to checkpoint and stop at, once asked
        self._stop_asked = False  # server 0: a rank was asked to stop; others: told server 0
        self.completed = set()    # server 0: clocks of the checkpoints whose manifest it wrote
        self._failed_in_a_row = 0   # server 0: checkpoints that failed since the last success
        self._planned = set()     # clocks server 0 named for timed checkpoints
        self.stopped = False      # that checkpoint is written: reads are refused
        self._entries = {}        # server 0: clock -> the servers' files of that checkpoint
        self._written = set()     # clocks this server has written a checkpoint at
        self._every = every
        self._final_taken = False
        self._start = time.monotonic()

    @property
    def _lead(self) -> bool:
        return self.roles.index == 0

    def run(self) -> ServerStats:
        """Serve until every worker has said BYE; server 0 also until every other server has
        (after its last SHARD_SAVED), so it knows which checkpoints are complete."""
        comm = self.roles.comm
        status = MPI.Status()
        backoff = Backoff()
        buf = np.empty(1 << 16, np.uint8)
        talking = set(self.roles.workers)
        servers_left = set(self.roles.servers[1:]) if self._lead else set()
        self._start = quiet_since = time.monotonic()
        self._heard[:] = self._start
        next_call = self._start + (self._every[0] if self._every else float("inf"))
        next_check = self._start
        timed = self.checkpoints.seconds if self.checkpoints else 0
        next_timed = self._start + timed if timed else float("inf")
        while talking or servers_left:
            if self._final_taken:
                next_call = float("inf")
            if time.monotonic() >= next_call:
                self._timed(final=False)
                missed = (time.monotonic() - self._start) // self._every[0]
                next_call = self._start + (missed + 1) * self._every[0]
            self._poll_stop()
            if self._lead and time.monotonic() >= next_timed:
                self._schedule_checkpoint()
                next_timed = time.monotonic() + timed
            msg = comm.Improbe(MPI.ANY_SOURCE, protocol.REQUEST_TAG, status)
            if msg is None:
                if time.monotonic() >= next_check:
                    if talking:
                        self._check_silence(talking)
                        quiet_since = time.monotonic()
                    elif time.monotonic() - quiet_since > self.timeout:
                        raise WaitTimeout(f"servers {sorted(servers_left)} did not say they had "
                                          f"finished within --timeout {self.timeout:g} s of the "
                                          f"last worker")
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
                servers_left.discard(source)
            self.stats.busy_s += time.monotonic() - began
        if not self._lead:   # after this server's last SHARD_SAVED, in MPI's order
            self._send(protocol.pack(protocol.Header(Op.BYE)), self.roles.servers[0],
                       protocol.REQUEST_TAG)
        for clock in sorted(self._entries):
            have = {e["server"] for e in self._entries[clock]["shards"]}
            missing = sorted(set(range(len(self.roles.servers))) - have)
            log.warning("checkpoint at clock %d is incomplete (server(s) %s did not write it, "
                        "the job having ended first): it will be passed over", clock, missing)
        wait_all([r for r, _ in self._replies], self.timeout, lambda: "replies to be sent")
        if self.progress:
            self.progress.log(final=True)
        return self.stats

    def _poll_stop(self) -> None:
        """A stop asked of any rank reaches server 0, which names the clock to stop at."""
        if not self._stop_asked and self.checkpoints and self.checkpoints.stop_requested():
            self._stop_asked = True
            if not self._lead:
                self._send(protocol.pack(protocol.Header(Op.STOP)), self.roles.servers[0],
                           protocol.REQUEST_TAG)
        if self._lead and self._stop_asked and self.stop_at is None:
            self._schedule_stop()

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

    def _sender(self, source: int) -> str:
        if source in self.roles.servers:
            return f"server {self.roles.servers.index(source)} (rank {source})"
        return f"worker {self.roles.worker_index(source)} (rank {source})"

    def _handle(self, source: int, buf: np.ndarray) -> Op:
        from_worker = source not in self.roles.servers
        op, h, keys, values = admit(buf, self._sender(source), from_worker, to_lead=self._lead,
                                    from_lead=source == self.roles.servers[0],
                                    width=self.store.width, placement=self.placement,
                                    server=self.roles.index)
        if not from_worker:
            return self._from_server(op, source, h, buf)
        worker = self.roles.worker_index(source)
        self._heard[worker] = time.monotonic()
        if self.progress:
            self.progress.update(worker, h)
        if op is Op.PULL:
            # READ_ONLY only spares storing unknown keys: the clocks apply to every read
            # (a finished worker's reads, such as scoring the test file, never wait).
            insert = not h.flags & protocol.READ_ONLY
            clock = self.clocks.read_clock(worker, bool(h.flags & protocol.NEXT_CLOCK))
            if self.stopped and self.clocks.done[worker] != FINISHED:
                self._refuse(source, h.ts)
            elif self._may_read(worker, clock):
                self._serve(worker, source, h.ts, keys, insert, None)
            else:
                self._held.append([clock, worker, source, h.ts, keys.copy(), insert,
                                   self._held_since(worker, clock)])
        elif op is Op.PUSH:
            if h.flags & protocol.CLOCK and self.clocks.staleness == 0:
                pending = self._clock_pushes.setdefault(int(self.clocks.done[worker]), {})
                pending[worker] = self._pushed(worker, h, keys, values, copy=True)
            else:
                self._apply(*self._pushed(worker, h, keys, values, copy=False))
            if h.flags & protocol.CLOCK:
                self.clocks.tick(worker)
                self._note_position(worker, h)
                self._advance()
        elif op is Op.FINISH:
            self._note_position(worker, h)
            self.clocks.finish(worker)
            self._advance()
            if self.clocks.all_finished:
                self.stats.train_bytes_sent = self.stats.bytes_sent
                if self._every and not self._final_taken:
                    self._timed(final=True)
                    self._final_taken = True
        elif op is Op.STATUS:
            self._send(self._status(), source, protocol.reply_tag(h.ts, self._reply_tags))
        elif op is Op.ERROR:
            self._failed(f"worker {worker}", source, buf)
        elif op is Op.STOP:
            self._stop_asked = True   # only server 0 receives it
            self._poll_stop()
        return op

    def _from_server(self, op: Op, source: int, h, buf: np.ndarray) -> Op:
        if op is Op.ERROR:
            self._failed(f"server {source}", source, buf)
        elif op is Op.STOP_AT:
            self.stop_at = h.clock
            self._advance()
        elif op is Op.CHECKPOINT_AT:
            self._planned.add(h.clock)
            self._advance()
        elif op is Op.BYE:
            pass
        elif op is Op.SHARD_SAVED:
            try:
                entry = json.loads(protocol.error_text(buf))
            except ValueError:
                raise ProtocolError(f"{self._sender(source)} sent a bad request: SHARD_SAVED "
                                    f"whose text is not JSON") from None
            self._shard_saved(h.clock, entry)
        elif op is Op.STOP:
            self._stop_asked = True
            self._poll_stop()
        return op

    def _failed(self, who: str, source: int, buf: np.ndarray) -> None:
        if self.on_error:
            self.on_error(f"{who}: {protocol.error_text(buf)}")
        self._send(np.ones(1, np.int64), source, protocol.ERROR_ACK_TAG)

    def _note_position(self, worker: int, h) -> None:
        position = {"clock": h.clock + (1 if h.op == Op.PUSH else 0), "epoch": h.epoch,
                    "offset": h.offset, "examples": h.examples, "loss": h.loss,
                    "finished": h.op == Op.FINISH}
        self.positions[worker] = position
        if self.clocks.staleness == 0 and not position["finished"]:
            self._history.setdefault(worker, {})[position["clock"]] = position

    def _positions_at(self, clock: int) -> dict:
        """Where each worker stood at `clock`: under BSP the state of a checkpoint is exactly
        that clock's, and a worker may already have pushed beyond it; under SSP and ASP each
        worker's pushes are in the state as they arrive, so its latest position."""
        if self.clocks.staleness != 0:
            return {w: dict(p) for w, p in self.positions.items()}
        at = {}
        for w, latest in self.positions.items():
            seen = self._history.get(w, {})
            at[w] = dict(seen[clock] if clock in seen else latest)
        return at

    def _pushed(self, worker: int, h, keys, values, copy: bool):
        """(keys, rows or None, table generation, values) of a push, ready to apply."""
        if not h.flags & protocol.SAME_KEYS:
            return (keys.copy() if copy else keys), None, -1, (values.copy() if copy else values)
        if not values.shape[0]:
            return keys, None, -1, values
        entry = self._pulled[worker].pop(h.ref, None)
        if entry is None or entry[0].shape[0] != values.shape[0]:
            raise ProtocolError(f"worker {worker} pushed {values.shape[0]} values for the keys "
                                f"of pull #{h.ref}, which this server does not hold")
        return entry[0], entry[1], entry[2], (values.copy() if copy else values)

    def _apply(self, keys, slots, generation, values) -> None:
        if slots is not None and generation == self.store.generation:
            self.store.update(slots, values)
            return
        if slots is not None:   # the table grew since the pull: its rows moved
            self.stats.refound += 1
        self.store.push(keys, values)

    def _advance(self) -> None:
        """After a worker's clock or FINISH: if the slowest worker moved on, apply the clocks'
        pushes (BSP) and write the checkpoints due at each clock on the way, then answer the
        pulls the new clock lets through."""
        slowest = self.clocks.slowest()
        if slowest > self._slowest:
            last = slowest
            if slowest == FINISHED:   # the last clock any worker completed
                last = max([p["clock"] for p in self.positions.values()] + [self._slowest])
            for clock in range(self._slowest + 1, last + 1):
                if self._checkpoint_due(clock):
                    self._apply_until(clock)
                    self._checkpoint(clock)
            self._apply_until(last)
            plan = self.checkpoints
            if slowest == FINISHED and plan and (plan.every or plan.seconds):
                self._checkpoint(last)   # every worker has finished: the final state
            self._slowest = slowest
            for clock in [c for c in self._history_clocks() if c < slowest]:
                for seen in self._history.values():
                    seen.pop(clock, None)
        for clock in sorted(c for c in self._planned if c <= slowest):
            # As for stopping: CHECKPOINT_AT may arrive after this server reached the clock.
            self._planned.discard(clock)
            self._checkpoint(clock)
        if self.stop_at is not None and slowest >= self.stop_at and not self.stopped:
            # Here at the latest: STOP_AT may arrive after this server reached the clock (and
            # no worker reads past it: server 0 refuses). If every worker has finished
            # meanwhile, there is nothing left to stop.
            if slowest != FINISHED:
                self._checkpoint(self.stop_at)
                self.stopped = True
        self._release()

    def _history_clocks(self) -> set:
        return {c for seen in self._history.values() for c in seen}

    def _apply_until(self, clock: int) -> None:
        """BSP: apply, in clock then worker order, the pushes of every clock before `clock`."""
        for c in sorted(c for c in self._clock_pushes if c < clock):
            pending = self._clock_pushes.pop(c)
            for worker in sorted(pending):
                self._apply(*pending[worker])
        self._applied = max(self._applied, clock)

    def _checkpoint_due(self, clock: int) -> bool:
        plan = self.checkpoints
        return plan is not None and ((plan.every and clock % plan.every == 0)
                                     or clock == self.stop_at or clock in self._planned)

    def _checkpoint(self, clock: int) -> None:
        if clock in self._written:
            return
        self._written.add(clock)
        self._planned.discard(clock)
        if self.clocks.staleness == 0 and self._applied > clock:
            # Only if a worker's minibatches missed server 0 for clocks on end, so that
            # server 0 named a clock this server had passed: better no checkpoint than one
            # whose state is not its clock's. Without this server's file it is passed over.
            log.warning("not writing checkpoint clock %d: this server has applied clock %d "
                        "already", clock, self._applied - 1)
            return
        entry = self.checkpoints.write_shard(clock)
        self.stats.checkpoints += "error" not in entry
        if self._lead:
            self._entries.setdefault(clock, {"shards": [], "positions": None})
            self._entries[clock]["positions"] = self._positions_at(clock)
            self._shard_saved(clock, entry)
        else:
            text = np.frombuffer(json.dumps(entry).encode(), np.uint8)
            self._send(protocol.pack(protocol.Header(Op.SHARD_SAVED, clock=clock), text),
                       self.roles.servers[0], protocol.REQUEST_TAG)

    def _shard_saved(self, clock: int, entry: dict) -> None:
        """Server 0: note a server's file of checkpoint `clock`; once all are in and its own
        positions are known, write the manifest (the checkpoint now exists)."""
        state = self._entries.setdefault(clock, {"shards": [], "positions": None})
        state["shards"].append(entry)
        if len(state["shards"]) == len(self.roles.servers) and state["positions"] is not None:
            del self._entries[clock]
            failed = [f"server {e['server']}: {e['error']}" for e in state["shards"]
                      if "error" in e]
            if not failed:
                problem = self.checkpoints.write_manifest(clock, state["shards"],
                                                          state["positions"])
                failed = [problem] if problem else []
            if not failed:
                self._failed_in_a_row = 0
                self.completed.add(clock)
                return
            self._failed_in_a_row += 1
            why = "; ".join(failed)
            if self._failed_in_a_row >= FAILURES_IN_A_ROW:
                raise CheckpointsFailing(
                    f"{self._failed_in_a_row} checkpoints in a row could not be written (the "
                    f"last, at clock {clock}: {why}); stopping rather than training on without "
                    f"a checkpoint to come back to")
            log.error("checkpoint at clock %d was not written (%s); training goes on, and "
                      "stops if %d in a row fail", clock, why, FAILURES_IN_A_ROW)

    def _schedule_stop(self) -> None:
        """Server 0, asked to stop: checkpoint at two clocks past the slowest worker (no server
        can be further than one clock ahead of this one), then refuse further reads."""
        slowest = self.clocks.slowest()
        if slowest == FINISHED:
            return   # training is over: nothing to stop
        self.stop_at = slowest + 2
        self._tell_servers(Op.STOP_AT, self.stop_at)

    def _schedule_checkpoint(self) -> None:
        """Server 0, a timed checkpoint being due: as for stopping, two clocks past the slowest
        worker, without stopping."""
        slowest = self.clocks.slowest()
        if slowest == FINISHED or self.stop_at is not None:
            return   # the final or the stopping checkpoint comes anyway
        self._planned.add(slowest + 2)
        self._tell_servers(Op.CHECKPOINT_AT, slowest + 2)

    def _tell_servers(self, op: Op, clock: int) -> None:
        for server in self.roles.servers[1:]:
            self._send(protocol.pack(protocol.Header(op, clock=clock)), server,
                       protocol.REQUEST_TAG)

    def _status(self) -> np.ndarray:
        done = self.clocks.done
        slowest = int(np.argmin(done))
        if done[slowest] == FINISHED:
            slowest = -1
        silent = 0 if slowest < 0 else time.monotonic() - self._heard[slowest]
        values = {"slowest_clock": -1 if slowest < 0 else int(done[slowest]),
                  "slowest_worker": slowest, "finished": int((done == FINISHED).sum()),
                  "slowest_silent_ms": int(silent * 1000)}
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

    def _refuse(self, dest: int, ts: int) -> None:
        """An empty reply: the job has stopped (a checkpoint holds the model)."""
        self._send(np.empty(0, np.float32), dest, protocol.reply_tag(ts, self._reply_tags))

    def _may_read(self, worker: int, clock: int) -> bool:
        """The clocks' rule; once the job has stopped, a finished worker (scoring) reads the
        model as it stands, as the clocks will not move again."""
        return self.clocks.may_read(worker, clock) or (
            self.stopped and self.clocks.done[worker] == FINISHED)

    def _held_since(self, worker: int, clock: int) -> float | None:
        """When a pull that cannot be served yet starts waiting for other workers: now, if its
        own worker has completed the clocks before; None while it waits for that worker's own
        push (a pull sent ahead, with NEXT_CLOCK: pipelining, not a consistency wait)."""
        if self.clocks.done[worker] < clock:
            return None
        self.stats.pulls_held += 1
        return time.monotonic()

    def _release(self) -> None:
        """Serve held pulls whose clocks now allow it, oldest first; refuse them all once the
        job has stopped."""
        still = deque()
        for item in self._held:
            clock, worker = item[0], item[1]
            if self.stopped and self.clocks.done[worker] != FINISHED:
                self._refuse(item[2], item[3])
            elif self._may_read(worker, clock):
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


def serve(roles, optimizer, width: int = 1, staleness: int | None = 0,
          timeout: float = 600.0) -> Server:
    """Serve as this rank's part of the parameter server until every worker has closed, with
    this optimizer and consistency (staleness 0: BSP, s: SSP, None: ASP); returns the server,
    for its store. For scripts that use KVWorker directly; training jobs build their own."""
    server = Server(roles, KVStore(width=width, optimizer=optimizer),
                    ClockTable(len(roles.workers), staleness), timeout=timeout)
    server.run()
    return server


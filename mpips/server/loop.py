"""A server's event loop: receive a request, check it, hand it to the handler of its
operation. One thread, one message at a time, in arrival order: MPI keeps the messages from
one worker in order, so a worker always reads its own earlier pushes.

The concerns the handlers use are modules of their own, each without MPI: `admission`
(what is accepted), `readgate` (when a read is answered), `rowcache` (the rows of recent
pulls, for pushes of the same keys), `clockpushes` (BSP's ordered application of a clock's
pushes) and `checkpointing` (where and when checkpoints are taken). What a server asks of
the job around it (write a shard or a manifest, a snapshot, keep what it holds when another
rank fails, whether a stop was asked) comes in one `Hooks` object.

Server 0 also leads (after its death, the first living server): it writes each checkpoint's
manifest once every server has reported its file, and, asked to stop or when a timed
checkpoint is due, names the clock for it: two past its slowest worker, which no server
has passed yet. Under ULFM, another rank's death goes to `takeover`: a dead server's keys'
living copies answer for it, and lost copies are rebuilt by `rangecopies`, which also
carries the copies of ranges moving to new holders (`rangemoves`, `mpips ctl`).
"""
import json
import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from mpi4py import MPI

from ..wire import protocol

from ..wire import tags
from .admission import admit
from ..ranks.bounded import Backoff, wait_all
from .checkpoint_rounds import Checkpoints
from .clockpushes import ClockPushes
from ..wire.clocks import FINISHED, ClockTable
from .dense_tables import DenseTables
from ..base.errors import ProtocolError, WaitTimeout
from ..ranks.ulfm import CannotFailOver, dead_ranks, is_failure
from ..membership.requests import Membership
from ..models.optimizer import Optimizer
from ..wire.placement import Placement, describe_ranges
from .progress import Progress
from ..wire.protocol import Op, Report
from .readgate import HOLD, SERVE, Pull, ReadGate
from .rowcache import RowCache
from .store import KVStore
from ..recovery.rangecopies import RangeCopies
from ..recovery.takeover import Takeover
from ..base.timeline import Timeline
from ..recovery.workerloss import WorkerLosses

log = logging.getLogger("mpips")


@dataclass
class ServerStats:
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    pulls_held: int = 0       # pulls that had to wait for other workers' clocks
    train_bytes_sent: int = 0   # bytes sent until every worker had finished training
    push_bytes: int = 0       # bytes of the workers' pushes received
    refound: int = 0          # SAME_KEYS pushes whose rows had moved (the table grew)
    busy_s: float = 0.0       # time spent handling requests (the rest is waiting for them)
    checkpoints: int = 0      # checkpoint files written
    pushes_applied: int = 0   # workers' pushes in this server's store (this launch)
    keys_served: int = 0      # keys of the reads answered (the load the placement gave it)
    test_keys: int = 0        # keys of the test rows read (each batch's distinct keys)
    test_keys_known: int = 0  # of them, the keys the model holds


@dataclass
class Hooks:
    """What a server asks of the job around it. Writers report a failure in what they return
    (a checkpoint that could not be written does not stop training by itself)."""
    write_shard: Callable[[int], dict] | None = None   # clock -> this server's manifest entry,
                                                       # or {"server", "error"}
    write_manifest: Callable[[int, list, dict], str | None] | None = None
    # server 0: clock, entries, positions -> None, or why it failed
    snapshot: Callable[[bool], None] | None = None     # final -> None, every snapshot_every s
    snapshot_every: float = 0.0
    failed: Callable[[str], None] = lambda reason: None   # another rank failed: keep the model
    stop_requested: Callable[[], bool] = lambda: False    # polled by every server
    placement_changed: Callable[[Placement], None] = lambda placement: None   # a server died
    now_leads: Callable[[], None] = lambda: None   # this server leads after the lead died
    # The job reached a point here (testevents): point, value, whether this server leads ->
    # whether a ctl request was made meanwhile.
    reached: Callable[[str, int, bool], bool] = lambda point, value, lead: False


_NO_REPORT = Report()


class Server:
    def __init__(self, roles, store: KVStore, clocks: ClockTable, timeout: float,
                 hooks: Hooks | None = None, progress: Progress | None = None,
                 record_pulls: bool = False, checkpoints: Checkpoints | None = None,
                 placement: Placement | None = None, failover: bool = False,
                 workers_fail_over: bool = False, epochs: int = 1, parts: list = (),
                 deaths: tuple = (), dense: DenseTables | None = None,
                 run_dir: str | None = None, run_id: str | None = None, scoring=None):
        """`checkpoints`: when to write them, and where each worker stood (when resuming);
        by default none but those a stop asks for. `failover` (under ULFM): when another
        server dies, go on with the living copies of its keys. With `parts` (each worker's own
        part of the data), a worker's rows left (of `epochs`) go to the others when it leaves,
        and with `workers_fail_over` (under ULFM) when it dies; `deaths`: those before a
        resume. `dense`: the
        server's dense tables (by default, none yet: workers create them). `run_dir`: where
        `mpips ctl` leaves requests for the lead (see membership). `scoring`: makes, for
        this server, its share of the test rows to score (a testscoring.Scoring)."""
        self.roles = roles
        self.store = store
        self.clocks = clocks
        self.timeout = timeout
        self.hooks = hooks or Hooks()
        self.progress = progress
        self.placement = placement or Placement(len(roles.servers))
        self._lead_of = (-1, 0)   # (placement version, the lead server then)
        self.stats = ServerStats()
        self.timeline = Timeline()
        self.copies = RangeCopies(self)   # ranges copied to new holders (failover, moves)
        self.takeover = Takeover(self) if failover else None
        self.losses = (WorkerLosses(self, epochs, list(parts), deaths, hot=workers_fail_over)
                       if parts else None)
        self.ckpt = checkpoints or Checkpoints(0, 0.0, roles.index == 0, len(roles.servers),
                                               clocks.staleness == 0)
        self.gate = ReadGate(clocks, record_pulls)
        self.rows = RowCache(len(roles.workers))
        self.clock_pushes = ClockPushes(self.ckpt.first_clock())
        self._backups_due = []    # pushes to backed-up ranges of clocks complete (see advance)
        self._reply_tags = protocol.reply_tags(roles.comm.Get_attr(MPI.TAG_UB))
        self._replies = []        # (request, buffer, destination) of replies still being sent
        self._heard = np.zeros(len(roles.workers))   # when each worker last sent something
        self._last_applied = np.full(len(roles.workers), -1, np.int64)   # ts of its last push
        # Resuming, a worker that had left stands before the checkpoint's clock until it says
        # FINISH again: the checkpoints before that clock are not written again.
        self._slowest = max(clocks.slowest(), self.ckpt.first_clock())
        self._stop_asked = False  # server 0: a rank was asked to stop; others: told server 0
        self._final_taken = False
        self._talking = set(roles.workers)
        self._servers_left = set(roles.servers[1:]) if self.lead else set()
        self._handlers = {
            Op.PULL: self._on_pull, Op.PUSH: self._on_push, Op.FINISH: self._on_finish,
            Op.BYE: self._on_bye, Op.STATUS: self._on_status, Op.ERROR: self._on_error,
            Op.STOP: self._on_stop, Op.STOP_AT: self._on_stop_at,
            Op.CHECKPOINT_AT: self._on_checkpoint_at, Op.SHARD_SAVED: self._on_shard_saved}
        self.members = Membership(self, run_dir, run_id)
        self.scoring = scoring(self) if scoring else None
        for capability in (self.copies, self.losses, self.members, self.scoring):
            if capability:
                self._handlers.update(capability.handlers())
        self.dense = dense or DenseTables(roles.index, self.placement, len(roles.workers))
        self._handlers.update(self.dense.handlers(self))

    @property
    def _lead_index(self) -> int:
        """The server that leads: server 0, or after it died the first living one (found
        once per placement: every request asks)."""
        version, lead = self._lead_of
        if version != self.placement.version:
            lead = next(s for s in range(self.placement.n_servers)
                        if s not in self.placement.dead)
            self._lead_of = (self.placement.version, lead)
        return lead

    @property
    def lead(self) -> bool:
        return self.roles.index == self._lead_index

    @property
    def lead_rank(self) -> int:
        return self.roles.servers[self._lead_index]

    # What the job reads back once serving is over.
    @property
    def positions(self) -> dict:
        return self.ckpt.positions

    @property
    def stop_at(self):
        return self.ckpt.stop_at

    @property
    def stopped(self) -> bool:
        return self.gate.stopped

    @property
    def completed(self) -> set:
        return self.ckpt.completed

    @property
    def held_s(self) -> np.ndarray:
        return self.gate.held_s

    def pull_records(self) -> np.ndarray:
        """The recorded pulls (with record_pulls) as a readgate.PULL_RECORD array."""
        return self.gate.pull_records()

    # The loop: receive and dispatch, and the timers between messages.
    def run(self) -> ServerStats:
        """Serve until every worker has said BYE; server 0 also until every other server has
        (after its last SHARD_SAVED), so it knows which checkpoints are complete."""
        self._buf = np.empty(1 << 16, np.uint8)
        self._probed = MPI.Status()
        self._backoff = Backoff()
        start = self._quiet_since = self.gate.start = time.monotonic()
        self._heard[:] = start
        self._next_check = start
        self._next_snapshot = (start + self.hooks.snapshot_every
                               if self.hooks.snapshot and self.hooks.snapshot_every
                               else float("inf"))
        self._next_timed = start + self.ckpt.seconds if self.ckpt.seconds else float("inf")
        while (self._talking or self._servers_left or self._copies_awaited
               or (self.scoring and self.scoring.busy)):
            try:
                self._step(start)
            except MPI.Exception as e:
                if not self._went_on(e):
                    raise
        if not self.lead:   # after this server's last SHARD_SAVED, in MPI's order
            self.send(protocol.pack(protocol.Header(Op.BYE)), self.lead_rank)
        for clock, missing in self.ckpt.incomplete():
            log.warning("checkpoint at clock %d is incomplete (server(s) %s did not write it, "
                        "the job having ended first): it will be passed over", clock, missing)
        while True:
            try:
                wait_all([r for r, _, _ in self._replies], self.timeout,
                         lambda: "replies to be sent")
                break
            except MPI.Exception as e:   # under ULFM: replies to a rank that died since
                if not self._went_on(e):
                    raise
        self.stats.pulls_held = self.gate.pulls_held
        self._sample(time.monotonic() - start, force=True)
        if self.progress and self.lead:
            self.progress.log(final=True)
        return self.stats

    def _step(self, start: float) -> None:
        """One turn of the loop: the timers, then one message received and dispatched (or a
        short idle wait)."""
        now = time.monotonic()
        if now >= self._next_snapshot and not self._final_taken:
            every = self.hooks.snapshot_every
            self._snapshot(final=False)
            missed = (time.monotonic() - start) // every
            self._next_snapshot = start + (missed + 1) * every
        if self.timeline.due(now - start):
            self._sample(now - start)
        self._poll_stop()
        if self.lead:
            self.members.poll(now)
        if self.lead and now >= self._next_timed:
            self._name_timed_checkpoint()
            self._next_timed = time.monotonic() + self.ckpt.seconds
        if self.copies.sending:   # a few ranges a turn
            self.copies.send_copies()
        msg = self.roles.comm.Improbe(MPI.ANY_SOURCE, tags.REQUEST_TAG, self._probed)
        if msg is None and self.scoring and self.scoring.poll():   # test rows when idle
            self._backoff.reset()
            self._quiet_since = now
            return
        if msg is None:
            if now >= self._next_check:
                if self._talking or (self.scoring and self.scoring.scoring_here):
                    if self._talking:
                        self._check_silence()
                    self._quiet_since = now
                elif now - self._quiet_since > self.timeout:
                    if self.scoring and self.scoring.busy:
                        raise WaitTimeout(f"server rank(s) {self.scoring.waiting_for} did not "
                                          f"say they had scored their test rows within "
                                          f"--timeout {self.timeout:g} s of the last worker")
                    if self._servers_left:
                        raise WaitTimeout(f"servers {sorted(self._servers_left)} did not say "
                                          f"they had finished within --timeout "
                                          f"{self.timeout:g} s of the last worker")
                    raise WaitTimeout(f"the copies of key range(s) "
                                      f"{describe_ranges(self._copies_awaited)} "
                                      f"did not arrive within --timeout {self.timeout:g} s "
                                      f"of the last worker")
                self._reap_replies()
                self._next_check = now + 0.5
            self._backoff.idle()
            return
        self._backoff.reset()
        nbytes = self._probed.Get_count(MPI.BYTE)
        if self._buf.shape[0] < nbytes:
            self._buf = np.empty(max(nbytes, 2 * self._buf.shape[0]), np.uint8)
        msg.Recv([self._buf, nbytes, MPI.BYTE])
        self._quiet_since = now   # (a server still scoring reads from the others)
        self.stats.requests += 1
        self.stats.bytes_received += nbytes
        self._dispatch(self._probed.Get_source(), self._buf[:nbytes])
        self.stats.busy_s += time.monotonic() - now

    def _went_on(self, e: MPI.Exception) -> bool:
        """Under ULFM another rank died: whether this server goes on without it (a server's
        keys have living copies, a worker's rows go to the others)."""
        if not is_failure(e):
            return False
        dead = dead_ranks(self.roles.comm)
        servers = {self.roles.servers.index(r) for r in dead if r in self.roles.servers}
        workers = {self.roles.worker_index(r) for r in dead if r not in self.roles.servers}
        if servers and not self.takeover:
            return False
        if workers and not (self.losses and self.losses.hot):
            raise CannotFailOver(f"worker(s) {sorted(workers)} died: without ULFM's failover "
                                 f"a dead worker's rows are not handed on")
        # Deaths known already (another server said, or MPI tells again of a request to a
        # dead rank) need nothing more.
        if servers - self.placement.dead:
            self.takeover.learn()
        if workers:
            self.losses.learn(workers)   # those it knows of already are passed over
        return True

    def _dispatch(self, source: int, buf: np.ndarray) -> None:
        from_worker = source not in self.roles.servers
        if from_worker and self.roles.worker_index(source) in self.clocks.gone:
            return   # a dead worker's message still on its way: its clocks are settled
        h = protocol.header(buf) if buf.shape[0] >= protocol.HEADER_BYTES else None
        if from_worker and h and self.members.refused_stale(h, source):
            return
        if self.takeover and h and h.placement > self.placement.version:
            self.takeover.catch_up(h.placement, self.sender(source))
        request = admit(buf, self.sender(source), from_worker, to_lead=self.lead,
                        from_lead=source == self.lead_rank, width=self.store.width,
                        placement=self.placement, server=self.roles.index,
                        columns=self.store.columns, n_workers=len(self.roles.workers),
                        load=self.members.load)
        if from_worker:
            worker = self.roles.worker_index(source)
            self._heard[worker] = time.monotonic()
            if self.progress and request.report is not None:
                self.progress.update(worker, request.report, say=self.lead)
        handler = self._handlers.get(request.op)
        if handler is None:
            raise ProtocolError(f"{self.sender(source)} sent a bad request: {request.op.name}, "
                                f"which a server without failover does not take; it was not "
                                f"applied, and the job stops")
        handler(source, request, buf)

    def sender(self, source: int) -> str:
        if source in self.roles.servers:
            return f"server {self.roles.servers.index(source)} (rank {source})"
        return f"worker {self.roles.worker_index(source)} (rank {source})"

    # Handlers, by operation; admission has checked who may send what.
    def _on_pull(self, source: int, r, buf) -> None:
        # READ_ONLY only spares storing unknown keys: the clocks apply to every read.
        pull = Pull(self.roles.worker_index(source), source, r.header.ts, r.keys,
                    insert=not r.header.flags & protocol.READ_ONLY, version=r.header.placement)
        verdict = self.gate.arrive(pull, next_clock=bool(r.header.flags & protocol.NEXT_CLOCK))
        if verdict == SERVE:
            self._serve(pull)
        elif verdict != HOLD:
            self._refuse(pull)

    def _on_push(self, source: int, r, buf) -> None:
        worker = self.roles.worker_index(source)
        self.stats.push_bytes += buf.shape[0]
        if r.backup_keys.shape[0]:   # first the part for ranges this server backs up
            h = r.header._replace(flags=0, nkeys=r.backup_keys.shape[0], ref=0)
            self._take_push(worker, r._replace(header=h, keys=r.backup_keys,
                                               values=r.backup_values, report=None,
                                               rows_sent=None),
                            backup=True)
        self._take_push(worker, r)
        self._copies_due()

    def _take_push(self, worker: int, r, backup: bool = False) -> None:
        """`backup`: the part for ranges this server backs up (no read needs it at once)."""
        completes = bool(r.header.flags & protocol.CLOCK)
        clock = int(self.clocks.done[worker])
        push = self._push_of(worker, r, copy=self.clocks.staleness == 0)
        push = self.copies.route(worker, clock, r.header.ts, r.header.placement, push)
        if self.clocks.staleness == 0:
            # Deferred (see _apply_until) only while the ranges stay backed up here: split by
            # a placement with this one's primaries, and still when the clock completes.
            since = self.placement.backups_since
            deferrable = since if backup and r.header.placement >= since else -1
            self.clock_pushes.add(clock, worker,
                                  (*push, clock, worker, r.header.ts, deferrable))
        else:
            self._apply(*push, clock)
            self._applied(worker, r.header.ts)
        if completes:
            self.clocks.tick(worker)
            self.ckpt.note(worker, int(self.clocks.done[worker]), r.report or _NO_REPORT, False)
            self.advance()

    def _on_finish(self, source: int, r, buf) -> None:
        worker = self.roles.worker_index(source)
        self.ckpt.note(worker, r.header.clock, r.report or _NO_REPORT, True)
        handed = (self.losses.finished(worker, r.header.clock, self.ckpt.positions[worker])
                  if self.losses else None)
        self.members.worker_finished(worker, r.header.clock, handed)
        self.clocks.finish(worker)
        self.advance()
        self._copies_due()
        if self.clocks.all_finished:
            self.hooks.reached("scoring", 0, self.lead)
            self.stats.train_bytes_sent = self.stats.bytes_sent
            if self.hooks.snapshot and not self._final_taken:
                self._snapshot(final=True)
                self._final_taken = True

    def _on_bye(self, source: int, r, buf) -> None:
        self._talking.discard(source)
        self._servers_left.discard(source)

    def _on_status(self, source: int, r, buf) -> None:
        self.reply(self._status(), source, r.header.ts)

    def _on_error(self, source: int, r, buf) -> None:
        self.hooks.failed(f"{self.sender(source).split(' (')[0]}: {protocol.error_text(buf)}")
        self.send(np.ones(1, np.int64), source, tags.ERROR_ACK_TAG)

    def _on_stop(self, source: int, r, buf) -> None:
        self._stop_asked = True   # only the lead receives it
        self._poll_stop()

    def _on_stop_at(self, source: int, r, buf) -> None:
        self.ckpt.stop_at = r.header.clock
        self.advance()

    def _on_checkpoint_at(self, source: int, r, buf) -> None:
        self.ckpt.planned.add(r.header.clock)
        self.advance()

    def forget_ranks(self, ranks: set) -> None:
        """Dead ranks: replies to them are not waited for, nor their BYE."""
        self._replies = [(r, b, dest) for r, b, dest in self._replies if dest not in ranks]
        self._talking -= ranks

    def _copies_due(self) -> None:
        self.copies.send_copies()

    @property
    def _copies_awaited(self) -> list:
        return self.copies.awaited()

    @property
    def failures(self) -> list:
        """What this server saw of other ranks' deaths (under ULFM)."""
        return ((self.takeover.failures if self.takeover else [])
                + (self.losses.failures if self.losses else []))

    def servers_died(self, gone: set, was_lead: bool) -> None:
        """Servers `gone` died (the placement already without them): nobody waits for them;
        this server leads if the lead died and it is the first living one."""
        self.members.servers_died()
        self.apply_backups()   # (if a failure cut an advance short) its ranges may be primary
        self.dense.placement_changed(self.placement)
        self.hooks.placement_changed(self.placement)
        ranks = {self.roles.servers[g] for g in gone}
        self._servers_left -= ranks
        if self.scoring:
            self.scoring.servers_gone(set(gone), was_lead)
        if self.lead and not was_lead:
            # It does not wait for the others' BYE at the end: some may have said it to the
            # dead lead. Files of checkpoints they report after it has ended are passed over.
            self._servers_left = set()
            log.warning("server %d leads from now on (checkpoints, progress, stopping, "
                        "mpips ctl)", self.roles.index)
            self.hooks.now_leads()
        self.forget_ranks(ranks)
        for server in gone:
            self.clocks.server_gone(server)
        if self.losses:
            self.losses.servers_died()
        for clock, shards, positions in self.ckpt.servers_lost(gone):
            self._checkpoint_complete(clock, shards, positions)
        self.advance()

    def _on_shard_saved(self, source: int, r, buf) -> None:
        try:
            entry = json.loads(protocol.error_text(buf))
        except ValueError:
            raise ProtocolError(f"{self.sender(source)} sent a bad request: SHARD_SAVED "
                                f"whose text is not JSON") from None
        self._shard_in(r.header.clock, entry)

    # Pushes and the clocks.
    def _push_of(self, worker: int, r, copy: bool):
        """(keys, rows or None, table generation, values) of a push, ready to apply."""
        values = r.values.copy() if copy else r.values
        if not r.header.flags & protocol.SAME_KEYS:
            return (r.keys.copy() if copy else r.keys), None, -1, values
        if not r.header.nkeys:
            return r.keys, None, -1, values
        keys, rows, generation = self.rows.take(worker, r.header.ref, r.header.nkeys)
        if r.rows_sent is not None:   # a filtered push: values for these of the pull's keys
            keys, rows = keys[r.rows_sent], rows[r.rows_sent]
        return keys, rows, generation, values

    def _apply(self, keys, rows, generation, values, clock: int) -> None:
        if rows is not None and generation == self.store.generation:
            self.store.update(rows, values, clock)
            return
        if rows is not None:   # the table grew since the pull: its rows moved
            self.stats.refound += 1
        self.store.push(keys, values, clock)

    def _apply_until(self, clock: int) -> None:
        """Apply the pushes of the clocks before `clock`; those for ranges backed up here are
        kept for `apply_backups`, once the reads they let through are answered (reads go to
        primaries: no read needs the backed-up ranges). Not if a server died since the push
        arrived: its ranges may be this server's to answer now."""
        for push in self.clock_pushes.until(clock):
            if push[7] == self.placement.backups_since:
                self._backups_due.append(push[:5])
            else:
                self._apply(*push[:5])
            self._applied(*push[5:7])

    def apply_backups(self) -> None:
        for push in self._backups_due:
            self._apply(*push)
        self._backups_due.clear()

    def _applied(self, worker: int, ts: int) -> None:
        if ts != self._last_applied[worker]:   # a push's parts (a backup's, a primary's)
            self._last_applied[worker] = ts
            self.stats.pushes_applied += 1
        self.copies.applied(worker, ts)

    def advance(self) -> None:
        """After a worker's clock or FINISH: if the slowest worker moved on, apply the clocks'
        pushes (BSP) and write the checkpoints due at each clock on the way, then answer the
        pulls the new clock lets through."""
        slowest = self.clocks.slowest()
        if slowest > self._slowest:
            last = self.ckpt.last_clock(self._slowest) if slowest == FINISHED else slowest
            for clock in range(self._slowest + 1, last + 1):
                if self.ckpt.due(clock):
                    self._apply_until(clock)
                    self._checkpoint(clock)
            self._apply_until(last)
            if slowest == FINISHED and self.ckpt.periodic:
                self._checkpoint(last)   # every worker has finished: the final state
            self._slowest = slowest
            self.ckpt.forget_before(slowest)
            if slowest != FINISHED and self.hooks.reached("clock", slowest, self.lead):
                self.members.poll_soon()
        if self.losses:
            self.losses.tell_what_is_here()
        for clock in self.ckpt.reached(slowest):
            self._checkpoint(clock)
        stop_at = self.ckpt.stop_at
        if stop_at is not None and slowest >= stop_at and not self.gate.stopped:
            # Here at the latest: STOP_AT may arrive after this server reached the clock (and
            # no worker reads past it: server 0 refuses). If every worker has finished
            # meanwhile, there is nothing left to stop.
            if slowest != FINISHED:
                self._checkpoint(stop_at)
                self.gate.stopped = True
        self.members.reached()
        self.release()
        self.apply_backups()   # replication overlaps the workers' next minibatch

    def release(self) -> None:
        serve, refuse = self.gate.release()
        for pull in refuse:
            self._refuse(pull)
        for pull in serve:
            self._serve(pull)

    # Checkpoints.
    def _checkpoint(self, clock: int) -> None:
        self.apply_backups()   # a checkpoint is of the whole store at its clock
        if self.hooks.write_shard is None or not self.ckpt.begin(clock):
            return
        if self.clocks.staleness == 0 and self.clock_pushes.applied > clock:
            # Only if a worker's minibatches missed server 0 for clocks on end, so that
            # server 0 named a clock this server had passed: better no checkpoint than one
            # whose state is not its clock's. Without this server's file it is passed over.
            log.warning("not writing checkpoint clock %d: this server has applied clock %d "
                        "already", clock, self.clock_pushes.applied - 1)
            return
        entry = self.hooks.write_shard(clock)
        self.stats.checkpoints += "error" not in entry
        if self.lead:
            self._shard_in(clock, entry, self.ckpt.positions_at(clock))
        else:
            text = np.frombuffer(json.dumps(entry).encode(), np.uint8)
            self.send(protocol.pack(protocol.Header(Op.SHARD_SAVED, clock=clock), text),
                       self.lead_rank)

    def _shard_in(self, clock: int, entry: dict, positions: dict | None = None) -> None:
        """Server 0: a server's file of checkpoint `clock`; once all are in (and its own
        positions), the manifest: the checkpoint now exists."""
        ready = self.ckpt.shard_in(clock, entry, positions)
        if ready is not None:
            self._checkpoint_complete(clock, *ready)

    def _checkpoint_complete(self, clock: int, shards: list, positions: dict) -> None:
        """Server 0, every living server's file of checkpoint `clock` in: its manifest, if
        they hold every key range (a server that died may have taken some with it)."""
        failed = [f"server {e['server']}: {e['error']}" for e in shards if "error" in e]
        covered = {r for e in shards for r in e.get("ranges", [e["server"]])}
        missing = sorted(set(range(self.placement.n_ranges)) - covered)
        if missing and not failed:   # a death, not a failing disk: not one of those counted
            log.warning("checkpoint at clock %d is passed over: key range(s) %s are in no "
                        "file (their server died before writing it)", clock,
                        describe_ranges(missing))
            return
        if not failed:
            deaths = self.losses.deaths_before(clock) if self.losses else []
            problem = self.hooks.write_manifest(clock, shards, positions, deaths)
            failed = [problem] if problem else []
        self.ckpt.outcome(clock, failed)

    def _poll_stop(self) -> None:
        """A stop asked of any rank reaches server 0, which names the clock to stop at."""
        if not self._stop_asked and self.hooks.stop_requested():
            self._stop_asked = True
            log.info("asked to stop (a signal): the job checkpoints and stops")
            if not self.lead:
                self.send(protocol.pack(protocol.Header(Op.STOP)), self.lead_rank)
        if (self.lead and self._stop_asked and self.ckpt.stop_at is None
                and not self.members.busy):   # a stop waits for a move to end
            slowest = self.clocks.slowest()
            if slowest != FINISHED:   # else training is over: nothing to stop
                # Two clocks past the slowest worker: no server can be further than one
                # clock ahead of this one. Reads past it are refused.
                self.ckpt.stop_at = slowest + 2
                self._tell_servers(Op.STOP_AT, slowest + 2)
                log.info("stopping at clock %d, two past the slowest worker, after a "
                         "checkpoint there", slowest + 2)

    def _name_timed_checkpoint(self) -> None:
        """Server 0, a timed checkpoint being due: as for stopping, two clocks past the slowest
        worker, without stopping."""
        slowest = self.clocks.slowest()
        if slowest == FINISHED or self.ckpt.stop_at is not None:
            return   # the final or the stopping checkpoint comes anyway
        self.ckpt.planned.add(slowest + 2)
        self._tell_servers(Op.CHECKPOINT_AT, slowest + 2)

    def _tell_servers(self, op: Op, clock: int) -> None:
        for i, server in enumerate(self.roles.servers):
            if i != self.roles.index and i not in self.placement.dead:
                self.send(protocol.pack(protocol.Header(op, clock=clock)), server)

    def _sample(self, t: float, force: bool = False) -> None:
        slowest = self.clocks.slowest()
        self.timeline.add(t, force, busy_s=self.stats.busy_s, bytes_sent=self.stats.bytes_sent,
                          held_s=float(self.gate.held_s.sum()), pulls_held=self.gate.pulls_held,
                          pushes=self.stats.pushes_applied, gap=self.clocks.gap(),
                          clock=-1 if slowest == FINISHED else slowest)

    def _snapshot(self, final: bool) -> None:
        began = time.monotonic()
        self.hooks.snapshot(final)
        self.stats.busy_s += time.monotonic() - began

    # Replies.
    def _serve(self, pull: Pull) -> None:
        self.gate.served(pull)
        if self.clocks.done[pull.worker] == FINISHED and not pull.insert:   # scoring
            self.reply(self.final_weights(pull.keys), pull.source, pull.ts)
            return
        self.stats.keys_served += pull.keys.shape[0]
        out = np.empty((pull.keys.shape[0], self.store.width), np.float32)
        rows = self.store.find(pull.keys, pull.insert, out)
        if pull.insert:
            keys = pull.keys if pull.owned else pull.keys.copy()
            self.rows.remember(pull.worker, pull.ts, keys, rows, self.store.generation)
        self.reply(out, pull.source, pull.ts)

    def final_weights(self, keys: np.ndarray) -> np.ndarray:
        """The trained model's weights of `keys` (zeros for keys never trained), once every
        worker has finished: nothing is stored."""
        self.stats.keys_served += keys.shape[0]
        out = np.empty((keys.shape[0], self.store.width), np.float32)
        rows = self.store.find(keys, False, out)
        self.stats.test_keys += keys.shape[0]
        self.stats.test_keys_known += int((rows >= 0).sum())
        if self.store.optimizer.averages:
            out = self.store.model_weights(rows, self.clocks.longest)
        return out

    def _refuse(self, pull: Pull) -> None:
        """An empty reply: the job has stopped (a checkpoint holds the model)."""
        self.reply(np.empty(0, np.float32), pull.source, pull.ts)

    def _status(self) -> np.ndarray:
        done = self.clocks.done
        slowest = int(np.argmin(done))
        if done[slowest] == FINISHED:
            slowest = -1
        silent = 0 if slowest < 0 else time.monotonic() - self._heard[slowest]
        values = {"slowest_clock": -1 if slowest < 0 else int(done[slowest]),
                  "slowest_worker": slowest,
                  # A worker joining counts as training before it does.
                  "finished": int((done == FINISHED).sum()) - self.members.idle_joining(),
                  "slowest_silent_ms": int(silent * 1000),
                  "deaths": len(self.losses.deaths) if self.losses else 0,
                  "stopping": int(self.gate.stopped)}
        return np.array([values[f] for f in protocol.STATUS_FIELDS], np.int64)

    def _check_silence(self) -> None:
        """Fail if no worker that is still talking has sent anything for `timeout` seconds."""
        now = time.monotonic()
        ranks = sorted(self._talking)
        heard = [self._heard[self.roles.worker_index(r)] for r in ranks]
        if now - max(heard) <= self.timeout:
            return
        held = self.gate.held_ranks()
        lines = []
        for rank, last in zip(ranks, heard):
            w = self.roles.worker_index(rank)
            clock = self.clocks.done[w]
            state = ("finished training" if clock == FINISHED else f"at clock {clock}")
            waiting = ", waiting for a pull held for the clocks" if rank in held else ""
            lines.append(f"worker {w} (rank {rank}) {state}, silent {now - last:.0f} s{waiting}")
        status = dict(zip(protocol.STATUS_FIELDS, self._status().tolist()))
        slowest = status["slowest_worker"]
        culprit = ("" if slowest < 0 else
                   f"the slowest is worker {slowest} (rank {self.roles.workers[slowest]}), at "
                   f"clock {status['slowest_clock']}, silent for "
                   f"{status['slowest_silent_ms'] / 1000:.0f} s; ")
        raise WaitTimeout(f"no worker has sent anything for {now - max(heard):.0f} s "
                          f"(--timeout {self.timeout:g}): {culprit}" + "; ".join(lines))

    def heard(self, worker: int) -> None:
        """`worker` trains again (it joins): its silence counts from now."""
        self._heard[worker] = time.monotonic()

    def send(self, buf: np.ndarray, dest: int, tag: int = tags.REQUEST_TAG) -> None:
        self.stats.bytes_sent += buf.nbytes
        self._replies.append((self.roles.comm.Isend(buf, dest, tag), buf, dest))
        if len(self._replies) > 256:
            self._reap_replies()

    def send_copy(self, buf: np.ndarray, server: int) -> None:
        """Blocks of a dense table to server `server` (index), on a tag of their own."""
        self.send(buf, self.roles.servers[server], tags.DENSE_COPY_TAG)

    def receive_copy(self, into: np.ndarray, server: int, what: str) -> None:
        """Blocks of a dense table from server `server`, waited for within --timeout."""
        wait_all([self.roles.comm.Irecv(into, self.roles.servers[server],
                                        tags.DENSE_COPY_TAG)], self.timeout, lambda: what)

    def reply(self, buf: np.ndarray, dest: int, ts: int) -> None:
        """Answer request `ts` of rank `dest`."""
        self.send(buf, dest, protocol.reply_tag(ts, self._reply_tags))

    def _reap_replies(self) -> None:
        if self._replies:
            self._replies = [(r, b, d) for r, b, d in self._replies if not r.Test()]


def serve(roles, optimizer: Optimizer | None = None, width: int = 1,
          staleness: int | None = 0, timeout: float = 600.0) -> Server:
    """Serve as this rank's part of the parameter server until every worker has closed, with
    this optimizer (by default AdaGrad, rate 0.1) and consistency (staleness 0: BSP, s: SSP,
    None: ASP); returns the server, for its store and dense tables. For scripts that use
    KVWorker and DenseClient directly; training jobs build their own."""
    optimizer = optimizer or Optimizer("adagrad", lr=0.1)
    server = Server(roles, KVStore(width=width, optimizer=optimizer),
                    ClockTable(len(roles.workers), staleness), timeout=timeout)
    server.run()
    return server

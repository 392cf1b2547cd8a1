"""A server's event loop: receive a request, check it (`admission`), hand it to the handler of
its operation. One thread, one message at a time, in arrival order: MPI keeps the messages
from one worker in order, so a worker always reads its own earlier pushes.

The handlers are the parts' and capabilities' own, registered through a `ServerContext`
(what a handler may read and do): `pushes` (pushes and the clocks, BSP's ordered
application), `reads` (pulls, through `readgate`), `checkpoint_rounds` (taking checkpoints),
`stopping`, `watchdog` (silence, STATUS), and, as the job asks for them, range copies,
takeover and worker losses (`recovery`), `membership`, scoring and dense tables. Between
messages the loop runs the timers (`timers`: snapshots, the timeline), polls for a stop,
for `mpips ctl` requests and for timed checkpoints, and sends the range copies due; the
`outbox` carries every message out. What a server asks of the job around it comes in one
`Hooks` object.

The first living server leads (see `Placement.lead`): it writes each checkpoint's manifest,
names the clocks of timed checkpoints and of a stop, and takes `mpips ctl` requests. Under
ULFM, another rank's death goes to `recovery.deaths`: a server's to `takeover` (the living
copies of its keys answer for it), a worker's to `workerloss` (its rows go to the others).
"""
import logging
import time
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from ..base.errors import ProtocolError, WaitTimeout, said_by
from ..membership.requests import Membership
from ..models.optimizer import Optimizer
from ..ranks.bounded import Backoff
from ..recovery.deaths import survived
from ..recovery.rangecopies import RangeCopies
from ..recovery.takeover import Takeover
from ..recovery.workerloss import WorkerLosses
from ..wire import messages, protocol, tags
from ..wire.clocks import ClockTable
from ..wire.placement import Placement, describe_ranges
from ..wire.protocol import Op, Report
from .admission import admit, unbundle
from .checkpoint_clocks import Checkpoints
from .checkpoint_rounds import CheckpointRounds
from .context import Hooks, ServerContext, ServerStats
from .dense_tables import DenseTables
from .hotpath import HotPath, Taken
from .outbox import Outbox
from .progress import Progress
from .pushes import Pushes
from .readgate import ReadGate
from .reads import Reads
from .rowcache import RowCache
from .stopping import Stopping
from .store import KVStore
from .timers import Timers
from .watchdog import Watchdog

log = logging.getLogger("mpips")

__all__ = ["Hooks", "Server", "ServerStats", "serve"]

_NO_REPORT = Report()
CHECK_S = 0.5   # how often an idle server checks for silence and reaps finished sends
PROBES = 8      # probes more at once while the loop's wait is new (Server._idle)


class Server:
    def __init__(self, roles, store: KVStore, clocks: ClockTable, timeout: float,
                 hooks: Hooks | None = None, progress: Progress | None = None,
                 record_pulls: bool = False, checkpoints: Checkpoints | None = None,
                 placement: Placement | None = None, failover: bool = False,
                 workers_fail_over: bool = False, epochs: int = 1, parts: Sequence = (),
                 deaths: tuple = (), dense: DenseTables | None = None,
                 run_dir: str | None = None, run_id: str | None = None, scoring=None):
        """`checkpoints`: when to write them, where each worker stood (when resuming); by
        default only those a stop asks for. `failover` (ULFM): when another server dies, go on
        with the living copies of its keys. With `parts` (each worker's part of the data), a
        worker's rows left (of `epochs`) go to the others when it leaves, and with
        `workers_fail_over` (ULFM) when it dies; `deaths`: those before a resume. `dense`: the
        dense tables (default: none yet). `run_dir`: where `mpips ctl` leaves requests for the
        lead. `scoring`: makes its share of the test rows to score (job.scoring.Scoring)."""
        self.roles, self.store, self.clocks, self.timeout = roles, store, clocks, timeout
        self.progress = progress
        self.stats = ServerStats()
        self.ctx = ctx = ServerContext(roles, store, clocks, timeout, hooks or Hooks(),
                                       placement or Placement(len(roles.servers)), self.stats)
        ctx.outbox = Outbox(roles, self.stats, timeout)
        ctx.watchdog = Watchdog(ctx)
        ctx.copies = RangeCopies(ctx)   # ranges copied to new holders (failover, moves)
        ctx.takeover = Takeover(ctx) if failover else None
        ctx.losses = (WorkerLosses(ctx, epochs, list(parts), deaths, hot=workers_fail_over)
                      if parts else None)
        ctx.ckpt = checkpoints or Checkpoints(0, 0.0, len(roles.servers), clocks.staleness == 0)
        ctx.gate = ReadGate(clocks, record_pulls)
        ctx.rows = RowCache(len(roles.workers))
        ctx.pushes = Pushes(ctx)
        ctx.reads = Reads(ctx)
        ctx.rounds = CheckpointRounds(ctx)
        ctx.stopping = Stopping(ctx)
        self.timers = Timers(ctx)
        # The lead: the other servers' BYE (after their last SHARD_SAVED) is waited for.
        self._servers_left = {roles.servers[i] for i in ctx.others()} if ctx.lead else set()
        ctx.register({Op.FINISH: self._on_finish, Op.BYE: self._on_bye,
                      Op.ERROR: self._on_error})
        ctx.members = Membership(ctx, run_dir, run_id)
        ctx.scoring = scoring(ctx) if scoring else None
        if ctx.scoring:
            ctx.register(ctx.scoring.handlers())
        ctx.dense = dense or DenseTables(roles.index, ctx.placement, len(roles.workers))
        ctx.register(ctx.dense.handlers(ctx))
        ctx.servers_died = self._servers_died
        self.hot = HotPath(ctx, progress)

    # What the job reads back once serving is over.
    @property
    def placement(self) -> Placement:
        return self.ctx.placement

    @property
    def members(self) -> Membership:
        return self.ctx.members

    @property
    def losses(self) -> WorkerLosses | None:
        return self.ctx.losses

    @property
    def scoring(self):
        return self.ctx.scoring

    @property
    def dense(self) -> DenseTables:
        return self.ctx.dense

    @property
    def timeline(self):
        return self.timers.timeline

    @property
    def positions(self) -> dict:
        return self.ctx.ckpt.positions

    @property
    def stop_at(self):
        return self.ctx.ckpt.stop_at

    @property
    def stopped(self) -> bool:
        return self.ctx.gate.stopped

    @property
    def completed(self) -> set:
        return self.ctx.ckpt.completed

    @property
    def held_s(self) -> np.ndarray:
        return self.ctx.gate.held_s

    def pull_records(self) -> np.ndarray:
        """The recorded pulls (with record_pulls) as a readgate.PULL_RECORD array."""
        return self.ctx.gate.pull_records()

    @property
    def failures(self) -> list:
        """What this server saw of other ranks' deaths (under ULFM)."""
        ctx = self.ctx
        return ((ctx.takeover.failures if ctx.takeover else [])
                + (ctx.losses.failures if ctx.losses else []))

    # The loop: receive and dispatch, and the timers between messages.
    def run(self) -> ServerStats:
        """Serve until every worker has said BYE; the lead also until every other server has
        (after its last SHARD_SAVED), so it knows which checkpoints are complete."""
        ctx = self.ctx
        self._buf = np.empty(1 << 16, np.uint8)
        self._probed = MPI.Status()
        self._backoff = Backoff(patient_after=float("inf"))   # replies as fast after a lull
        start = self._quiet_since = ctx.gate.start = time.monotonic()
        ctx.watchdog.start(start)
        self._next_check = start
        self.timers.start(start)
        ctx.rounds.start(start)
        try:
            while self._serving():
                try:
                    self._step()
                except MPI.Exception as e:
                    if not survived(self.ctx, e):
                        raise
        except BaseException as e:
            ctx.rounds.abandon(f"{type(e).__name__}: {e}")
            raise
        if not ctx.lead:   # after this server's last SHARD_SAVED, in MPI's order
            ctx.send(messages.Bye().pack(), ctx.lead_rank)
        for clock, missing in ctx.ckpt.incomplete():
            log.warning("checkpoint at clock %d is incomplete (server(s) %s did not write it, "
                        "the job having ended first): it will be passed over", clock, missing)
        while True:
            try:
                ctx.outbox.wait()
                break
            except MPI.Exception as e:   # under ULFM: replies to a rank that died since
                if not survived(self.ctx, e):
                    raise
        self.stats.pulls_held = ctx.gate.pulls_held
        self.timers.finish_writing()
        self.timers.sample(time.monotonic() - start, force=True)
        if self.progress and ctx.lead:
            self.progress.log(final=True)
        return self.stats

    def _serving(self) -> bool:
        """Whether the loop goes on: for the workers, the other servers, range copies and
        test rows; after them, until this server's checkpoint file being written is in."""
        ctx = self.ctx
        if (ctx.watchdog.talking or self._servers_left or ctx.copies.needed()
                or (ctx.scoring and ctx.scoring.busy)):
            return True
        return ctx.rounds.ending()   # bounded by --timeout (see CheckpointRounds._check)

    def _step(self) -> None:
        """One turn of the loop: the timers, then one message received and dispatched (or a
        short idle wait)."""
        ctx = self.ctx
        now = time.monotonic()
        # Timed work is checked here, without a call, on every turn: a turn is microseconds.
        if now >= self.timers.next_at:
            self.timers.tick(now)
        ctx.stopping.poll()   # on every turn: a stop is named at the clock it is seen
        if now >= ctx.members.next_poll:
            ctx.members.poll(now)
        if now >= ctx.rounds.next_check:   # timed checkpoints, the file being written
            ctx.rounds.poll(now)
        if ctx.copies.sending:   # a few ranges a turn
            ctx.copies.send_copies()
        msg = ctx.roles.comm.Improbe(MPI.ANY_SOURCE, tags.REQUEST_TAG, self._probed)
        if msg is None and ctx.scoring and ctx.scoring.poll():   # test rows when idle
            self._backoff.reset()
            self._quiet_since = now
            return
        if msg is None:
            msg = self._idle(now)
            if msg is None:
                return
            now = time.monotonic()   # (the probes that found it were the wait)
        self._receive(msg, now)

    def _receive(self, msg: MPI.Message, now: float) -> None:
        """A request probed at `now`: received, handled and answered."""
        self._backoff.reset()
        nbytes = self._probed.Get_count(MPI.BYTE)
        if self._buf.shape[0] < nbytes:
            self._buf = np.empty(max(nbytes, 2 * self._buf.shape[0]), np.uint8)
        msg.Recv([self._buf, nbytes, MPI.BYTE])
        self._quiet_since = now   # (a server still scoring reads from the others)
        self.stats.requests += 1
        self.stats.bytes_received += nbytes
        self.handle(self._probed.Get_source(), self._buf[:nbytes])
        self.stats.busy_s += time.monotonic() - now

    def handle(self, source: int, buf: np.ndarray) -> None:
        """The message `buf` received from rank `source`: its request, or a push then a pull
        if it bundles them (protocol.WITH_PUSH; each admitted on its own: a bad pull stops the
        job after its push was taken)."""
        h = protocol.header(buf) if buf.shape[0] >= protocol.HEADER_BYTES else None
        if h is not None and h.op == Op.PULL and h.flags & protocol.WITH_PUSH:
            taken = self.hot.take_bundle(source, buf, h)
            if taken == Taken.BOTH:
                return
            push, push_h, buf, h = unbundle(buf, h, self.ctx.sender(source))
            if taken == Taken.NONE:
                self._take(source, push, push_h)
        self._take(source, buf, h)

    def _take(self, source: int, buf: np.ndarray, h: protocol.Header | None) -> None:
        """One request: the short way if it takes it (hotpath), else the general way."""
        if h is None or not self.hot.take(source, buf, h):
            self._dispatch(source, buf, h)

    def _idle(self, now: float) -> MPI.Message | None:
        """No message: the silence checks now and then; a span of a table's copy, or a wait.
        While the wait is new (Backoff.eager), PROBES probes more at once first: a request
        due in microseconds is taken sooner than after a yield; the one that came, if any."""
        ctx = self.ctx
        if now >= self._next_check:
            talking = ctx.watchdog.talking
            if talking or (ctx.scoring and ctx.scoring.scoring_here) or ctx.rounds.writing:
                if talking:
                    ctx.watchdog.check()
                self._quiet_since = now
            elif now - self._quiet_since > ctx.timeout:
                raise self._overdue()
            ctx.outbox.reap()
            self._next_check = now + CHECK_S
        if ctx.rounds.copying or self.timers.copying:
            (ctx.rounds.poll if ctx.rounds.copying else self.timers.tick)(now)
            return None
        if self._backoff.eager():
            comm, probed = ctx.roles.comm, self._probed
            for _ in range(PROBES):
                msg = comm.Improbe(MPI.ANY_SOURCE, tags.REQUEST_TAG, probed)
                if msg is not None:
                    return msg
        self._backoff.idle()
        return None

    def _overdue(self) -> WaitTimeout:
        """What the workers all gone, this server still waits for past --timeout."""
        ctx, timeout = self.ctx, self.ctx.timeout
        if ctx.scoring and ctx.scoring.busy:
            return WaitTimeout(f"server rank(s) {ctx.scoring.waiting_for} did not say they "
                               f"had scored their test rows within --timeout {timeout:g} s "
                               f"of the last worker")
        if self._servers_left:
            return WaitTimeout(f"servers {sorted(self._servers_left)} did not say they had "
                               f"finished within --timeout {timeout:g} s of the last worker")
        return WaitTimeout(f"the copies of key range(s) "
                           f"{describe_ranges(ctx.copies.awaited())} did not arrive within "
                           f"--timeout {timeout:g} s of the last worker")

    def _dispatch(self, source: int, buf: np.ndarray, h: protocol.Header | None) -> None:
        """The general way: `buf` (header `h`, if it has one) admitted, then handled."""
        ctx, roles = self.ctx, self.roles
        from_worker = source not in roles.servers
        if from_worker and roles.worker_index(source) in ctx.clocks.gone:
            return   # a dead worker's message still on its way: its clocks are settled
        if (h and h.op == Op.HANDOUT and not from_worker
                and roles.servers.index(source) in ctx.placement.dead):
            return   # a dead lead's copy of the hand-out, on its way as this server took over
        if from_worker and h and ctx.members.refused_stale(h, source):
            return
        if ctx.takeover and h and h.placement > ctx.placement.version:
            ctx.takeover.catch_up(h.placement, ctx.sender(source))
        request = admit(buf, ctx.sender(source), from_worker, to_lead=ctx.lead,
                        from_lead=source == ctx.lead_rank, width=self.store.width,
                        placement=ctx.placement, server=roles.index,
                        columns=self.store.columns, n_workers=len(roles.workers),
                        load=ctx.members.load, header=h)
        if from_worker:
            worker = roles.worker_index(source)
            ctx.watchdog.message_from(worker)
            if self.progress and request.report is not None:
                self.progress.update(worker, request.report, say=ctx.lead)
        handler = ctx.handlers.get(request.op)
        if handler is None:
            raise ProtocolError(f"{ctx.sender(source)} sent a bad request: {request.op.name}, "
                                f"which a server without failover does not take; it was not "
                                f"applied, and the job stops")
        handler(source, request, buf)

    # The loop's own handlers: the ends of a worker's training and of a rank's serving.
    def _on_finish(self, source: int, r, buf) -> None:
        ctx = self.ctx
        worker = self.roles.worker_index(source)
        ctx.ckpt.note(worker, r.header.clock, r.report or _NO_REPORT, True)
        handed = (ctx.losses.finished(worker, r.header.clock, ctx.ckpt.positions[worker])
                  if ctx.losses else None)
        ctx.members.worker_finished(worker, r.header.clock, handed)
        self.clocks.finish(worker)
        ctx.pushes.advance()
        ctx.copies.send_copies()
        if self.clocks.all_finished:
            ctx.reached("scoring", 0)
            self.stats.train_bytes_sent = self.stats.bytes_sent
            self.stats.train_requests = self.stats.train_requests or self.stats.requests
            self.timers.final_snapshot()

    def _on_bye(self, source: int, r, buf) -> None:
        self.ctx.watchdog.forget({source})
        self._servers_left.discard(source)

    def _on_error(self, source: int, r, buf) -> None:
        ctx = self.ctx
        ctx.hooks.failed(said_by(ctx.sender(source).split(" (")[0], messages.Error.of(buf).reason))
        ctx.send(np.ones(1, np.int64), source, tags.ERROR_ACK_TAG)

    def _servers_died(self, gone: set, was_lead: bool) -> None:
        """Servers `gone` died (the placement already without them): nobody waits for them;
        this server leads if the lead died and it is the first living one."""
        ctx = self.ctx
        ctx.members.servers_died()
        # (if a failure cut an advance short) their ranges may be this server's now
        ctx.pushes.apply_backups()
        ctx.dense.placement_changed(ctx.placement)
        ctx.hooks.placement_changed(ctx.placement)
        ranks = {self.roles.servers[g] for g in gone}
        self._servers_left -= ranks
        if ctx.scoring:
            ctx.scoring.servers_gone(set(gone), was_lead)
        if ctx.lead and not was_lead:
            # It does not wait for the others' BYE at the end: some may have said it to the
            # dead lead. Files of checkpoints they report after it has ended are passed over.
            self._servers_left = set()
            log.warning("server %d leads from now on (checkpoints, progress, stopping, "
                        "mpips ctl)", self.roles.index)
            ctx.hooks.now_leads()
        if ctx.handout:
            ctx.handout.servers_died()
        ctx.forget_ranks(ranks)
        for server in gone:
            self.clocks.server_gone(server)
        if ctx.losses:
            ctx.losses.servers_died()
        ctx.rounds.servers_lost()
        ctx.pushes.advance()


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

"""A worker's conversation with the lead server, beside its key-value requests (see kvworker):
the workers' clocks (status), chunks of the test file to score, the notices the lead sends
(hand-overs of rows, leave, give rows to a worker that joins, join again), a split of this
worker's rows, a stop asked by a signal. Under failover, a question whose lead dies is asked
of the next lead.
"""
import logging

import numpy as np
from mpi4py import MPI

from ..base.errors import ProtocolError, WaitTimeout
from ..data.workplan import Handover
from ..ranks.ulfm import dead_ranks, is_failure
from ..wire import messages, protocol, tags
from ..wire.notices import GiveNotice, JoinNotice, LeaveNotice, notice_of
from ..wire.protocol import Op
from .requests import Pending, Reply

log = logging.getLogger("mpips")


class LeadChannel:
    """What a worker asks of and hears from the lead server, on its KVWorker's link (its
    request numbers, and `wait` to complete a question)."""

    def __init__(self, kv):
        self.kv = kv
        self.stop_sent = False
        self.asked_to_leave = False   # the lead said LEAVE_NOTICE (see notices)
        self.asked_to_give = None     # a GiveNotice not yet acted on
        self.join_clock = None        # the clock of a JOIN_NOTICE not yet acted on

    def server(self) -> int:
        """The server that leads: server 0, or after it died the first living one."""
        return self.kv.placement.lead

    def status(self, timeout: float | None = None) -> dict:
        """The lead server's view of the workers' clocks (see protocol.STATUS_FIELDS)."""
        out = np.empty(len(protocol.STATUS_FIELDS), np.int64)
        self.kv.wait(self._ask(Op.STATUS, out, "to report the workers' clocks", timeout))
        return dict(zip(protocol.STATUS_FIELDS, out.tolist()))

    def test_chunk(self) -> int:
        """Start asking the lead which chunk of the test file to score next (see
        job/scoring); kv.wait(ts) gives it, as int64 (start, stop): equal once none is left."""
        return self._ask(Op.CHUNK, np.empty(2, np.int64), "to hand out a chunk of the test "
                                                          "rows")

    def work_chunk(self, epoch: int, speed: float, units: float, held: int) -> int:
        """Start asking the lead for this worker's next chunk of training rows in `epoch`, at
        its speed, a row taking `units` of the file, `held` chunks handed to it so far
        (--balance dynamic, see data/balance); kv.wait(ts) gives it, as int64 (epoch, start,
        stop, minibatch rows): start == stop once none is left."""
        fields = messages.WorkAsk(epoch, speed, units, held).fields()
        return self._ask(Op.WORK, np.empty(4, np.int64), "to hand out a chunk of the training "
                         "rows", payload=(fields,))

    def _ask(self, op: Op, out: np.ndarray, what: str, timeout: float | None = None,
             payload: tuple = ()) -> int:
        """Start asking the lead server `op` (int64 `payload` after the header), its answer
        into `out`; kv.wait(ts) completes it. Should the lead die meanwhile (under failover),
        the next lead is asked."""
        kv = self.kv
        ts = kv.new_ts()
        lead = self.server()
        nkeys = sum(p.shape[0] for p in payload)

        def ask_next_lead(pending: Pending) -> Reply:
            kv.new_ts()
            lead = self.server()
            pending.sends.append(kv.send(lead, op, payload, nkeys=nkeys))
            return kv.reply_into(pending.out, lead)
        kv.track(ts, Pending(what=f"server rank {kv.rank_of(lead)} {what}",
                             sends=[kv.send(lead, op, payload, nkeys=nkeys)],
                             replies=[kv.reply_into(out, lead)],
                             out=out, version=kv.placement.version,
                             ask_next_lead=ask_next_lead, timeout=timeout))
        return ts

    def notices(self) -> list[tuple[int, Handover]]:
        """The hand-overs the lead server has told this worker of since the last call:
        (number, workplan.Handover), in the order they arrived. A notice to leave, to give
        rows to a worker that joins or to join sets `asked_to_leave`, `asked_to_give` or
        `join_clock`."""
        out: list[tuple[int, Handover]] = []
        status = MPI.Status()
        comm = self.kv.comm
        while True:
            try:
                if not comm.Iprobe(MPI.ANY_SOURCE, tags.NOTICE_TAG, status):
                    return out
            except MPI.Exception as e:   # under ULFM: a death not yet acknowledged
                if not is_failure(e):
                    raise
                dead_ranks(comm)
                continue
            fields = np.empty(status.Get_count(MPI.BYTE) // 8, np.int64)
            comm.Recv(fields, status.Get_source(), tags.NOTICE_TAG)
            if status.Get_source() not in self.kv.servers:
                raise ProtocolError(f"rank {status.Get_source()}, not a server, sent this worker "
                                    f"a notice")
            try:
                notice = notice_of(fields)
                if isinstance(notice, LeaveNotice):
                    self.asked_to_leave = True
                elif isinstance(notice, GiveNotice):
                    self.asked_to_give = notice
                elif isinstance(notice, JoinNotice):
                    self.join_clock = notice.clock
                else:
                    out.append((notice.number, Handover.of_fields(notice.handover)))
            except (ValueError, IndexError) as e:
                raise ProtocolError(f"rank {status.Get_source()} sent a notice that holds no "
                                    f"death: {e}") from None

    def who_is_slow(self) -> str:
        """What the lead server says of the slowest worker, for a message about a wait that
        ran out."""
        kv = self.kv
        try:
            s = self.status(timeout=min(5.0, kv.timeout))
        except WaitTimeout:
            return (f"; server rank {kv.rank_of(self.server())} did not say which worker is "
                    f"slowest either (is it frozen?)")
        if s["slowest_worker"] < 0:
            return f"; server {self.server()} says every worker has finished"
        rank = len(kv.servers) + s["slowest_worker"]
        return (f"; server {self.server()} says the slowest is worker {s['slowest_worker']} "
                f"(rank {rank}), at "
                f"clock {s['slowest_clock']}, silent for {s['slowest_silent_ms'] / 1000:.0f} s")

    def report_share(self, fields: np.ndarray) -> None:
        """Tell the lead this worker split its rows left with the worker joining (a
        Handover.fields()): it numbers the split and tells every worker."""
        self.asked_to_give = None
        kv = self.kv
        ts = kv.new_ts()
        kv.track(ts, Pending(
            what="this worker's split of its rows to be sent",
            sends=[kv.send(self.server(), Op.SPLIT, (fields,), nkeys=fields.shape[0])],
            version=kv.placement.version))

    def pass_on_stop(self, requested: bool) -> None:
        """A stop asked of this worker (`requested`: a signal to this rank alone) goes to the
        lead, once."""
        if requested and not self.stop_sent:
            self.ask_to_stop()

    def ask_to_stop(self) -> None:
        """Tell the lead this rank was asked to stop (a signal): it stops the whole job at a
        clock every rank can reach, after a checkpoint."""
        log.info("asked to stop (a signal): telling the lead server")
        self.stop_sent = True
        kv = self.kv
        ts = kv.new_ts()
        kv.track(ts, Pending(what="the stop request to be sent",
                             sends=[kv.send(self.server(), Op.STOP)],
                             version=kv.placement.version))

    def rejoin(self) -> None:
        """Asked to join again: go on from the clock the lead named."""
        self.kv.clock, self.join_clock, self.asked_to_leave = self.join_clock, None, False

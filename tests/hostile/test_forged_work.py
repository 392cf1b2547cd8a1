"""Forged requests for chunks of training rows (WORK, --balance dynamic): refused at
admission or by the lead's hand-out, naming the sender (no MPI needed)."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from mpips.base.errors import ProtocolError
from mpips.data.balance import Balance
from mpips.server.admission import admit
from mpips.server.rowhandout import RowHandOut
from mpips.wire import messages, protocol
from mpips.wire.placement import Placement
from mpips.wire.protocol import Header, Op


def work(epoch: int, speed: float = 100.0, units: float = 40.0, held: int = 0,
         **fields) -> np.ndarray:
    payload = messages.WorkAsk(epoch, speed, units, held).fields()
    return protocol.pack(Header(Op.WORK, nkeys=payload.shape[0], ts=5, **fields), payload)


def check(buf, role: str, to_lead: bool):
    return admit(buf, f"{role} 1 (rank 3)", role == "worker", to_lead=to_lead,
                 from_lead=False, width=1, placement=Placement(2), server=0)


@pytest.mark.parametrize("role, to_lead, build, says", [
    ("server", True, lambda: work(0), "WORK, which this server may not send"),
    ("worker", False, lambda: work(0), "WORK, which a worker may not send"),
    ("worker", True, lambda: work(0)[:-8], "WORK of 72 bytes"),
], ids=["a server asking the lead", "a worker asking a server that does not lead",
        "cut short"])
def test_a_forged_request_for_rows_is_refused_at_admission(role, to_lead, build, says):
    with pytest.raises(ProtocolError) as refused:
        check(build(), role, to_lead)
    assert str(refused.value).startswith(f"{role} 1 (rank 3) sent a bad request: ")
    assert says in str(refused.value)


def test_a_worker_asking_the_lead_is_admitted():
    request = check(work(0), "worker", True)
    assert request.op is Op.WORK
    assert messages.WorkAsk.of(work(2, 12.5, 3.25, 7)) == messages.WorkAsk(2, 12.5, 3.25, 7)


class Lead:
    """What RowHandOut reads of its server: server `index` of `servers` (at ranks 10, 11,
    ...), workers at ranks 2 and 3, under failover (each key on `replicas` servers: 2 by
    default) or not; what it sends and replies kept."""

    def __init__(self, lead: bool = True, index: int | None = None, servers: int = 2,
                 failover: bool = False, replicas: int | None = None):
        self.handlers: dict = {}
        self.replies: list = []
        self.sent: list = []
        self.roles = self
        self.index = (0 if lead else 1) if index is None else index
        self.servers = [10 + i for i in range(servers)]
        self.placement = Placement(servers, replicas or (2 if failover else 1))
        self.takeover = object() if failover else None
        self.clocks = SimpleNamespace(gone=set(), done=[0, 0])
        self.ckpt = SimpleNamespace(positions={})
        self.losses = None

    @property
    def lead(self) -> bool:
        return self.placement.lead == self.index

    def register(self, handlers: dict) -> None:
        self.handlers.update(handlers)

    def worker_index(self, rank: int) -> int:
        return rank - 2

    def sender(self, rank: int) -> str:
        if rank >= 10:
            return f"server {rank - 10} (rank {rank})"
        return f"worker {rank - 2} (rank {rank})"

    def reply(self, buf, dest: int, ts: int) -> None:
        self.replies.append((buf.tolist(), dest, ts))

    def send(self, buf, dest: int) -> None:
        self.sent.append((buf, dest))


def ask(hand_out: RowHandOut, rank: int, buf: np.ndarray) -> None:
    hand_out.on_work(rank, check(buf, "worker", True), buf)


def test_the_lead_answers_with_a_chunk_and_a_minibatch_size():
    lead = Lead()
    hand_out = RowHandOut(lead, Balance(1000, 2, 2, batch=10))
    ask(hand_out, 3, work(0, 0.0))
    [(answer, dest, ts)] = lead.replies
    assert dest == 3 and ts == 5
    epoch, start, stop, batch = answer
    assert (epoch, start, batch) == (0, 0, 10) and 0 < stop < 1000


@pytest.mark.parametrize("buf, says", [
    (work(1), "worker 1 (rank 3) asked for a chunk of epoch 1, which it is not in (it is in "
              "epoch 0)"),
    (work(0, -2.0), "worker 1 (rank 3) asked for a chunk at a speed of -2.0 rows per second"),
    (work(0, 10.0, -1.0), "worker 1 (rank 3) asked for a chunk of rows of -1.0 units each"),
])
def test_a_request_for_rows_the_worker_may_not_have_is_refused_naming_it(buf, says):
    lead = Lead()
    with pytest.raises(ProtocolError, match="refused, and the job stops") as refused:
        ask(RowHandOut(lead, Balance(1000, 2, 2, batch=10)), 3, buf)
    assert says in str(refused.value) and not lead.replies


def test_a_request_for_rows_under_static_balance_is_refused():
    with pytest.raises(ProtocolError, match=r"worker 0 \(rank 2\) asked for a chunk of training "
                                            r"rows \(WORK\), but this job hands out none"):
        ask(RowHandOut(Lead(), None), 2, work(0))


def test_a_server_that_comes_to_lead_stops_the_job_rather_than_hand_out_rows_again():
    from mpips.ranks.ulfm import CannotFailOver
    hand_out = RowHandOut(Lead(lead=False), Balance(1000, 2, 2, batch=10))
    with pytest.raises(CannotFailOver, match=r"died, and its hand-out with it \(no living"):
        ask(hand_out, 2, work(0))


# Under failover: the copy on the standby (server/rowhandout).

def deliver(sent: tuple, to: Lead, source: int | None = None) -> None:
    """A message a server sent (by default, the first other living server), admitted and
    handled by server `to` as its loop would."""
    buf, dest = sent
    assert dest == to.servers[to.index]
    if source is None:
        source = next(s for s in to.servers if s != dest and s - 10 not in to.placement.dead)
    request = admit(buf, to.sender(source), False, to_lead=to.lead,
                    from_lead=source == to.servers[to.placement.lead], width=1,
                    placement=to.placement, server=to.index)
    to.handlers[request.op](source, request, buf)


def pair(servers: int = 2):
    """A lead and its standby under failover, with the same hand-out to start from."""
    lead, standby = (Lead(index=i, servers=servers, failover=True) for i in (0, 1))
    return (lead, RowHandOut(lead, Balance(1000, 2, 2, batch=10)),
            standby, RowHandOut(standby, Balance(1000, 2, 2, batch=10)))


def test_the_lead_answers_once_its_standby_holds_the_copy_of_the_hand_out():
    lead, lead_rows, standby, standby_rows = pair()
    assert standby_rows.current and not standby_rows.led
    ask(lead_rows, 2, work(0, 0.0))
    assert not lead.replies   # held until the standby holds the copy
    [copy] = lead.sent
    deliver(copy, standby)
    assert standby_rows.balance.copy() == lead_rows.balance.copy()
    [held] = standby.sent
    deliver(held, lead)
    [(answer, dest, ts)] = lead.replies
    assert dest == 2 and ts == 5 and answer[1] == 0


def test_the_standby_that_comes_to_lead_answers_a_question_asked_again_alike():
    """The lead died after its standby held the copy, before the worker had the answer: the
    worker asks the standby again (holding no chunk yet) and gets the same chunk; its next
    question gets the next chunk of the pool."""
    lead, lead_rows, standby, standby_rows = pair()
    ask(lead_rows, 2, work(0, 0.0))
    deliver(lead.sent[0], standby)
    first = lead_rows.answers[0][1]
    standby.placement = standby.placement.without({0})
    standby_rows.servers_died()
    assert standby_rows.led and standby.lead
    ask(standby_rows, 2, work(0, 0.0))
    ask(standby_rows, 2, work(0, 50.0, 4.0, held=1))
    [(again, _, _), (then, _, _)] = standby.replies
    assert again == first and then[1] == first[2]   # the next chunk starts where it ended


def test_a_lead_whose_standby_died_copies_to_the_next_one_before_it_answers():
    lead, lead_rows, _, _ = pair(servers=3)
    third = Lead(index=2, servers=3, failover=True)
    third_rows = RowHandOut(third, Balance(1000, 2, 2, batch=10))
    assert not third_rows.current
    ask(lead_rows, 3, work(0, 0.0))
    lead.placement = third.placement = lead.placement.without({1})
    lead_rows.servers_died()
    assert not lead.replies and [dest for _, dest in lead.sent] == [11, 12]
    deliver(lead.sent[1], third)
    deliver(third.sent[0], lead)
    assert len(lead.replies) == 1 and third_rows.current


def test_with_three_copies_of_each_key_the_lead_and_its_first_standby_may_die_together():
    """--replicas 3, 4 servers: the lead copies the hand-out to servers 1 and 2 and answers
    only once both hold the copy. Then servers 0 and 1 die together: server 2 leads from its
    copy, answers the question asked again alike, and copies on to server 3 before it answers
    the next."""
    servers = [Lead(index=i, servers=4, failover=True, replicas=3) for i in range(4)]
    rows = [RowHandOut(s, Balance(1000, 2, 2, batch=10)) for s in servers]
    assert [r.current for r in rows] == [True, True, True, False]
    ask(rows[0], 2, work(0, 0.0))
    assert [dest for _, dest in servers[0].sent] == [11, 12] and not servers[0].replies
    for i in (1, 2):
        deliver(servers[0].sent[i - 1], servers[i], source=10)
    deliver(servers[1].sent[0], servers[0], source=11)
    assert not servers[0].replies, "held until every standby holds the copy"
    deliver(servers[2].sent[0], servers[0], source=12)
    [(first, dest, _)] = servers[0].replies
    assert dest == 2
    for s in servers[2:]:
        s.placement = s.placement.without({0, 1})
    rows[2].servers_died()
    assert rows[2].led and rows[2].standbys == [3]
    assert not rows[3].current and [dest for _, dest in servers[2].sent] == [10, 13]
    ask(rows[2], 2, work(0, 0.0))   # its answer died with the lead: asked again
    ask(rows[2], 2, work(0, 50.0, 4.0, held=1))
    assert not servers[2].replies, "held until server 3 holds the copy"
    for copy in servers[2].sent[1:]:   # the copy at its takeover, and after the next chunk
        deliver(copy, servers[3], source=12)
    deliver(servers[3].sent[0], servers[2], source=13)
    assert len(servers[2].replies) == 1, "the next answer waits for the copy with its chunk"
    deliver(servers[3].sent[1], servers[2], source=13)
    [(again, _, _), (then, _, _)] = servers[2].replies
    assert again == first and then[1] == first[2] and rows[3].current


def test_a_forged_or_damaged_copy_of_the_hand_out_is_refused_naming_the_sender():
    lead, lead_rows, standby, standby_rows = pair(servers=3)
    copy = messages.HandOutCopy(1, '{"balance": {}, "answers": {}}').pack()
    with pytest.raises(ProtocolError, match=r"server 2 \(rank 12\) sent a bad request: HANDOUT, "
                                            r"which this server may not send"):
        admit(copy, "server 2 (rank 12)", False, to_lead=False, from_lead=False, width=1,
              placement=standby.placement, server=1)
    damaged = dict(lead_rows.balance.copy(), speed=[1.0])
    bad = messages.HandOutCopy(1, json.dumps({"balance": damaged, "answers": {}})).pack()
    with pytest.raises(ProtocolError, match=r"server 0 \(rank 10\) sent a copy of the hand-out "
                                            r"of training rows that does not fit this job: "
                                            r"speed: 1 entries for 2 workers"):
        deliver((bad, 11), standby)
    assert standby_rows.number == 0 and standby_rows.balance.speed == [0.0, 0.0]
    ask(lead_rows, 2, work(0, 0.0))
    deliver((messages.HandOutHeld(1).pack(), 10), lead, source=12)   # not from the standby
    assert not lead.replies
    with pytest.raises(ProtocolError, match="says it holds copy 9 of the hand-out of training "
                                            "rows; 1 were sent"):
        lead_rows.on_held(11, SimpleNamespace(header=protocol.header(
            messages.HandOutHeld(9).pack())), None)

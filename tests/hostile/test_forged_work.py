"""Forged requests for chunks of training rows (WORK, --balance dynamic): refused at
admission or by the lead's hand-out, naming the sender (no MPI needed)."""
import numpy as np
import pytest

from mpips.base.errors import ProtocolError
from mpips.data.balance import Balance
from mpips.server.admission import admit
from mpips.server.rowhandout import RowHandOut
from mpips.wire import messages, protocol
from mpips.wire.placement import Placement
from mpips.wire.protocol import Header, Op


def work(epoch: int, speed: float = 100.0, units: float = 40.0, **fields) -> np.ndarray:
    payload = messages.WorkAsk(epoch, speed, units).fields()
    return protocol.pack(Header(Op.WORK, nkeys=payload.shape[0], ts=5, **fields), payload)


def check(buf, role: str, to_lead: bool):
    return admit(buf, f"{role} 1 (rank 3)", role == "worker", to_lead=to_lead,
                 from_lead=False, width=1, placement=Placement(2), server=0)


@pytest.mark.parametrize("role, to_lead, build, says", [
    ("server", True, lambda: work(0), "WORK, which this server may not send"),
    ("worker", False, lambda: work(0), "WORK, which a worker may not send"),
    ("worker", True, lambda: work(0)[:-8], "WORK of 64 bytes"),
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
    assert messages.WorkAsk.of(work(2, 12.5, 3.25)) == messages.WorkAsk(2, 12.5, 3.25)


class Lead:
    """What RowHandOut reads of its server: workers at ranks 2 and 3, replies kept."""

    def __init__(self, lead: bool = True):
        self.handlers: dict = {}
        self.replies: list = []
        self.roles = self
        self.lead = lead

    def register(self, handlers: dict) -> None:
        self.handlers.update(handlers)

    def worker_index(self, rank: int) -> int:
        return rank - 2

    def sender(self, rank: int) -> str:
        return f"worker {rank - 2} (rank {rank})"

    def reply(self, buf, dest: int, ts: int) -> None:
        self.replies.append((buf.tolist(), dest, ts))


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
    with pytest.raises(CannotFailOver, match="died, and its hand-out with it"):
        ask(hand_out, 2, work(0))

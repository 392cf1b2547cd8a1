"""--balance dynamic's hand-out: every row once per epoch, shares that follow speed, chunks
given back by a worker that dies or leaves, a checkpoint's state resumed."""
import json
import re

import numpy as np
import pytest

from mpips.data.balance import Balance, Refused

TOTAL, EPOCHS = 1000, 3


def drain(b: Balance, speeds: dict, counts: np.ndarray, epochs: dict | None = None,
          stop_after: int | None = None) -> dict:
    """Workers ask in turn, each as often as its speed says (a faster one asks more often),
    until none is left (or `stop_after` asks); counts[epoch, row] += 1 for each chunk.
    Returns each worker's epoch."""
    at = dict(epochs or {w: 0 for w in speeds})
    asks = 0
    credit = {w: 0.0 for w in speeds}
    while any(e < b.epochs for e in at.values()):
        for w, s in speeds.items():
            credit[w] += s
            while credit[w] >= 1 and at[w] < b.epochs:
                credit[w] -= 1
                c = b.ask(w, at[w], s, 1.0)
                at[w] = max(at[w], c.epoch)
                if not c.none:
                    counts[c.epoch, c.start:c.stop] += 1
                asks += 1
                if stop_after is not None and asks >= stop_after:
                    return at
    return at


@pytest.mark.parametrize("speeds", [{0: 1.0, 1: 1.0}, {0: 1.0, 1: 3.0},
                                    {0: 1.0, 1: 3.0, 2: 3.0, 3: 3.0}])
def test_every_row_is_handed_out_once_per_epoch(speeds):
    b = Balance(TOTAL, EPOCHS, len(speeds), batch=10)
    counts = np.zeros((EPOCHS, TOTAL), np.int64)
    drain(b, speeds, counts)
    assert (counts == 1).all()
    assert b.left() == 0


def test_minibatches_follow_speed_and_keep_the_global_batch():
    b = Balance(TOTAL, EPOCHS, 4, batch=30)
    for w, s in enumerate([100.0, 300.0, 300.0, 300.0]):
        b.ask(w, 0, s)
    sizes = [b.ask(w, 0, s).batch for w, s in enumerate([100.0, 300.0, 300.0, 300.0])]
    assert sizes == [12, 36, 36, 36]   # 120 rows a clock, as 4 x 30; the slow one a third
    assert sum(sizes) == 4 * 30


def test_chunks_last_as_many_clocks_at_most_then_shrink():
    b = Balance(100_000, 1, 2, batch=10)
    first = b.ask(0, 0, 0.0, 0.0)   # neither speed nor row size known yet
    assert first.stop - first.start == 100_000 // (2 * 128) + 1
    b.ask(1, 0, 100.0, 2.0)   # 2 units a row; worker 0's speed not known: as fast
    fast = b.ask(0, 0, 200.0, 2.0)
    slow = b.ask(1, 0, 100.0, 2.0)   # a third of the summed speed
    assert (slow.batch, fast.batch) == (7, 13)
    assert slow.stop - slow.start == 32 * 7 * 2 and fast.stop - fast.start == 32 * 13 * 2
    sizes = []
    b.out.add(1)   # worker 1 gone: worker 0 alone
    while not (c := b.ask(0, 0, 200.0, 2.0)).none:
        sizes.append(c.stop - c.start)
    assert max(sizes) == 32 * 10 * 2, "alone, at most 32 clocks of --batch-size rows"
    tail = sizes[sizes.index(max(sizes)) + 1:]
    assert tail == sorted(tail, reverse=True) and len(tail) > 3
    assert min(tail[:-1]) == 2 * 10 * 2, "at least 2 clocks, but the last of the pool"


@pytest.mark.parametrize("done, offset", [(0, -1), (1, -1), (1, 40), (2, -1)])
def test_a_worker_that_dies_gives_back_what_it_had_not_trained(done, offset):
    b = Balance(TOTAL, EPOCHS, 3, batch=10)
    counts = np.zeros((EPOCHS, TOTAL), np.int64)
    at = drain(b, {0: 1.0, 1: 1.0, 2: 1.0}, counts, stop_after=7)
    handed = list(b.handed[1])
    back = b.give_back(1, done, offset if offset < 0 else handed[done][1] + offset)
    for e, start, stop in back:
        counts[e, start:stop] -= 1
    assert sum(s - a for _, a, s in back) == (sum(s - a for _, a, s in handed[done:])
                                               - max(0, offset))
    at.pop(1)
    drain(b, {0: 1.0, 2: 1.0}, counts, at)
    assert (counts == 1).all()


def test_what_is_given_back_goes_to_a_worker_in_a_later_epoch():
    b = Balance(TOTAL, 2, 2, batch=10)
    piece = b.ask(1, 0, 1.0)
    counts = np.zeros((2, TOTAL), np.int64)
    counts[0, piece.start:piece.stop] += 1
    at = drain(b, {0: 1.0}, counts, {0: 0}, stop_after=30)   # worker 0 into epoch 1
    assert at[0] == 1
    back = b.give_back(1, 0, piece.start + 3)
    assert back == [(0, piece.start + 3, piece.stop)]
    counts[0, piece.start + 3:piece.stop] -= 1
    c = b.ask(0, 1, 1.0)
    assert (c.epoch, c.start, c.stop) == back[0], "given back first, under its own epoch"
    counts[c.epoch, c.start:c.stop] += 1
    drain(b, {0: 1.0}, counts, {0: 1})
    assert (counts == 1).all()


def test_what_no_one_can_take_is_abandoned():
    b = Balance(TOTAL, 1, 2, batch=10)
    c = b.ask(1, 0, 1.0)
    drain(b, {0: 1.0}, np.zeros((1, TOTAL), np.int64), {0: 0})
    b.give_back(1, 0, -1)
    assert b.abandoned == [(0, c.start, c.stop)] and b.left() == 0


@pytest.mark.parametrize("worker, epoch, why", [
    (1, 1, "epoch 1, which it is not in (it is in epoch 0)"),
    (5, 0, "worker 5, of 2"),
])
def test_a_request_outside_the_workers_epoch_is_refused(worker, epoch, why):
    b = Balance(TOTAL, EPOCHS, 2, batch=10)
    with pytest.raises(Refused, match=why.replace("(", r"\(").replace(")", r"\)")):
        b.ask(worker, epoch, 1.0)


def test_a_bad_speed_is_refused():
    with pytest.raises(Refused, match="speed of nan"):
        Balance(TOTAL, EPOCHS, 2, batch=10).ask(0, 0, float("nan"))


def test_a_checkpoint_state_resumes_from_each_workers_place():
    b = Balance(TOTAL, EPOCHS, 2, batch=10)
    counts = np.zeros((EPOCHS, TOTAL), np.int64)
    drain(b, {0: 1.0, 1: 2.0}, counts, stop_after=9)
    # The checkpoint's places: worker 0 done with 1 chunk and 5 rows into its next, worker 1
    # with all it holds.
    handed0, handed1 = b.handed[0], b.handed[1]
    places = {0: (handed0[1][0], 1, handed0[1][1] + 5),
              1: (handed1[-1][0], len(handed1), -1)}
    for e, start, stop in handed0[1:]:
        counts[e, start:stop] -= 1
    counts[handed0[1][0], handed0[1][1]:handed0[1][1] + 5] += 1
    resumed = Balance.of_state(b.state(), EPOCHS, 2, 10, 1, places)
    drain(resumed, {0: 1.0, 1: 2.0}, counts, {0: places[0][0], 1: places[1][0]})
    assert (counts == 1).all()


def test_a_resume_gives_back_to_a_worker_going_on_though_the_others_are_done():
    b = Balance(TOTAL, 1, 2, batch=10)
    c = b.ask(1, 0, 1.0, 1.0)
    counts = np.zeros((1, TOTAL), np.int64)
    drain(b, {0: 1.0}, counts, {0: 0})   # worker 0 trains the rest: done
    places = {0: (1, len(b.handed[0]), -1), 1: (0, 0, c.start + 3)}
    resumed = Balance.of_state(b.state(), 1, 2, 10, 1, places)
    assert resumed.returned == [(0, c.start + 3, c.stop)] and not resumed.abandoned
    got = resumed.ask(1, 0, 1.0, 1.0)
    assert got.start == c.start + 3 and got.stop <= c.stop, "given back first (cut to size)"


def test_a_slow_worker_keeps_a_least_minibatch():
    b = Balance(TOTAL, 1, 2, batch=160)
    b.ask(0, 0, 1.0, 1.0)
    fast = b.ask(1, 0, 1000.0, 1.0)
    slow = b.ask(0, 0, 1.0, 1.0)
    assert (slow.batch, fast.batch) == (10, 320), "a 16th of --batch-size at least"


@pytest.mark.parametrize("offset", [-1, 0, 40])
def test_a_worker_that_left_joins_again_and_every_row_is_handed_out_once(offset):
    """Worker 2 leaves in its second chunk (`offset` rows into it; -1: none), the others go
    on, and it joins again: it asks from the epoch it left in, its chunks numbered on from
    the part of that chunk it trained."""
    b = Balance(TOTAL, EPOCHS, 3, batch=10)
    counts = np.zeros((EPOCHS, TOTAL), np.int64)
    at = drain(b, {0: 1.0, 1: 1.0, 2: 1.0}, counts, stop_after=7)
    handed = list(b.handed[2])
    cut = handed[1][1] + offset if offset >= 0 else -1
    for e, start, stop in b.give_back(2, 1, cut):
        counts[e, start:stop] -= 1
    assert len(b.handed[2]) == (2 if offset >= 0 else 1), "the part it trained stays its own"
    left_in = at.pop(2)
    at = drain(b, {0: 1.0, 1: 1.0}, counts, at, stop_after=5)
    numbered = len(b.handed[2])
    assert b.join(2) == left_in
    at[2] = left_in
    drain(b, {0: 1.0, 1: 1.0, 2: 1.0}, counts, at)
    assert (counts == 1).all()
    e, start, _ = handed[1]
    trained = [(e, start, cut)] if offset >= 0 else []
    assert len(b.handed[2]) > numbered and b.handed[2][:numbered] == handed[:1] + trained


@pytest.mark.parametrize("as_it_joins", [False, True])
def test_a_checkpoint_about_a_join_gives_back_the_joiners_new_chunks(as_it_joins):
    """The place a checkpoint keeps of a worker that left and joins again, where it left (3
    rows into its second chunk) or where the lead puts it as it joins (after its chunks, none
    started), may be older than the hand-out the checkpoint keeps: the chunks handed to it
    since go back, and only they."""
    b = Balance(TOTAL, EPOCHS, 2, batch=10)
    counts = np.zeros((EPOCHS, TOTAL), np.int64)
    at = drain(b, {0: 1.0, 1: 1.0}, counts, stop_after=5)
    left = (b.at[1], 1, b.handed[1][1][1] + 3)
    for e, start, stop in b.give_back(1, left[1], left[2]):
        counts[e, start:stop] -= 1
    at.pop(1)
    at = drain(b, {0: 1.0}, counts, at, stop_after=3)
    at[1] = b.join(1)
    place = (at[1], len(b.handed[1]), -1) if as_it_joins else left
    numbered = len(b.handed[1])
    drain(b, {0: 1.0, 1: 1.0}, counts, at, stop_after=6)
    assert len(b.handed[1]) > numbered, "chunks handed to it since"
    for e, start, stop in b.handed[1][numbered:]:
        counts[e, start:stop] -= 1
    places = {0: (b.at[0], len(b.handed[0]), -1), 1: place}
    resumed = Balance.of_state(b.state(), EPOCHS, 2, 10, 1, places)
    drain(resumed, {0: 1.0, 1: 1.0}, counts, {w: p[0] for w, p in places.items()})
    assert (counts == 1).all()


def test_a_join_is_refused_once_every_row_is_handed_out():
    """Under --balance dynamic an idle worker joins while rows are left to hand out; once none
    is, the join is refused, saying so; a worker training is refused as under static."""
    from types import SimpleNamespace

    from mpips.membership.workermoves import WorkerMoves
    from mpips.server.rowhandout import RowHandOut
    from mpips.wire.clocks import ClockTable

    b = Balance(TOTAL, 1, 2, batch=10)
    handout = RowHandOut(SimpleNamespace(lead=True, takeover=None, register=lambda handlers: None), b)
    clocks = ClockTable(2)
    clocks.finish(1)
    ctx = SimpleNamespace(roles=SimpleNamespace(workers=[1, 2]), losses=object(),
                          dense=SimpleNamespace(tables={}), clocks=clocks, handout=handout)
    moves = WorkerMoves(SimpleNamespace(ctx=ctx))
    assert moves.join_refusal(1) is None
    assert moves.join_refusal(0) == "worker 0 is training"
    drain(b, {0: 1.0}, np.zeros((1, TOTAL), np.int64), {0: 0})
    assert "every row of every epoch is handed out already" in moves.join_refusal(1)


def test_a_copy_of_the_hand_out_goes_on_as_the_hand_out_itself():
    """The standby's copy (take_copy of copy()) hands out what the lead would have, after
    asks, a worker's death and an abandoned span."""
    lead = Balance(1000, 2, 3, batch=10)
    for worker, speed in ((0, 0.0), (1, 0.0), (2, 0.0), (0, 50.0), (1, 150.0)):
        lead.ask(worker, 0, speed, 4.0)
    lead.give_back(2, 0, 3)
    standby = Balance(1000, 2, 3, batch=10)
    standby.take_copy(json.loads(json.dumps(lead.copy())))
    assert standby.copy() == lead.copy()
    for worker in (0, 1, 0, 1):
        assert standby.ask(worker, 0, 80.0, 4.0) == lead.ask(worker, 0, 80.0, 4.0)


def test_a_copy_of_the_changes_since_the_last_brings_a_standby_to_the_whole_hand_out():
    """After a whole copy, each copy holds only the chunks handed or changed since the last
    (an ask: the new chunk; a death: the dead worker's from its place on; a rejoin: its
    list anew), and the standby taking them in order holds the lead's whole hand-out."""
    lead, standby = (Balance(1_000_000, 3, 3, batch=10) for _ in range(2))

    def copy(whole: bool = False) -> dict:
        out = json.loads(json.dumps(lead.copy(whole)))
        lead.copied()
        standby.take_copy(out)
        assert standby.copy() == lead.copy()
        return out

    for worker in (0, 1, 2, 0, 1):
        lead.ask(worker, 0, 10.0 * (worker + 1), 4.0)
    copy(whole=True)
    for _ in range(20):
        for worker in (0, 1, 2):
            lead.ask(worker, lead.at[worker], 10.0 * (worker + 1), 4.0)
            delta = copy()
            assert [len(h) for h in delta["handed"]] == [int(w == worker) for w in range(3)]
    assert len(json.dumps(delta)) * 5 < len(json.dumps(lead.copy())), "a few chunks, not all"
    lead.give_back(1, 3, -1)   # worker 1 died, 3 of its chunks done
    assert copy()["handed_from"][1] == 3
    lead.rejoin(1, lead.at[1])
    assert copy()["handed_from"][1] == 0
    for worker in (0, 1, 2, 0):
        assert standby.ask(worker, lead.at[worker], 5.0, 4.0) == \
            lead.ask(worker, lead.at[worker], 5.0, 4.0)


@pytest.mark.parametrize("field, value, says", [
    ("total", 999, "total: 999 rows, not 1000"),
    ("taken", [0], "taken: [0] for 2 epochs of 1000 rows"),
    ("handed", [[], [], [[0, 0, 10]]], "handed: 3 entries for 2 workers"),
    ("handed", [[[5, 0, 10]], []], "handed: a span outside 2 epochs of 1000 rows"),
    ("returned", [[0, 20, 10]], "returned: a span outside"),
    ("speed", [1.0, "fast"], "could not convert string to float"),
    ("out", [7], "out: [7] for 2 workers"),
    ("at", None, "not a hand-out: TypeError"),
    ("handed_from", [2, 0], "handed_from: [2, 0], past the chunks held here ([1, 0])"),
    ("handed_from", [0], "handed_from: 1 entries for 2 workers"),
])
def test_a_damaged_copy_of_the_hand_out_is_refused_naming_the_field(field, value, says):
    b = Balance(1000, 2, 2, batch=10)
    b.ask(0, 0, 0.0)
    before = b.copy()
    damaged = dict(before, **{field: value})
    with pytest.raises(ValueError, match=re.escape(says)):
        b.take_copy(damaged)
    assert b.copy() == before   # nothing taken

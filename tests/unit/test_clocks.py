"""Server-side vector clocks."""
import numpy as np

from mpips.wire.clocks import FINISHED, ClockTable


def test_bsp_waits_for_the_slowest_worker():
    c = ClockTable(3, staleness=0)
    assert c.may_read(0, int(c.done[0]))
    c.tick(0)
    assert not c.may_read(0, int(c.done[0])), "worker 0 at clock 1; workers 1 and 2 have not finished clock 0"
    c.tick(1)
    assert not c.may_read(0, int(c.done[0]))
    c.tick(2)
    assert c.may_read(0, int(c.done[0])) and c.may_read(1, int(c.done[1]))


def test_ssp_lets_the_fastest_run_s_clocks_ahead():
    c = ClockTable(2, staleness=2)
    for clock in range(1, 4):
        c.tick(0)
        assert c.may_read(0, int(c.done[0])) == (clock <= 2), clock
    c.tick(1)
    assert c.may_read(0, int(c.done[0]))


def test_asp_never_waits():
    c = ClockTable(2, staleness=None)
    for _ in range(100):
        c.tick(0)
    assert c.may_read(0, int(c.done[0]))
    assert c.record_read(0) == 0 and c.max_gap == 100


def test_finished_workers_do_not_hold_back_the_others():
    c = ClockTable(2, staleness=0)
    c.tick(0)
    c.finish(1)
    assert c.may_read(0, int(c.done[0]))
    c.tick(0)
    assert c.may_read(0, int(c.done[0]))
    c.finish(0)
    assert c.all_finished


def test_max_gap_is_to_the_slowest_unfinished_worker():
    c = ClockTable(3, staleness=None)
    for _ in range(3):
        c.tick(0)
    c.tick(1)
    assert c.record_read(0) == 0 and c.max_gap == 3
    c.finish(2)
    assert c.record_read(0) == 1 and c.max_gap == 3
    c.finish(0)
    c.finish(1)
    c.record_read(0)
    assert c.max_gap == 3, "reads by finished workers do not count"


def test_a_clock_after_finish_is_a_protocol_error():
    import pytest

    from mpips.base.errors import ProtocolError
    c = ClockTable(2, staleness=0)
    c.finish(0)
    with pytest.raises(ProtocolError, match="worker 0 completed a clock after it said FINISH"):
        c.tick(0)


def test_a_read_for_the_next_clock_waits_for_the_readers_own_push():
    c = ClockTable(2, staleness=None)
    clock = c.read_clock(0, next_clock=True)
    assert clock == 1 and not c.may_read(0, clock), "even ASP: its own push comes first"
    c.tick(0)
    assert c.may_read(0, clock)
    bsp = ClockTable(2, staleness=0)
    clock = bsp.read_clock(0, next_clock=True)
    bsp.tick(0)
    assert not bsp.may_read(0, clock), "BSP: and every other worker's clock 0"
    bsp.tick(1)
    assert bsp.may_read(0, clock)


def test_a_finished_worker_reads_the_final_model():
    """After FINISH a worker scores with the final model: every worker's last pushes, which
    may still be on their way (a worker with fewer clocks finishes first), must be in."""
    for staleness in (0, 1, None):
        c = ClockTable(2, staleness=staleness)
        c.tick(0)
        c.tick(0)
        c.finish(0)               # worker 0 completed clocks 0 and 1, then finished
        c.tick(1)
        c.tick(1)
        c.tick(1)
        assert not c.may_read(0, FINISHED), "worker 1 has not finished: its last push may come"
        c.finish(1)
        assert c.may_read(0, FINISHED) and c.may_read(1, FINISHED)


def test_a_finished_worker_reads_once_every_server_holds_the_last_clocks():
    """Hot BSP (`commit`): a clock is applied here only once the other servers hold it too.
    Every worker may have finished here while another server has not yet said it holds their
    last clocks: a read for scoring then waits, or it would score a model short of them."""
    c = ClockTable(2, staleness=0)
    c.commit([1])
    for w in (0, 1):
        c.tick(w)
        c.finish(w)
    assert c.all_finished
    assert not c.may_read(0, FINISHED), "server 1 has not said it holds clock 0"
    c.have(1, 1)
    assert not c.may_read(0, FINISHED), "server 1 holds clock 0 but has not seen FINISH"
    c.have(1, FINISHED)
    assert c.may_read(0, FINISHED) and c.may_read(1, FINISHED)


def test_slowest_kept_as_clocks_move_matches_the_table():
    """here() and slowest() are kept between changes (a count of workers at the slowest):
    after any sequence of ticks, finishes, deaths, resumes and other servers' reports they
    equal the table's minimum computed afresh."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 6))
        t = ClockTable(n, 0)
        t.commit([1])
        for _ in range(60):
            w, what = int(rng.integers(n)), int(rng.integers(10))
            if what < 6 and t.done[w] != FINISHED:
                t.tick(w)
            elif what == 6:
                t.finish(w)
            elif what == 7:
                t.worker_gone(w)
            elif what == 8:
                t.resume(w, int(rng.integers(0, 5)))
            else:
                t.have(1, int(rng.integers(0, 8)))
            assert t.here() == min(t.done)
            assert t.slowest() == min(min(t.done), t.elsewhere[1])

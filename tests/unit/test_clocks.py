"""Server-side vector clocks."""
from mpips.clocks import ClockTable


def test_bsp_waits_for_the_slowest_worker():
    c = ClockTable(3, staleness=0)
    assert c.may_read(0) and not c.may_read(1)
    c.tick(0)
    c.tick(1)
    assert not c.may_read(1), "worker 2 has not finished clock 0"
    c.tick(2)
    assert c.may_read(1) and not c.may_read(2)


def test_finished_workers_do_not_hold_others_back():
    c = ClockTable(2, staleness=0)
    c.tick(0)
    c.finish(1)
    assert c.may_read(1) and not c.may_read(2)
    c.finish(0)
    assert c.all_finished and c.may_read(10**9)


def test_staleness_and_async():
    ssp = ClockTable(2, staleness=2)
    assert ssp.may_read(2) and not ssp.may_read(3)
    asp = ClockTable(2, staleness=None)
    assert asp.may_read(10**6)


def test_max_gap_ignores_finished_workers():
    c = ClockTable(2, staleness=None)
    for _ in range(3):
        c.tick(0)
    c.record_read(3)
    assert c.max_gap == 3
    c.finish(1)
    c.record_read(5)
    assert c.max_gap == 3, "worker 1 finished: the gap is to worker 0, which is at clock 3"
    c.finish(0)
    c.record_read(100)
    assert c.max_gap == 3

"""A wait's polling: its first `busy` polls follow each other at once, then it yields the
core for the first `spin` seconds, then sleeps from `first` doubling up to `longest`, and
once it has lasted `patient_after`, up to `patient_longest`."""
from mpips.ranks import bounded


def rounds(monkeypatch, n: int, step: float, busy: int = 0) -> tuple:
    """(the sleeps, the yields) of n rounds of one wait, the clock going `step` a round."""
    now, sleeps, yields = [0.0], [], []
    monkeypatch.setattr(bounded.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(bounded.time, "sleep", sleeps.append)
    monkeypatch.setattr(bounded.os, "sched_yield", lambda: yields.append(now[0]))
    backoff = bounded.Backoff(busy=busy, spin=0.002, first=5e-5, longest=2e-4,
                              patient_after=0.05, patient_longest=1e-3)
    for _ in range(n):
        backoff.idle()
        now[0] += step
    return sleeps, yields


def test_it_yields_then_sleeps_doubling_up_to_longest(monkeypatch):
    sleeps, yields = rounds(monkeypatch, 8, 0.001)
    assert len(yields) == 2   # at 0 and 1 ms: within the 2 ms of spin
    assert sleeps == [5e-5, 1e-4, 2e-4, 2e-4, 2e-4, 2e-4]


def test_a_wait_past_patient_after_sleeps_up_to_patient_longest(monkeypatch):
    sleeps, _ = rounds(monkeypatch, 40, 0.002)
    before = sleeps[:23]   # the rounds from 2 ms to 46 ms
    assert max(before) == 2e-4
    assert sleeps[-1] == 1e-3 and max(sleeps) == 1e-3


def test_reset_starts_a_new_wait(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(bounded.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(bounded.time, "sleep", lambda s: None)
    yielded = []
    monkeypatch.setattr(bounded.os, "sched_yield", lambda: yielded.append(now[0]))
    backoff = bounded.Backoff(busy=0)
    now[0] = 0.0
    backoff.idle()
    now[0] = 1.0
    backoff.idle()   # a second into the wait: no yield
    backoff.reset()
    backoff.idle()   # a new wait: yields again
    assert yielded == [0.0, 1.0]


def test_the_first_polls_of_a_wait_neither_yield_nor_sleep(monkeypatch):
    """A reply due in microseconds is polled for at once: `busy` polls before the first
    yield, and again after a reset."""
    now, calls = [0.0], []
    monkeypatch.setattr(bounded.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(bounded.time, "sleep", lambda s: calls.append(("sleep", s)))
    monkeypatch.setattr(bounded.os, "sched_yield", lambda: calls.append(("yield", now[0])))
    backoff = bounded.Backoff(busy=3)
    for _ in range(3):
        assert backoff.eager()
        backoff.idle()
    assert calls == [] and not backoff.eager()
    backoff.idle()
    assert calls == [("yield", 0.0)]
    backoff.reset()
    assert backoff.eager()
    for _ in range(3):
        backoff.idle()
    assert calls == [("yield", 0.0)]
    sleeps, yields = rounds(monkeypatch, 12, 0.001, busy=4)
    assert len(yields) == 2 and len(sleeps) == 6, "the busy polls come first, then as before"

"""The lead's progress lines: a run of any length shows the first tenth of an epoch, then a
line at most twice a second (or every --log-every seconds), and the final line."""
from types import SimpleNamespace

import pytest

from mpips.server import progress
from mpips.wire.position import Position


@pytest.fixture
def said(monkeypatch) -> list:
    lines: list = []
    monkeypatch.setattr(progress, "say", lines.append)
    return lines


@pytest.fixture
def clock(monkeypatch) -> list:
    """The lead's clock, which the test moves: [seconds]."""
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    return now


def header(examples: int, done: float) -> SimpleNamespace:
    return SimpleNamespace(examples=examples, loss=0.5 * examples, progress=done)


def test_a_run_shorter_than_half_a_second_shows_its_first_tenth_then_its_end(said, clock):
    p = progress.Progress(n_workers=2, epochs=1, every=5.0)
    for step in range(1, 101):   # the whole epoch in 0.2 s
        clock[0] += 0.002
        for worker in (0, 1):
            p.update(worker, header(10 * step, step / 100))
    p.log(final=True)
    assert [line.split("  ")[0] for line in said] == ["training: epoch 0.10/1",
                                                      "trained: epoch 1.00/1"], said


def test_no_line_before_a_tenth_nor_a_second_tenth_within_half_a_second(said, clock):
    p = progress.Progress(n_workers=1, epochs=2, every=5.0)
    p.update(0, header(5, 0.05))
    assert said == []
    clock[0] += 0.1
    p.update(0, header(30, 0.3))
    clock[0] += 0.1
    p.update(0, header(50, 0.5))
    assert len(said) == 1 and said[0].startswith("training: epoch 0.30/2"), said
    clock[0] += 0.5
    p.update(0, header(60, 0.6))
    assert len(said) == 2 and said[1].startswith("training: epoch 0.60/2"), said


def test_a_resumed_run_says_its_first_line_once_every_worker_has_said_where_it_is(said, clock):
    p = progress.Progress(n_workers=2, epochs=3, every=5.0)
    p.start({0: Position(10, examples=100, loss=50.0), 1: Position(10, examples=100, loss=50.0)})
    clock[0] += 0.01
    p.update(0, header(110, 1.5))
    assert said == [], "worker 1 has not said where it is: the mean would be 0.75"
    p.update(1, header(110, 1.5))
    assert len(said) == 1 and said[0].startswith("training: epoch 1.50/3"), said


def test_a_worker_on_the_lead_only_keeps_figures_without_lines(said, clock):
    p = progress.Progress(n_workers=1, epochs=1, every=5.0)
    p.update(0, header(50, 0.5), say=False)
    assert said == [] and p.examples[0] == 50

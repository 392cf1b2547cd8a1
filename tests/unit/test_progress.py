"""The lead's progress lines: a run of any length shows the first tenth of an epoch, then a
line at most twice a second (or every --log-every seconds), and the final line."""
from types import SimpleNamespace

import pytest

from mpips.server import progress


@pytest.fixture
def said(monkeypatch) -> list:
    lines: list = []
    monkeypatch.setattr(progress, "say", lines.append)
    return lines


def header(examples: int, done: float) -> SimpleNamespace:
    return SimpleNamespace(examples=examples, loss=0.5 * examples, progress=done)


def test_a_run_shorter_than_half_a_second_shows_its_first_tenth_then_its_end(said):
    p = progress.Progress(n_workers=2, epochs=1, every=5.0)
    for step in range(1, 101):   # the whole epoch at once: no half second between updates
        for worker in (0, 1):
            p.update(worker, header(10 * step, step / 100))
    p.log(final=True)
    assert [line.split("  ")[0] for line in said] == ["training: epoch 0.10/1",
                                                      "trained: epoch 1.00/1"], said


def test_no_line_before_a_tenth_nor_a_second_tenth_within_half_a_second(said):
    p = progress.Progress(n_workers=1, epochs=2, every=5.0)
    p.update(0, header(5, 0.05))
    assert said == []
    p.update(0, header(30, 0.3))
    p.update(0, header(50, 0.5))
    assert len(said) == 1 and said[0].startswith("training: epoch 0.30/2"), said


def test_a_worker_on_the_lead_only_keeps_figures_without_lines(said):
    p = progress.Progress(n_workers=1, epochs=1, every=5.0)
    p.update(0, header(50, 0.5), say=False)
    assert said == [] and p.examples[0] == 50

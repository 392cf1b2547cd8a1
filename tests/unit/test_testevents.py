"""Events at a point of a job (mpips.run.testevents), the testing aid the job tests use: what is
accepted, what is refused and why, and that each event fires once, at its point, on the rank
it names."""
import os
import re
import signal

import pytest

from mpips.run import testevents
from mpips.run.testevents import Event, EventError, Events, check, parse


@pytest.mark.parametrize("text, event", [
    ("kill rank 1 at clock 30", Event("kill rank 1 at clock 30", "kill", "clock", 30, rank=1)),
    ("freeze  rank 3 for 2.5 s at epoch 2",
     Event("freeze  rank 3 for 2.5 s at epoch 2", "freeze", "epoch", 2, rank=3, seconds=2.5)),
    ("stop rank 0 at checkpoint 1", Event("stop rank 0 at checkpoint 1", "stop", "checkpoint", 1,
                                          rank=0)),
    ("term rank 4 at scoring", Event("term rank 4 at scoring", "term", "scoring", 0, rank=4)),
    ("kill rank 1 at saving", Event("kill rank 1 at saving", "kill", "saving", 0, rank=1)),
    ("kill rank 0 at summary", Event("kill rank 0 at summary", "kill", "summary", 0, rank=0)),
    ("freeze rank 1 at move 1", Event("freeze rank 1 at move 1", "freeze", "move", 1, rank=1)),
    ("pause rank 2 until /tmp/go at clock 5",
     Event("pause rank 2 until /tmp/go at clock 5", "pause", "clock", 5, rank=2, file="/tmp/go")),
    ("ctl remove-server 0 at clock 40",
     Event("ctl remove-server 0 at clock 40", "ctl", "clock", 40, command="remove-server",
           target=0)),
    ("kill ranks 1,2 at checkpoint 2",
     Event("kill ranks 1,2 at checkpoint 2", "kill", "checkpoint", 2, rank=1, together=(2,))),
    ("ctl add-server at clock 9", Event("ctl add-server at clock 9", "ctl", "clock", 9,
                                        command="add-server")),
])
def test_events_are_read_as_written(text, event):
    assert parse(text) == event


@pytest.mark.parametrize("text, says", [
    ("kill rank one at clock 3", "expected ACTION at POINT"),
    ("kill rank 1", "expected ACTION at POINT"),
    ("kill rank 1 at clock", "'clock' needs a number"),
    ("kill rank 1 at scoring 3", "'scoring' takes no number"),
    ("kill rank 1 at saving 1", "'saving' takes no number"),
    ("kill rank 0 at summary 2", "'summary' takes no number"),
    ("kill rank 1 for 3 s at clock 3", "only a freeze lasts"),
    ("ctl dance at clock 3", "ctl dance is not one of status, add-server"),
    ("ctl add-server at epoch 3", "a ctl request comes at a clock"),
    ("kill ranks 1,1 at clock 3", "a rank named twice"),
    ("kill ranks 1 at clock 3", "expected ACTION at POINT"),
])
def test_a_malformed_event_is_refused_saying_why(text, says):
    with pytest.raises(EventError, match=re.escape(says)):
        parse(text)


@pytest.fixture
def allowed(monkeypatch):
    monkeypatch.setenv(testevents.ENABLE, "1")


@pytest.mark.parametrize("text, full_batch, says", [
    ("kill rank 5 at clock 3", False, "there is no rank 5 (ranks 0-4)"),
    ("kill rank 1 at epoch 3", False, "rank 1 is a server, which has no epochs"),
    ("kill rank 3 at checkpoint 1", False, "only servers write checkpoints"),
    ("kill rank 3 at saving", False, "only servers save the model"),
    ("freeze rank 3 at move 1", False, "only servers are asked about a move"),
    ("pause rank 0 until /tmp/x at clock 3", False, "only a worker pauses"),
    ("kill rank 1 at iteration 3", False, "iterations are --solver lbfgs's"),
    ("kill rank 1 at clock 3", True, "a full-batch job counts iterations"),
    ("kill ranks 1,5 at clock 3", False, "there is no rank 5 (ranks 0-4)"),
    ("kill ranks 1,2 at clock 3", False, "all servers or all workers"),
    ("kill ranks 0,1 at writing 1", False, "at a point each of them reaches itself"),
])
def test_an_event_the_job_cannot_reach_is_refused(allowed, text, full_batch, says):
    with pytest.raises(EventError, match=re.escape(says)):
        check((text,), n_ranks=5, n_servers=2, full_batch=full_batch)


def test_events_are_refused_unless_the_environment_allows_them(monkeypatch):
    monkeypatch.delenv(testevents.ENABLE, raising=False)
    with pytest.raises(EventError, match="a testing aid for mpips's own tests: set "
                                         "MPIPS_TESTING=1"):
        check(("kill rank 1 at clock 3",), 5, 2, False)
    check((), 5, 2, False)   # no event: nothing to allow


@pytest.fixture
def signalled(monkeypatch):
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum)))
    return sent


def test_an_event_fires_once_at_its_point_on_its_own_rank(signalled):
    events = Events(["kill rank 1 at clock 30", "stop rank 2 at clock 3", "term rank 1 at scoring"],
                    rank=1, server=True)
    assert [e.text for e in events.pending] == ["kill rank 1 at clock 30", "term rank 1 at scoring"]
    events.reached("clock", 29)
    events.reached("epoch", 30)
    assert signalled == []
    events.reached("clock", 31)    # a server's clock may jump past the point: it fires then
    events.reached("clock", 32)
    assert signalled == [(os.getpid(), signal.SIGKILL)]
    events.reached("scoring")
    assert signalled[-1] == (os.getpid(), signal.SIGTERM) and not events.pending
    assert events.fired == ["kill rank 1 at clock 30", "term rank 1 at scoring"]


def test_a_server_is_killed_as_it_is_about_to_save_the_model(signalled):
    events = Events(["kill rank 1 at saving"], rank=1, server=True)
    events.reached("scoring")
    assert signalled == []
    events.reached("saving")
    assert signalled == [(os.getpid(), signal.SIGKILL)] and not events.pending


def test_the_driver_signals_another_rank_by_its_process_id(signalled):
    events = Events(["kill rank 1 at iteration 5"], rank=2, server=False, pids={1: 4242},
                    driver=True)
    events.reached("iteration", 5)
    assert signalled == [(4242, signal.SIGKILL)]
    elsewhere = Events(["kill rank 1 at iteration 5"], rank=2, server=False, pids={},
                       driver=True)
    elsewhere.reached("iteration", 5)   # not on this node: said, not done
    assert signalled == [(4242, signal.SIGKILL)]


def test_a_ctl_request_is_made_by_the_lead_alone(tmp_path):
    texts = ["ctl add-server at clock 4"]
    follower = Events(texts, rank=1, server=True, run_dir=str(tmp_path))
    assert follower.reached("clock", 4, lead=False) is False and not follower.pending
    worker = Events(texts, rank=3, server=False, run_dir=str(tmp_path))
    assert not worker.pending
    lead = Events(texts, rank=0, server=True, run_dir=str(tmp_path))
    assert lead.reached("clock", 3, lead=True) is False
    assert lead.reached("clock", 4, lead=True) is True
    [request] = os.listdir(tmp_path / "control")
    assert request.startswith("request-")


def test_a_pause_says_where_it_is_and_waits_for_its_file(tmp_path):
    go = tmp_path / "go"
    events = Events([f"pause rank 2 until {go} at clock 1"], rank=2, timeout=0.3)
    with pytest.raises(Exception, match=f"{go}"):
        events.reached("clock", 1)   # nobody creates the file: bounded
    assert (tmp_path / "go.reached").read_text().startswith("rank 2: pause rank 2")
    go.write_text("")
    Events([f"pause rank 2 until {go} at clock 1"], rank=2, timeout=5).reached("clock", 1)


def test_events_may_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(testevents.FROM_ENVIRONMENT, "kill rank 1 at clock 3;  stop rank 2 at "
                                                   "epoch 1 ;")
    assert testevents.from_environment() == ("kill rank 1 at clock 3", "stop rank 2 at epoch 1")
    monkeypatch.delenv(testevents.FROM_ENVIRONMENT)
    assert testevents.from_environment() == ()


def test_an_event_fires_once_per_run_whatever_the_launches(signalled, tmp_path):
    texts = ["kill rank 1 at clock 3", "stop rank 1 at clock 5"]
    first = Events(texts, rank=1, run_dir=str(tmp_path))
    first.reached("clock", 3)
    assert signalled == [(os.getpid(), signal.SIGKILL)]
    assert (tmp_path / "test-events").is_dir()
    resumed = Events(texts, rank=1, run_dir=str(tmp_path))   # the same options, resumed
    assert [e.text for e in resumed.pending] == ["stop rank 1 at clock 5"]
    resumed.reached("clock", 9)
    assert signalled[-1] == (os.getpid(), signal.SIGUSR1)
    assert not Events(texts, rank=1, run_dir=str(tmp_path)).pending


def test_ranks_killed_together_die_by_the_first_to_reach_the_point(signalled, tmp_path):
    texts = ["kill ranks 1,2 at checkpoint 2"]
    pids = {1: 1111, 2: os.getpid()}
    first = Events(texts, rank=2, server=True, pids=pids, run_dir=str(tmp_path))
    second = Events(texts, rank=1, server=True, pids={1: os.getpid(), 2: 2222},
                    run_dir=str(tmp_path))
    assert first.pending and second.pending and not Events(texts, rank=0, server=True).pending
    first.reached("checkpoint", 1)
    assert signalled == []
    first.reached("checkpoint", 2)
    assert signalled == [(1111, signal.SIGKILL), (os.getpid(), signal.SIGKILL)]
    second.reached("checkpoint", 2)   # already killed by the first: nothing more
    assert len(signalled) == 2 and second.fired == []
    elsewhere = Events(texts, rank=1, server=True, pids={1: os.getpid()})
    elsewhere.reached("checkpoint", 2)   # rank 2 not on this node: said, nobody killed
    assert len(signalled) == 2


def test_a_server_reaching_checkpoint_k_first_waits_for_the_earlier_ones(signalled, tmp_path):
    """Not the lead: its event at checkpoint 2 fires only once checkpoint 1 of this launch is
    complete (its manifest written), whichever server's writer was slow; one complete before
    the launch does not count; the lead fires at once (it completes them)."""
    from mpips.base.errors import WaitTimeout
    from mpips.storage.checkpoint import MANIFEST
    root = tmp_path / "checkpoints"
    (root / "clock-000000000010").mkdir(parents=True)
    (root / "clock-000000000010" / MANIFEST).write_text("{}")   # from an earlier launch
    texts = ["kill rank 1 at checkpoint 2"]
    waiting = Events(texts, rank=1, server=True, timeout=0.3, checkpoints=str(root))
    with pytest.raises(WaitTimeout, match="checkpoint 1 of this launch to be complete"):
        waiting.reached("checkpoint", 2)
    assert signalled == []
    (root / "clock-000000000020").mkdir()
    (root / "clock-000000000020" / MANIFEST).write_text("{}")
    ready = Events(texts, rank=1, server=True, timeout=0.3, checkpoints=str(root))
    assert ready.complete_before == 2
    (root / "clock-000000000030").mkdir()
    (root / "clock-000000000030" / MANIFEST).write_text("{}")
    ready.reached("checkpoint", 2)
    assert signalled == [(os.getpid(), signal.SIGKILL)]
    lead = Events(["kill rank 0 at checkpoint 3"], rank=0, server=True, timeout=0.3,
                  checkpoints=str(root))
    lead.reached("checkpoint", 3, lead=True)
    assert signalled[-1] == (os.getpid(), signal.SIGKILL)

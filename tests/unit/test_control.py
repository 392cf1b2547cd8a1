"""The files between `mpips ctl` and the lead server: requests taken once and in order, the
damaged ones and those for another run answered with what is wrong, answers waited for with
a bound."""
import json
import os

import pytest

from mpips.membership import channel as control
from mpips.base.errors import ConfigError, InputError

RUN = "20261127-030000-abc123"


def test_requests_are_taken_oldest_first_and_once(tmp_path):
    first = control.submit(str(tmp_path), "add-server", None, RUN)
    second = control.submit(str(tmp_path), "remove-server", 3, RUN)
    assert first < second
    taken = control.take(str(tmp_path), RUN)
    assert (taken["id"], taken["command"], taken["target"]) == (first, "add-server", None)
    assert control.take(str(tmp_path), RUN)["target"] == 3
    assert control.take(str(tmp_path), RUN) is None
    assert sorted(os.listdir(tmp_path / "control")) == [f"taken-{first}.json",
                                                        f"taken-{second}.json"]


@pytest.mark.parametrize("text, says", [
    ("{not json", "not a request mpips ctl wrote"),
    ('["add-server"]', "not a JSON object"),
    ('{"command": "format-disk"}', "field 'command' is 'format-disk'"),
    ('{"command": "remove-server", "target": -1}', "field 'target' is -1"),
    ('{"command": "remove-server", "target": true}', "field 'target' is True"),
])
def test_a_damaged_request_is_answered_naming_the_file_and_field(tmp_path, text, says):
    os.makedirs(tmp_path / "control")
    (tmp_path / "control" / "request-x.json").write_text(text)
    taken = control.take(str(tmp_path), RUN)
    assert taken["id"] == "x" and "request-x.json" in taken["error"] and says in taken["error"]


def test_a_request_for_another_run_is_answered_as_discarded_and_never_carried_out(tmp_path):
    """A request left from an earlier job in the same directory (it timed out, then the run
    was overwritten), or one without a run: the new run's lead discards it, saying why."""
    stale = control.submit(str(tmp_path), "remove-server", 0, "20261126-010000-0ld000")
    os.makedirs(tmp_path / "control", exist_ok=True)
    (tmp_path / "control" / "request-0-y.json").write_text('{"command": "add-server"}')
    mine = control.submit(str(tmp_path), "status", None, RUN)
    unnamed = control.take(str(tmp_path), RUN)
    assert unnamed["id"] == "0-y" and "a request for run None" in unnamed["error"], unnamed
    taken = control.take(str(tmp_path), RUN)
    assert taken["id"] == stale and "not for this run" in taken["error"], taken
    assert "'20261126-010000-0ld000'" in taken["error"] and "discarded" in taken["error"]
    assert control.take(str(tmp_path), RUN)["id"] == mine


def test_an_unknown_command_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="unknown ctl command 'grow'"):
        control.submit(str(tmp_path), "grow", None, RUN)
    assert not os.path.exists(tmp_path / "control")


def test_an_answer_is_waited_for_with_a_bound_and_the_jobs_end_noticed(tmp_path):
    ident = control.submit(str(tmp_path), "status", None, RUN)
    with pytest.raises(InputError, match="has not taken it yet"):
        control.wait_answer(str(tmp_path), ident, timeout=0.2)
    with pytest.raises(InputError, match="ended before answering"):
        control.wait_answer(str(tmp_path), ident, timeout=5, running=lambda: False)
    control.take(str(tmp_path), RUN)
    control.answer(str(tmp_path), ident, {"ok": True, "moves": 0})
    assert control.wait_answer(str(tmp_path), ident, timeout=1) == {"id": ident, "ok": True,
                                                                    "moves": 0}
    with open(tmp_path / "control" / f"answer-{ident}.json") as f:
        assert json.load(f)["ok"]


def test_ctl_prints_what_moved_and_what_was_refused():
    from mpips.cli.ctl import describe
    moved = {"ok": True, "command": "remove-server", "target": 0, "clock": 300, "version": 2,
             "ranges_moved": 5, "fraction_moved": 0.3125, "keys_moved": 608, "seconds": 0.01,
             "copy_s": 0.006, "paused_s": 0.004, "ranges_before": {"0": 5, "1": 6, "2": 5},
             "ranges_after": {"0": 0, "1": 8, "2": 8}}
    text = describe(moved)
    assert text.startswith("remove-server 0 done at clock 300 (placement version 2): 5 key "
                           "range(s) moved (31.2% of the keys), 608 keys copied in 0.01 s "
                           "while training went on, 0.01 s in all; training waited 0.00 s for "
                           "the switch")
    assert text.endswith("ranges per server: 0: 5 -> 0, 1: 6 -> 8, 2: 5 -> 8")
    assert describe({"ok": False, "error": "no spare"}) == "refused: no spare"
    status = {"ok": True, "placement_version": 0, "replicas": 1, "ranges": 4, "moves": 0,
              "servers": [{"server": 0, "rank": 0, "ranges": 4, "state": "owner"},
                          {"server": 1, "rank": 1, "ranges": 0, "state": "spare"}],
              "workers": [{"worker": 0, "rank": 2, "clock": "finished"}]}
    assert describe(status).splitlines() == [
        "placement version 0: 4 key ranges, 1 copy of each; 0 move(s) so far",
        "  server 0 (rank 0): owner, 4 range(s)", "  server 1 (rank 1): spare, 0 range(s)",
        "  worker 0 (rank 2): clock finished"]


def test_ctl_prints_where_a_joining_workers_rows_come_from():
    from mpips.cli.ctl import describe
    joined = {"ok": True, "command": "add-worker", "target": 2, "clock": 42, "seconds": 0.5}
    assert describe(dict(joined, **{"from": [0, 1]})) == (
        "add-worker 2 done: it trains again from clock 42, with a share of the rows left of "
        "worker(s) 0, 1 (0.50 s after the request)")
    assert describe(dict(joined, **{"from": []})) == (
        "add-worker 2 done: it trains again from clock 42, asking for chunks of the rows left "
        "(--balance dynamic) (0.50 s after the request)")


def test_ctl_prints_where_a_leaving_workers_rows_go():
    from mpips.cli.ctl import describe
    left = {"ok": True, "command": "remove-worker", "target": 1, "clock": 20, "seconds": 0.25,
            "from_epoch": 0, "handed_to": []}
    assert describe(dict(left, handed_to=[0, 2])).endswith(
        "its rows left from epoch 0 go to worker(s) 0, 2")
    assert describe(dict(left, chunks_back=True)).endswith(
        "its chunks left go to the next workers that ask (--balance dynamic)")
    assert describe(dict(left, chunks_back=False)).endswith("it had trained all its rows")

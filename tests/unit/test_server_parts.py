"""The server's concerns as state machines, without MPI: the read gate, the row cache, BSP's
push buffer, checkpoint coordination and the stop protocol; and how the server's modules reach
each other."""

import time
from types import SimpleNamespace

import numpy as np
import pytest

from mpips.base.errors import CheckpointsFailing, ProtocolError
from mpips.server.checkpoint_clocks import FAILURES_IN_A_ROW, Checkpoints, Standing
from mpips.wire.position import Position
from mpips.server.context import ServerContext
from mpips.server.pushes import ClockPushes
from mpips.server.readgate import HOLD, REFUSE, SERVE, Pull, ReadGate
from mpips.server.rowcache import KEEP, RowCache
from mpips.server.table_snapshot import BUSY_SPAN_S, WRITER_CHECK_S
from mpips.wire import protocol
from mpips.wire.clocks import FINISHED, ClockTable
from mpips.wire.placement import Switch
from mpips.wire.protocol import Op, Report

KEYS = np.arange(4, dtype=np.uint64)


def pull(worker, ts=1):
    return Pull(worker, source=10 + worker, ts=ts, keys=KEYS, insert=True)


class Clock:
    """time.monotonic, moved by hand."""
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_gate_holds_a_bsp_read_until_every_worker_has_completed_the_clock(monkeypatch):
    now = Clock()
    monkeypatch.setattr("mpips.server.readgate.time.monotonic", now)
    clocks = ClockTable(2, staleness=0)
    gate = ReadGate(clocks, record=True)
    clocks.tick(0)
    ahead = pull(0)
    assert gate.arrive(ahead, next_clock=False) == HOLD
    assert ahead.owned and ahead.keys is not KEYS, "a held pull keeps its own keys"
    assert gate.release() == ([], []) and gate.pulls_held == 1
    now.now += 2.5   # worker 1 completes the clock 2.5 s later
    clocks.tick(1)
    serve, refuse = gate.release()
    assert serve == [ahead] and refuse == [] and not gate.held
    gate.served(ahead)
    record = gate.pull_records()
    assert record["worker"].tolist() == [0] and record["clock"].tolist() == [1]
    assert record["slowest"].tolist() == [1]
    assert gate.held_s.tolist() == [2.5, 0.0] and record["held_s"].tolist() == [2.5], \
        "the time it was held, counted to the worker it held"


def test_a_read_sent_ahead_waits_for_its_own_push_without_counting_as_held():
    clocks = ClockTable(2, staleness=0)
    gate = ReadGate(clocks)
    early = pull(0)
    assert gate.arrive(early, next_clock=True) == HOLD and early.clock == 1
    assert gate.pulls_held == 0 and early.since is None, "pipelining, not a consistency wait"
    clocks.tick(0)
    gate.release()
    assert gate.pulls_held == 1 and early.since is not None, "now it waits for worker 1"


def test_a_stopped_gate_refuses_training_reads_and_serves_finished_workers():
    clocks = ClockTable(2, staleness=0)
    gate = ReadGate(clocks)
    clocks.tick(0)
    held = pull(0)
    gate.arrive(held, next_clock=False)
    gate.stopped = True
    assert gate.release() == ([], [held])
    clocks.finish(1)
    assert gate.arrive(pull(1), next_clock=False) == SERVE, "scoring the model as it stands"
    assert gate.arrive(pull(0), next_clock=False) == REFUSE


class EveryVerdict(ReadGate):
    """The gate without release's shortcut: each held pull's verdict made again each time."""
    def _hold_reasons(self) -> tuple:
        return (object(),)   # equal to nothing a pull was held under


def drive(gate: ReadGate, rng: np.random.Generator, steps: int) -> list:
    """Random clocks, finishes, stops, moves and ceilings of 4 workers under BSP, with pulls
    arriving and released after each step: what the gate did, step by step."""
    clocks = gate.clocks
    seen, n = [], 0
    for step in range(steps):
        w = int(rng.integers(4))
        event = rng.choice(["arrive", "tick", "tick", "finish", "stop", "ceiling", "move"],
                           p=[0.4, 0.2, 0.2, 0.02, 0.01, 0.1, 0.07])
        training = clocks.done[w] != FINISHED
        if event == "arrive":
            n += 1
            p = Pull(w, 10 + w, n, KEYS, True, version=int(rng.integers(2)))
            seen.append(("arrive", n, gate.arrive(p, next_clock=bool(rng.integers(2)))))
        elif event == "tick" and training:
            clocks.tick(w)
        elif event == "finish" and training and step > 0.8 * steps:
            clocks.finish(w)
        elif event == "stop" and step > 0.9 * steps:   # (a stopped gate serves no training)
            gate.stopped = True
        elif event == "ceiling":
            gate.ceiling = None if rng.integers(2) else int(rng.integers(clocks.longest + 3))
        elif event == "move":
            gate.moving = Switch(int(rng.integers(clocks.longest + 3)), int(rng.integers(2)))
        serve, refuse = gate.release()
        seen.append(([p.ts for p in serve], [p.ts for p in refuse],
                     [(p.ts, p.since is None) for p in gate.held], gate.pulls_held))
    return seen


@pytest.mark.parametrize("seed", range(6))
def test_a_release_under_bsp_decides_as_if_every_held_pull_were_judged_again(seed):
    """release() passes over a held pull whose reasons to wait have not changed: over random
    clocks, finishes, stops, moves and ceilings it serves, refuses and holds what judging
    every held pull again does, and starts the same waits."""
    shortcut = drive(ReadGate(ClockTable(4, staleness=0)), np.random.default_rng(seed), 3000)
    every = drive(EveryVerdict(ClockTable(4, staleness=0)), np.random.default_rng(seed), 3000)
    assert shortcut == every
    served = sum(len(step[0]) for step in every if len(step) == 4)
    assert served > 200, "the walk served pulls held for the clocks"


def test_the_row_cache_gives_each_pull_to_one_push_and_forgets_old_ones():
    cache = RowCache(2)
    for ts in range(1, KEEP + 2):
        cache.remember(0, ts, KEYS, np.arange(4), generation=7)
    keys, rows, generation = cache.take(0, KEEP + 1, 4)
    assert generation == 7 and (rows == np.arange(4)).all()
    with pytest.raises(ProtocolError, match="pull #1, which this server does not hold"):
        cache.take(0, 1, 4)          # the oldest was forgotten
    with pytest.raises(ProtocolError, match=f"pull #{KEEP + 1}"):
        cache.take(0, KEEP + 1, 4)   # taken already
    with pytest.raises(ProtocolError, match="values for the 3 keys of pull"):
        cache.take(0, 2, 3)


def test_clock_pushes_come_out_in_clock_then_worker_order_whatever_the_arrival():
    buffer = ClockPushes(applied=5)
    for clock, worker in [(6, 1), (5, 1), (6, 0), (5, 0), (7, 0)]:
        buffer.add(clock, worker, (clock, worker))
    assert buffer.until(7) == [(5, 0), (5, 1), (6, 0), (6, 1)]
    assert buffer.applied == 7 and buffer.until(7) == []
    assert buffer.until(8) == [(7, 0)]


def report(epoch, offset=0):
    return Report(epoch=epoch, offset=offset, examples=100 * epoch, loss=1.0, progress=epoch)


class ForgetByScan(Checkpoints):
    """Checkpoints forgetting every clock kept before the one given, looked for one by one."""
    def forget_before(self, clock: int) -> None:
        for c in [c for c in self._history if c < clock]:
            del self._history[c]


@pytest.mark.parametrize("seed", range(4))
def test_positions_kept_by_clock_are_forgotten_whatever_order_the_clocks_came_in(seed):
    """Clocks reached, places given at other clocks (joins, a resume's) and forgetting: each
    worker's position at each clock is what forgetting by a scan of every clock leaves."""
    rng = np.random.default_rng(seed)
    start = {0: Position(3, offset=7), 1: Position(1, offset=8)}   # a resume's places
    ckpts = [Checkpoints(0, 0, 1, bsp=True, positions=start),
             ForgetByScan(0, 0, 1, bsp=True, positions=start)]
    at, floor = [3, 1, 0], 0
    for step in range(600):
        w, event = int(rng.integers(3)), rng.choice(["note", "note", "place", "forget"])
        if event == "note":
            at[w] += 1
            for c in ckpts:
                c.note(w, at[w], report(1, step), False)
        elif event == "place":
            at[w] = max(floor, at[w] + int(rng.integers(-4, 5)))
            for c in ckpts:
                c.place(w, Position(at[w], offset=step))
        else:
            floor = max(floor, min(at) - int(rng.integers(3)))
            for c in ckpts:
                c.forget_before(floor)
        for clock in range(floor, max(at) + 2):
            assert ckpts[0].positions_at(clock) == ckpts[1].positions_at(clock)
            for worker in range(3):
                assert (ckpts[0].position_after(worker, clock)
                        == ckpts[1].position_after(worker, clock))


def test_checkpoints_keep_each_workers_place_by_clock_under_bsp():
    ckpt = Checkpoints(every=10, seconds=0, n_servers=2, bsp=True)
    assert ckpt.due(10) and not ckpt.due(11) and ckpt.periodic
    ckpt.note(0, 10, report(1, 500), finished=False)
    ckpt.note(0, 11, report(1, 600), finished=False)   # worker 0 pushed past clock 10
    ckpt.note(1, 10, report(1, 700), finished=False)
    assert ckpt.positions_at(10) == {
        0: Position(clock=10, epoch=1, segment=0, offset=500, examples=100, loss=1.0),
        1: Position(clock=10, epoch=1, segment=0, offset=700, examples=100, loss=1.0)}
    ckpt.note(1, 11, report(1, 800)._replace(segment=2, taken=2, taken_epoch=1), False)
    assert ckpt.positions_at(11)[1].taken == (1, 1), "two shares taken at epoch 1"
    assert ckpt.positions_at(11)[1].segment == 2
    ckpt.note(1, 12, report(1, 900)._replace(taken=3, taken_epoch=2), False)
    assert ckpt.positions_at(12)[1].taken == (1, 1, 2), "the shares taken before are kept"
    ckpt.forget_before(11)
    assert ckpt.positions_at(10)[0].offset == 600, "forgotten: the latest"
    asp = Checkpoints(every=10, seconds=0, n_servers=1, bsp=False)
    asp.note(0, 10, report(1, 500), False)
    asp.note(0, 11, report(1, 600), False)
    assert asp.positions_at(10)[0].offset == 600, "SSP/ASP: each worker's latest"


def test_a_lost_worker_stays_where_it_died_and_its_later_clocks_are_forgotten():
    ckpt = Checkpoints(every=10, seconds=0, n_servers=1, bsp=True)
    for clock, offset in [(10, 500), (11, 600), (12, 700)]:
        ckpt.note(0, clock, report(1, offset), False)
    place = ckpt.position_after(0, 10)
    assert place.offset == 500
    ckpt.note_lost(0, place)
    assert ckpt.positions[0] == place.but(lost=True)
    assert ckpt.position_after(0, 12) == place, "clocks 11 and 12 were dropped"
    assert ckpt.position_after(1, 7) == Position(7), "a worker never heard of: its start"


def test_server_0_completes_a_checkpoint_once_every_server_reported():
    ckpt = Checkpoints(every=10, seconds=0, n_servers=2, bsp=True)
    assert ckpt.begin(10) and not ckpt.begin(10), "written once"
    assert ckpt.shard_in(10, {"server": 1}) is None, "server 0's own file is still missing"
    shards, standing = ckpt.shard_in(10, {"server": 0}, Standing({0: {"clock": 10}}, {}))
    assert [s["server"] for s in shards] == [1, 0] and standing.positions == {0: {"clock": 10}}
    ckpt.outcome(10, [])
    assert ckpt.completed == {10}
    ckpt.shard_in(20, {"server": 1})
    assert ckpt.incomplete() == [(20, [0])]


def test_checkpoints_failing_in_a_row_stop_and_a_success_resets_the_count():
    ckpt = Checkpoints(every=10, seconds=0, n_servers=1, bsp=True)
    for clock in range(1, FAILURES_IN_A_ROW):
        ckpt.outcome(clock, ["disk full"])
    ckpt.outcome(50, [])
    assert ckpt.failed_in_a_row == 0
    for clock in range(60, 60 + FAILURES_IN_A_ROW - 1):
        ckpt.outcome(clock, ["disk full"])
    with pytest.raises(CheckpointsFailing, match=f"{FAILURES_IN_A_ROW} checkpoints in a row"):
        ckpt.outcome(99, ["disk full"])


def test_timed_checkpoints_named_for_a_passed_clock_are_taken_when_reached():
    ckpt = Checkpoints(every=0, seconds=30, n_servers=2, bsp=True)
    ckpt.planned.update({12, 15})
    assert ckpt.due(12) and ckpt.reached(13) == [12] and ckpt.planned == {15}
    ckpt.stop_at = 20
    assert ckpt.due(20)


def test_an_operation_has_one_handler():
    ctx = ServerContext(SimpleNamespace(index=0), None, None, 1.0, None, None, None)
    ctx.register({Op.PULL: print})
    with pytest.raises(ValueError, match="two handlers of PULL"):
        ctx.register({Op.PULL: repr})


class Sent:
    """An outbox that keeps what would be sent."""
    def __init__(self):
        self.messages = []

    def send(self, buf, dest, tag=None):
        self.messages.append((protocol.header(buf).op, protocol.header(buf).clock, dest))


def stopping_lead(busy: bool = False):

    from mpips.server.context import Hooks
    from mpips.server.stopping import Stopping
    from mpips.wire.placement import Placement
    roles = SimpleNamespace(index=0, servers=[0, 1, 2], workers=[3, 4])
    clocks = ClockTable(2)
    clocks.tick(0), clocks.tick(0), clocks.tick(1)
    ctx = ServerContext(roles, None, clocks, 1.0, Hooks(stop_requested=lambda: True),
                        Placement(3).without({1}), None)
    ctx.outbox = Sent()
    ctx.ckpt = Checkpoints(every=0, seconds=0, n_servers=3, bsp=True)
    ctx.members = SimpleNamespace(busy=busy)
    return ctx, Stopping(ctx)


def test_the_lead_names_the_stop_two_clocks_past_the_slowest_and_tells_the_living():
    ctx, stopping = stopping_lead()
    stopping.poll()
    assert ctx.ckpt.stop_at == 3, "the slowest worker is at clock 1"
    assert ctx.outbox.messages == [(Op.STOP_AT, 3, 2)], "server 1 is dead"


def test_a_stop_waits_for_a_move_to_end():
    ctx, stopping = stopping_lead(busy=True)
    stopping.poll()
    assert stopping.asked and ctx.ckpt.stop_at is None and not ctx.outbox.messages


class FakeWrite:
    """A file being written: done when the test says (`entry`), as a forked writer is."""
    copying = False

    def __init__(self, clock: int):
        self.clock, self.started, self.pid, self.entry = clock, time.monotonic(), 1000 + clock, None
        self.waited = False

    def poll(self):
        return self.entry

    def wait(self, timeout: float):
        self.waited = True
        self.entry = self.entry or {"server": 1, "keys": 1}
        return self.entry

    def stop(self, why: str):
        self.entry = self.entry or {"error": why}
        return self.entry


def writing_server(index: int = 1, servers: int = 2):
    """Server `index` of `servers` (by default server 1 of 2, not the lead), its files
    written by FakeWrite."""
    from mpips.server.checkpoint_rounds import CheckpointRounds
    from mpips.server.context import Hooks
    from mpips.wire.placement import Placement
    files = []

    def write_shard(clock: int, paced: bool = False) -> FakeWrite:
        files.append(FakeWrite(clock))
        return files[-1]

    roles = SimpleNamespace(index=index, servers=list(range(servers)),
                            workers=[servers, servers + 1])
    ctx = ServerContext(roles, None, ClockTable(2), 60.0, Hooks(write_shard=write_shard),
                        Placement(servers), SimpleNamespace(checkpoints=0))
    ctx.outbox = Sent()
    ctx.ckpt = Checkpoints(every=15, seconds=0, n_servers=servers, bsp=True)
    ctx.pushes = SimpleNamespace(apply_backups=lambda: None, buffer=SimpleNamespace(applied=0))
    return ctx, CheckpointRounds(ctx), files


def test_a_file_is_reported_only_once_written_and_one_is_written_at_a_time():
    ctx, rounds, files = writing_server()
    rounds.take(15)
    assert [f.clock for f in files] == [15] and ctx.outbox.messages == [], "state taken, not in"
    rounds.poll(time.monotonic())
    assert ctx.outbox.messages == [] and rounds.ending(), "still written: the loop goes on"
    files[0].entry = {"server": 1, "keys": 5}
    rounds.poll(time.monotonic())
    assert ctx.outbox.messages == [(Op.SHARD_SAVED, 15, 0)] and not rounds.ending()
    assert ctx.stats.checkpoints == 1
    rounds.take(30)
    rounds.take(45)   # due while 30's file is still written: waits for it first
    assert files[1].waited and [f.clock for f in files] == [15, 30, 45]
    assert ctx.outbox.messages[1:] == [(Op.SHARD_SAVED, 30, 0)]


def test_a_table_being_copied_is_polled_within_a_busy_span_then_its_file_less_often():
    """While the state is copied the loop comes back within BUSY_SPAN_S however busy (its
    idle turns copy too: Server._idle); once the writer has it, every WRITER_CHECK_S."""
    ctx, rounds, files = writing_server()
    rounds.take(15)
    files[0].copying = True
    now = time.monotonic()
    rounds.poll(now)
    assert rounds.copying and rounds.next_check == now + BUSY_SPAN_S
    files[0].copying = False
    rounds.poll(now)
    assert not rounds.copying and rounds.next_check == now + WRITER_CHECK_S


def test_a_writer_that_fails_or_outlives_the_timeout_reports_a_failed_file():
    ctx, rounds, files = writing_server()
    rounds.take(15)
    files[0].entry = {"error": "the writer of server-0001.h5 (process 1015) was killed"}
    rounds.poll(time.monotonic())
    rounds.take(30)
    rounds.poll(files[1].started + 61)   # past --timeout (60 s) since it started: stopped
    assert ctx.outbox.messages == [(Op.SHARD_SAVED, 15, 0), (Op.SHARD_SAVED, 30, 0)]
    assert "was not written within --timeout 60 s" in files[1].entry["error"]
    assert ctx.stats.checkpoints == 0


def leading_with_a_hand_out():
    """The lead (one server), --balance dynamic: each of its two workers handed a first chunk
    of an epoch of 1,000 rows; its manifests' (clock, Standing) in a list."""
    from mpips.data.balance import Balance
    from mpips.server.rowhandout import RowHandOut
    ctx, rounds, files = writing_server(index=0, servers=1)
    manifests = []
    ctx.hooks.write_manifest = lambda clock, shards, standing, deaths: manifests.append(
        (clock, standing))
    ctx.handout = RowHandOut(ctx, Balance(1000, 1, 2, 10))
    for worker in (0, 1):
        ctx.handout.balance.ask(worker, 0, 0.0)
    return ctx, rounds, files, manifests


def test_a_manifest_keeps_the_hand_out_as_it_was_at_the_checkpoints_clock():
    """A worker that leaves (or dies) while the files are written gives its chunk back from
    its place then, past the checkpoint's: the manifest keeps the hand-out taken at the clock,
    with the positions, so a resume puts the rows since the clock back to be trained."""
    ctx, rounds, files, manifests = leading_with_a_hand_out()
    at_clock = ctx.handout.state()
    rounds.take(15)
    ctx.handout.worker_gone(1, Position(16, epoch=0, segment=0, offset=6))   # left at clock 16
    assert ctx.handout.state() != at_clock, "the leave gave rows back"
    files[0].entry = {"server": 0, "keys": 5}
    rounds.poll(time.monotonic())
    assert [(clock, standing.handed_out) for clock, standing in manifests] == [(15, at_clock)]


def test_a_checkpoint_without_the_hand_out_is_passed_over(caplog):
    """A server leading since the first lead died does not hold the hand-out (it died with
    that lead): a checkpoint completed then would put the rows back wrongly; none is made."""
    ctx, rounds, files, manifests = leading_with_a_hand_out()
    ctx.handout.led = False
    rounds.take(15)
    files[0].entry = {"server": 0, "keys": 5}
    rounds.poll(time.monotonic())
    assert manifests == [] and "hand-out of the training rows" in caplog.text


def snapshotting_server(snapshot_every=1.0):
    """A server whose learning-curve snapshots are written by FakeWrites (beside the loop)."""
    from mpips.server.context import Hooks
    from mpips.server.timers import Timers
    from mpips.wire.placement import Placement
    files = []

    def snapshot(final: bool):
        if final:
            files.append("final")
            return None
        files.append(FakeWrite(len(files)))
        return files[-1]

    roles = SimpleNamespace(index=0, servers=[0], workers=[1, 2])
    ctx = ServerContext(roles, None, ClockTable(2), 60.0,
                        Hooks(snapshot=snapshot, snapshot_every=snapshot_every),
                        Placement(1), SimpleNamespace(busy_s=0.0, bytes_sent=0,
                                                      bytes_received=0, pushes_applied=0))
    ctx.gate = SimpleNamespace(held_s=np.zeros(2), pulls_held=0)
    timers = Timers(ctx)
    return timers, files


def test_snapshots_are_written_beside_the_loop_none_passed_over(caplog):
    """A snapshot copying makes the loop call at least every BUSY_SPAN_S (and in its idle
    turns); each due snapshot is taken (its
    number is the same moment on every server), at most two written at once (a third waits
    for the oldest, saying so once); a writer that failed is named; the last one waits."""
    timers, files = snapshotting_server(snapshot_every=1000.0)
    t0 = time.monotonic()
    timers.start(t0)
    due, between = t0 + 1000.0, t0 + 500.0   # (the due times follow the real clock)
    timers.tick(due)
    assert len(files) == 1
    files[0].copying = True
    timers.tick(between)
    assert len(files) == 1 and timers.next_at <= time.monotonic() + BUSY_SPAN_S, \
        "called now and then while a copy is made"
    files[0].copying = False
    timers.tick(due)
    assert len(files) == 2 and not files[0].waited, "two at once: the second taken beside"
    timers.tick(due)
    assert len(files) == 3 and files[0].waited, "a third waits for the oldest"
    assert "snapshots come faster than they are written" in caplog.text
    files[1].entry = {"error": "the writer of snapshot 0001 failed"}
    timers.tick(between)
    assert "a snapshot was not written: the writer of snapshot 0001 failed" in caplog.text
    timers.final_snapshot()
    assert files[2].waited and files[-1] == "final"

"""Events at a point of a job: a testing aid, so that a test decides *where* in a job a rank
dies, freezes, is signalled, pauses, or a `ctl` request comes, instead of racing the clock.

    MPIPS_TESTING=1 mpiexec -n 5 python -m mpips train ... --test-event "kill rank 1 at clock 30"

An event is `ACTION at POINT`. Actions (rank N: the MPI rank, servers first):

  kill rank N               SIGKILL (the rank dies)
  kill ranks N,M,...        SIGKILL of them all at once, by the first of them to reach the
                            point (ranks on one node): deaths that no rank can act between
  freeze rank N [for S s]   SIGSTOP (thawed with SIGCONT after S seconds, if given)
  busy rank N for S s       the rank computes for S seconds without calling MPI (as a long
                            compile or parse does)
  stop rank N               SIGUSR1: the job checkpoints and stops, as on Slurm's warning
  term rank N               SIGTERM, as srun delivers it
  pause rank N until FILE   a worker waits there (bounded by --timeout) until FILE exists,
                            having written FILE.reached: the test acts meanwhile
  ctl COMMAND [N]           the lead server makes the request `mpips ctl RUN COMMAND [N]`
                            makes, and takes it at once (only `at clock C`)

Points:

  clock C       a worker: its push completing clock C has been acknowledged; a server: every
                worker has completed clock C here (the clock the server stands at)
  epoch E       a worker, before its first minibatch of epoch E
  checkpoint K  a server: its file of its K-th checkpoint of this launch is written and not
                yet reported, so the checkpoint is not complete; a server other than the lead
                first waits (bounded by --timeout) until the K - 1 before it are complete,
                so that what dies there leaves them, however slow another server's writer
                was (the lead completes them, a full-batch job's driver once every server
                has answered: those cannot wait)
  writing K     a server's K-th checkpoint of this launch, half its file written (under a
                temporary name): the event acts in the process that writes it, the forked
                writer (`kill rank N` kills the writer, `busy rank N` makes it slow), or the
                rank itself with --checkpoint-inline
  reading K     a server's K-th checkpoint of this launch, its resident writer about to read
                the live table in place (not where the table is copied): the event acts in
                the writer, before the server's part is over (`freeze rank N` leaves the
                server logging the rows it changes until its bound)
  iteration I   --solver lbfgs: the driver (worker 0) has finished iteration I; it signals
                rank N by its process id (ranks on its own node only)
  scoring       the rank starts its part of scoring the test file
  saving        a server: training and scoring are over and it is about to write its part of
                the final model (no file of it written yet)
  summary       the rank that writes summary.json (the first of the ranks that finish): every
                rank's figures and test scores are gathered to it and it is about to write
                the run's files (the model is saved)
  move K        a server other than the lead has been asked, for the K-th time in this
                launch, for its figures of a move of key ranges (MOVE_ASK) and has not yet
                answered
  chunk K       a worker starts scoring the K-th chunk of the test file handed to it (its
                part, where the file is not handed out in chunks, is its chunk 1)

A rank acts on itself at the point it observes, so the timing is exact. Every event fired
says so in the log ("test event: ..."), and one that never fired is named at the end: a
test asserts the former. An event fires once per run: it is recorded in
RUN_DIR/test-events/ as it fires, and a resumed launch of the run (a requeued job given the
same options) passes it over. Events may also come from the environment, separated by ";"
(MPIPS_TEST_EVENTS, for job scripts that pass options on as words). Both are refused unless
the environment of the launch sets MPIPS_TESTING=1: a user's job never carries one by
mistake.
"""
import hashlib
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass

log = logging.getLogger("mpips")

ENABLE = "MPIPS_TESTING"
FROM_ENVIRONMENT = "MPIPS_TEST_EVENTS"
RECORDS = "test-events"   # in the run's directory: the events fired so far
SIGNALS = {"kill": signal.SIGKILL, "freeze": signal.SIGSTOP, "stop": signal.SIGUSR1,
           "term": signal.SIGTERM}
POINTS = ("clock", "epoch", "checkpoint", "writing", "reading", "iteration", "scoring",
          "saving", "chunk", "move", "summary")
UNNUMBERED = ("scoring", "saving", "summary")   # points reached once, without a number

_EVENT = re.compile(
    r"^(?:(?P<signal>kill|freeze|stop|term) rank (?P<rank>\d+)(?: for (?P<seconds>[\d.]+) ?s)?"
    r"|kill ranks (?P<ranks>\d+(?:,\d+)+)"
    r"|busy rank (?P<busy>\d+) for (?P<busy_s>[\d.]+) ?s"
    r"|pause rank (?P<paused>\d+) until (?P<file>\S+)"
    r"|ctl (?P<command>[a-z-]+)(?: (?P<target>\d+))?)"
    rf" at (?P<point>{'|'.join(POINTS)})(?: (?P<value>\d+))?$")


class EventError(ValueError):
    pass


@dataclass(frozen=True)
class Event:
    text: str
    action: str            # kill, freeze, stop, term, busy, pause or ctl
    point: str             # one of POINTS
    value: int = 0         # the clock, epoch, checkpoint, iteration or chunk (0: scoring, saving)
    rank: int | None = None        # the rank acted on (None: ctl, the lead's)
    seconds: float | None = None   # freeze: thawed after this long; busy: this long
    file: str | None = None        # pause: waits until it exists
    command: str | None = None     # ctl
    target: int | None = None      # ctl's server or worker
    together: tuple = ()           # kill ranks: the others killed with `rank`

    def ranks(self) -> tuple:
        """The ranks the event acts on (none: ctl)."""
        return () if self.rank is None else (self.rank, *self.together)


def parse(text: str) -> Event:
    """One event from its text; EventError saying what is wrong."""
    m = _EVENT.match(" ".join(text.split()))
    if m is None:
        raise EventError(f"--test-event {text!r}: expected ACTION at POINT, such as 'kill rank 1 "
                         f"at clock 30' (see `python -m mpips.run.testevents`)")
    point, value = m["point"], m["value"]
    if (point in UNNUMBERED) != (value is None):
        raise EventError(f"--test-event {text!r}: '{point}' " + ("takes no number"
                                                               if point in UNNUMBERED else
                                                               "needs a number"))
    value = int(value or 0)
    if m["signal"]:
        seconds = float(m["seconds"]) if m["seconds"] else None
        if seconds is not None and m["signal"] != "freeze":
            raise EventError(f"--test-event {text!r}: only a freeze lasts a number of seconds")
        return Event(text, m["signal"], point, value, rank=int(m["rank"]), seconds=seconds)
    if m["ranks"]:
        ranks = tuple(int(r) for r in m["ranks"].split(","))
        if len(set(ranks)) != len(ranks):
            raise EventError(f"--test-event {text!r}: a rank named twice")
        return Event(text, "kill", point, value, rank=ranks[0], together=ranks[1:])
    if m["busy"]:
        return Event(text, "busy", point, value, rank=int(m["busy"]), seconds=float(m["busy_s"]))
    if m["paused"]:
        return Event(text, "pause", point, value, rank=int(m["paused"]), file=m["file"])
    from ..membership.channel import COMMANDS
    if m["command"] not in COMMANDS:
        raise EventError(f"--test-event {text!r}: ctl {m['command']} is not one of "
                         f"{', '.join(COMMANDS)}")
    if point != "clock":
        raise EventError(f"--test-event {text!r}: a ctl request comes at a clock")
    return Event(text, "ctl", point, value, command=m["command"],
                 target=None if m["target"] is None else int(m["target"]))


def from_environment() -> tuple:
    """The events of MPIPS_TEST_EVENTS ("EVENT; EVENT; ..."), if set."""
    return tuple(t.strip() for t in os.environ.get(FROM_ENVIRONMENT, "").split(";")
                 if t.strip())


def record(run_dir: str, text: str) -> str:
    """Where event `text` is recorded once it fired in the run writing to `run_dir`."""
    name = hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:16]
    return os.path.join(run_dir, RECORDS, f"{name}.fired")


def check(texts, n_ranks: int, n_servers: int, full_batch: bool) -> None:
    """EventError unless every event can happen in a job of these ranks (every rank checks
    the same way), and the environment allows events."""
    if not texts:
        return
    if os.environ.get(ENABLE) != "1":
        raise EventError(f"--test-event is a testing aid for mpips's own tests: set {ENABLE}=1 "
                         f"in the launch's environment to allow it")
    for text in texts:
        e = parse(text)
        for rank in e.ranks():
            if not 0 <= rank < n_ranks:
                raise EventError(f"--test-event {text!r}: there is no rank {rank} (ranks 0-"
                                 f"{n_ranks - 1})")
        if e.together and len({r < n_servers for r in e.ranks()}) > 1:
            raise EventError(f"--test-event {text!r}: ranks killed together are all servers "
                             f"or all workers (they reach the same points)")
        if e.together and e.point in ("iteration", "writing", "reading"):
            raise EventError(f"--test-event {text!r}: ranks are killed together at a point "
                             f"each of them reaches itself")
        server = e.rank is not None and e.rank < n_servers
        if e.point == "iteration" and not full_batch:
            raise EventError(f"--test-event {text!r}: iterations are --solver lbfgs's")
        if full_batch and e.point in ("clock", "epoch"):
            raise EventError(f"--test-event {text!r}: a full-batch job counts iterations")
        if e.point == "epoch" and server:
            raise EventError(f"--test-event {text!r}: rank {e.rank} is a server, which has no "
                             f"epochs: name a clock")
        if e.point == "chunk" and server:
            raise EventError(f"--test-event {text!r}: rank {e.rank} is a server, which is "
                             f"handed no chunks under ULFM: name a worker")
        if e.point in ("checkpoint", "writing", "reading") and not server:
            raise EventError(f"--test-event {text!r}: only servers write checkpoints")
        if e.point == "move" and not server:
            raise EventError(f"--test-event {text!r}: only servers are asked about a move")
        if e.point == "saving" and not server:
            raise EventError(f"--test-event {text!r}: only servers save the model")
        if e.action == "busy" and e.point == "iteration":
            raise EventError(f"--test-event {text!r}: a rank is busy at a point it sees itself")
        if e.action == "pause" and (server or e.point == "iteration"):
            raise EventError(f"--test-event {text!r}: only a worker pauses, at a point it "
                             f"sees itself")


class Events:
    """This rank's events, fired once each as the points are reached."""

    def __init__(self, texts=(), rank: int = 0, server: bool = False, pids: dict | None = None,
                 run_dir: str | None = None, timeout: float = 600.0, driver: bool = False,
                 run_id: str | None = None, checkpoints: str | None = None):
        """`server`: this rank serves (and may lead: ctl requests); `pids`: rank -> process
        id of the ranks on this node (to act on another rank at an iteration); `driver`: this
        rank drives a full-batch solver; `run_id`: the run its ctl requests are for;
        `checkpoints`: the run's checkpoint directory."""
        self.rank, self.pids, self.run_dir, self.timeout = rank, pids or {}, run_dir, timeout
        self.run_id, self.checkpoints = run_id, checkpoints
        events = [parse(t) for t in texts
                  if not (run_dir and os.path.exists(record(run_dir, t)))]   # fired before
        self.pending = [e for e in events
                        if (rank in e.ranks() and e.point != "iteration")
                        or (server and e.action == "ctl")
                        or (driver and e.point == "iteration")]
        # Read once, and only by a rank with an event at a checkpoint (see _earlier_complete).
        self.complete_before = (len(_complete(checkpoints)) if any(
            e.point == "checkpoint" for e in self.pending) else 0)
        self.fired: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.pending)

    def reached(self, point: str, value: int = 0, lead: bool = False) -> bool:
        """The job is at `point` `value` here (`lead`: this server leads). Fires what is due;
        True if a ctl request was made (the lead then takes it at once)."""
        if not self.pending:
            return False
        asked = False
        for e in list(self.pending):
            if e.point != point or value < e.value:
                continue
            self.pending.remove(e)
            if e.action == "ctl":
                if lead:
                    self._ctl(e, value)
                    asked = True
                continue
            if point == "checkpoint" and not lead:
                self._earlier_complete(e, value)
            self._fire(e, value)
        return asked

    def _earlier_complete(self, e: Event, value: int) -> None:
        """Wait until this launch's checkpoints before the `value`-th are complete."""
        from ..ranks.bounded import wait_until
        if not self.checkpoints:
            return
        wanted = self.complete_before + value - 1
        wait_until(lambda: len(_complete(self.checkpoints)) >= wanted, self.timeout,
                   lambda: f"checkpoint {value - 1} of this launch to be complete in "
                           f"{self.checkpoints} before --test-event {e.text!r}")

    def handed_over(self, point: str, value: int) -> None:
        """The events due at `point` `value` fire in another process (a checkpoint's forked
        writer, which has this one's events): not here."""
        self.pending = [e for e in self.pending if e.point != point or value < e.value]

    def _say(self, e: Event, value: int) -> None:
        at = e.point if e.point in UNNUMBERED else f"{e.point} {value}"
        if self.run_dir:
            from ..base.files import write_bytes
            write_bytes(record(self.run_dir, e.text), f"{e.text}\n".encode())
        log.warning("test event: %s (reached %s)", e.text, at)
        self.fired.append(e.text)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()

    def _fire(self, e: Event, value: int) -> None:
        if e.together and self.run_dir and os.path.exists(record(self.run_dir, e.text)):
            return   # another of the ranks killed together reached the point first
        self._say(e, value)
        if e.together:
            self._kill_together(e)
            return
        if e.action == "pause":
            self._pause(e)
            return
        if e.action == "busy":
            assert e.seconds is not None, "parse gives busy its seconds"
            end = time.monotonic() + e.seconds
            while time.monotonic() < end:
                sum(range(10_000))
            return
        pid = os.getpid() if e.rank == self.rank else self.pids.get(e.rank)
        if pid is None:
            log.error("test event %r: rank %d is not on this node", e.text, e.rank)
            return
        if e.seconds is not None:
            # A process of its own thaws the frozen one: nothing in it runs while it is stopped.
            import subprocess
            subprocess.Popen([sys.executable, "-c", f"import os, time; time.sleep({e.seconds}); "
                              f"os.kill({pid}, {int(signal.SIGCONT)})"],
                             start_new_session=True)
        os.kill(pid, SIGNALS[e.action])

    def _kill_together(self, e: Event) -> None:
        missing = [r for r in e.ranks() if r != self.rank and r not in self.pids]
        if missing:
            log.error("test event %r: rank(s) %s are not on this node", e.text, missing)
            return
        for rank in e.ranks():
            if rank != self.rank:
                os.kill(self.pids[rank], signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def _pause(self, e: Event) -> None:
        from ..base.files import write_bytes
        from ..ranks.bounded import wait_until
        file = e.file
        assert file is not None, "parse gives pause its file"
        write_bytes(file + ".reached", f"rank {self.rank}: {e.text}\n".encode())
        wait_until(lambda: os.path.exists(file), self.timeout,
                   lambda: f"{file} (--test-event {e.text!r})")

    def _ctl(self, e: Event, value: int) -> None:
        from ..membership import channel
        self._say(e, value)
        assert e.command is not None, "parse gives ctl its command"
        assert self.run_dir is not None, "ctl events are armed with the run's directory"
        channel.submit(self.run_dir, e.command, e.target, self.run_id)

    def unfired(self) -> None:
        """At the end: name the events due here that never fired (the job ended first)."""
        for e in self.pending:
            if e.action != "ctl":
                log.warning("test event %r never fired: the job did not reach its point here",
                            e.text)


def _complete(checkpoints: str | None) -> list:
    """The complete checkpoints in `checkpoints` (none if None)."""
    if not checkpoints:
        return []
    from ..storage.checkpoint import complete_checkpoints
    return complete_checkpoints(checkpoints)


_events = Events()


def arm(texts, rank: int, server: bool, pids: dict | None = None, run_dir: str | None = None,
        timeout: float = 600.0, driver: bool = False, run_id: str | None = None,
        checkpoints: str | None = None) -> None:
    """This rank's events for the job (see Events)."""
    global _events
    _events = Events(texts, rank, server, pids, run_dir, timeout, driver, run_id, checkpoints)


def armed() -> bool:
    """Whether any event waits for its point on this rank."""
    return bool(_events)


def reached(point: str, value: int = 0, lead: bool = False) -> bool:
    return _events.reached(point, value, lead)


def handed_over(point: str, value: int) -> None:
    _events.handed_over(point, value)


def unfired() -> None:
    _events.unfired()


if __name__ == "__main__":
    print(__doc__)

"""What a server's handlers may read and do: the state they share (store, clocks, read gate,
checkpoint positions, placement, statistics), the server's parts (outbox, pushes, reads,
checkpoint rounds, stopping, watchdog) and the capabilities added to it (range copies,
takeover, worker losses, membership, scoring, dense tables), and registering the handlers
of operations. The modules that add handlers receive this, never the server's loop;
recovery and membership see it through their own narrower protocols (recovery.context,
membership.context), which this class satisfies.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..wire import messages, tags
from ..wire.placement import Placement
from ..wire.protocol import Op

if TYPE_CHECKING:
    from ..membership.requests import Membership
    from ..ranks.roles import Roles
    from ..recovery.rangecopies import RangeCopies
    from ..recovery.takeover import Takeover
    from ..recovery.workerloss import WorkerLosses
    from ..wire.clocks import ClockTable
    from .checkpoint_clocks import Checkpoints, Standing
    from .checkpoint_rounds import CheckpointRounds
    from .dense_tables import DenseTables
    from .outbox import Outbox
    from .pushes import Pushes
    from .readgate import ReadGate
    from .reads import Reads
    from .rowcache import RowCache
    from .rowhandout import RowHandOut
    from .stopping import Stopping
    from .store import KVStore
    from .watchdog import Watchdog


@dataclass(slots=True)
class ServerStats:
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    pulls_held: int = 0       # pulls that had to wait for other workers' clocks
    train_bytes_sent: int = 0   # bytes sent until every worker had finished training
    push_bytes: int = 0       # bytes of the workers' pushes received
    train_requests: int = 0   # messages received until every worker had finished training
    refound: int = 0          # SAME_KEYS pushes whose rows had moved (the table grew)
    busy_s: float = 0.0       # time spent handling requests (the rest is waiting for them)
    checkpoints: int = 0      # checkpoint files written
    pushes_applied: int = 0   # workers' pushes in this server's store (this launch)
    keys_served: int = 0      # keys of the reads answered (the load the placement gave it)
    test_keys: int = 0        # keys of the test rows read (each batch's distinct keys)
    test_keys_known: int = 0  # of them, the keys the model holds


class ShardWrite(Protocol):
    """A server's file of a checkpoint being written (base.forked: ForkedWrite, or Written,
    done in the loop). Its entry: the manifest's, or {"error": why}."""
    started: float   # time.monotonic() when the state was taken
    pid: int         # the process writing it

    @property
    def copying(self) -> bool: ...              # the state still being copied: poll each turn

    def poll(self) -> dict | None: ...          # the entry once written, else None
    def wait(self, timeout: float) -> dict: ...  # the entry, waiting up to `timeout` s
    def stop(self, why: str) -> dict: ...       # ended now: the entry, {"error": why} if cut


@dataclass
class Hooks:
    """What a server asks of the job around it. Writers report a failure in what they return
    (a checkpoint that could not be written does not stop training by itself)."""
    # clock -> this server's file of the checkpoint at clock, its state taken now
    # a checkpoint's shard: (clock, paced: a periodic one, its write spread out) -> the write
    write_shard: Callable[[int, bool], ShardWrite] | None = None
    # the lead: clock, entries, where the job stood (Standing), deaths -> None, or why it
    # failed
    write_manifest: Callable[[int, list, Standing, list], str | None] | None = None
    # final -> its file's write if beside the loop, else None (written); every snapshot_every s
    snapshot: Callable[[bool], ShardWrite | None] | None = None
    snapshot_every: float = 0.0
    failed: Callable[[str], None] = lambda reason: None   # another rank failed: keep the model
    stop_requested: Callable[[], bool] = lambda: False    # polled by every server
    placement_changed: Callable[[Placement], None] = lambda placement: None   # a server died
    now_leads: Callable[[], None] = lambda: None   # this server leads after the lead died
    # The job reached a point here (testevents): point, value, whether this server leads ->
    # whether a ctl request was made meanwhile. None: no event is armed (see
    # ServerContext.reached).
    reached: Callable[[str, int, bool], bool] | None = None
    # The lead's serving figures as the timeline samples them ({name: value}), for live
    # curves (--tensorboard); None: not wanted.
    sampled: Callable[[dict, bool], None] | None = None


class Scorer(Protocol):
    """What a server asks of its share of the scoring of test rows (job.scoring.Scoring)."""
    def handlers(self) -> dict: ...
    def poll(self) -> bool: ...
    def worker_gone(self, worker: int) -> None: ...
    def servers_gone(self, gone: set, was_lead: bool) -> None: ...
    @property
    def busy(self) -> bool: ...
    @property
    def scoring_here(self) -> bool: ...
    @property
    def waiting_for(self) -> list: ...


class ServerContext:
    # The server's parts and capabilities, set as the server makes them (see server.loop).
    ckpt: Checkpoints
    gate: ReadGate
    rows: RowCache
    outbox: Outbox
    pushes: Pushes
    reads: Reads
    rounds: CheckpointRounds
    stopping: Stopping
    watchdog: Watchdog
    copies: RangeCopies
    members: Membership
    dense: DenseTables

    def __init__(self, roles: Roles, store: KVStore, clocks: ClockTable, timeout: float,
                 hooks: Hooks, placement: Placement, stats: ServerStats):
        self.roles = roles
        self.store = store
        self.clocks = clocks
        self.timeout = timeout
        self.hooks = hooks
        self.placement = placement   # replaced when servers die or key ranges move
        self.stats = stats
        # This server's index, and who leads under which placement: asked several times for
        # every message, so found once per placement (a placement never changes).
        self._index = roles.index
        self._lead_of: tuple[Placement | None, int] = (None, -1)
        self._senders: dict[int, str] = {}   # rank -> how messages name it (see sender)
        self.handlers: dict[Op, Callable] = {}   # Op -> handler(source, request, buf)
        # The capabilities a job may go without (None: absent).
        self.takeover: Takeover | None = None
        self.losses: WorkerLosses | None = None
        self.scoring: Scorer | None = None
        self.handout: RowHandOut | None = None   # the training rows, under --balance dynamic
        # Servers died (the placement already without them): (indices, whether this server
        # led before) -> None. The loop's.
        self.servers_died: Callable[[set, bool], None] = lambda gone, was_lead: None

    def register(self, handlers: dict) -> None:
        """Handle these operations (one handler per operation)."""
        for op, handler in handlers.items():
            if op in self.handlers:
                raise ValueError(f"two handlers of {op.name}")
            self.handlers[op] = handler

    # Who leads, and who else is alive: from the placement.
    def _lead_index(self) -> int:
        placement, lead = self._lead_of
        if placement is not self.placement:
            placement, lead = self.placement, self.placement.lead
            self._lead_of = (placement, lead)
        return lead

    @property
    def lead(self) -> bool:
        return self._index == self._lead_index()

    @property
    def lead_rank(self) -> int:
        return self.roles.servers[self._lead_index()]

    def others(self) -> list:
        """The living servers but this one (indices)."""
        return self.placement.others(self.roles.index)

    def sender(self, source: int) -> str:
        """"worker 1 (rank 3)": how messages name a rank (asked of every request: kept)."""
        name = self._senders.get(source)
        if name is None:
            name = self._senders[source] = (
                f"server {self.roles.servers.index(source)} (rank {source})"
                if source in self.roles.servers else
                f"worker {self.roles.worker_index(source)} (rank {source})")
        return name

    def reached(self, point: str, value: int) -> bool:
        """The job reached `point` `value` here (hooks.reached, if an event is armed);
        whether a ctl request was made meanwhile."""
        reached = self.hooks.reached
        return reached is not None and reached(point, value, self.lead)

    # Messages out (see outbox).
    def send(self, buf, dest: int, tag: int = tags.REQUEST_TAG) -> None:
        self.outbox.send(buf, dest, tag)

    def reply(self, buf, dest: int, ts: int) -> None:
        self.outbox.reply(buf, dest, ts)

    def send_copy(self, buf, server: int) -> None:
        self.outbox.send_copy(buf, server)

    def receive_copy(self, into, server: int, what: str) -> None:
        self.outbox.receive_copy(into, server, what)

    def tell_servers(self, message: messages.StopAt | messages.CheckpointAt) -> None:
        """Every other living server: `message`."""
        buf = message.pack()
        for i in self.others():
            self.send(buf, self.roles.servers[i])

    def forget_ranks(self, ranks: set) -> None:
        """Dead ranks: replies to them are not waited for, nor their BYE."""
        self.outbox.forget(ranks)
        self.watchdog.forget(ranks)

    def final_weights(self, keys):
        """The trained model's weights of `keys` (see reads)."""
        return self.reads.final_weights(keys)

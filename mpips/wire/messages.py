"""One type per control message: what each op's header slots and payload mean.

The header (protocol.Header) is a fixed frame of eight numbers; its last slot, `arg`, means
something different for each op that uses it (a worker, a range, a placement version, a
hand-over's number ...). Code outside the wire never reads or sets it: a sender builds the
op's message and packs it, a handler reads the message back with `of`, and so names every
number it uses. Pulls, pushes, reads and dense operations, the hot path, keep their header
and payload views in protocol; their uses of `arg` are named here (same_keys_of,
same_keys_push) and there (dense_rows). The lead's notices to a worker (on tags.NOTICE_TAG)
are typed in `notices`."""
from typing import NamedTuple

import numpy as np

from . import protocol
from .handover import Handover
from .placement import Placement
from .protocol import HEADER_BYTES, Header, Op


def _ints(buf: np.ndarray) -> np.ndarray:
    return buf[HEADER_BYTES:].view(np.int64)


class Bye(NamedTuple):
    """The sender will send nothing more."""

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.BYE))


class Error(NamedTuple):
    """The sender (a worker or a server) failed, for `reason`: servers save what they hold,
    then acknowledge on tags.ERROR_ACK_TAG."""
    reason: str

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.ERROR), protocol.text(self.reason))

    @staticmethod
    def of(buf: np.ndarray) -> "Error":
        return Error(protocol.text_of(buf))


class Stop(NamedTuple):
    """Any rank to the lead: this rank was asked to stop (a signal); stop the job."""

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.STOP))


class Scored(NamedTuple):
    """A server to the others: it has scored its chunks; it reads no more."""

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.SCORED))


class StopAt(NamedTuple):
    """The lead to the others: write a checkpoint at `clock`, then stop the workers."""
    clock: int

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.STOP_AT, clock=self.clock))

    @staticmethod
    def of(h: Header) -> "StopAt":
        return StopAt(h.clock)


class CheckpointAt(NamedTuple):
    """The lead to the others: write a checkpoint at `clock` (a timed one)."""
    clock: int

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.CHECKPOINT_AT, clock=self.clock))

    @staticmethod
    def of(h: Header) -> "CheckpointAt":
        return CheckpointAt(h.clock)


class Have(NamedTuple):
    """A server to the others (BSP under ULFM): every living worker has completed `clock`
    clocks here."""
    clock: int

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.HAVE, clock=self.clock))

    @staticmethod
    def of(h: Header) -> "Have":
        return Have(h.clock)


class ShardSaved(NamedTuple):
    """A server to the lead: its file of checkpoint `clock`, as JSON text."""
    clock: int
    text: str

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.SHARD_SAVED, clock=self.clock),
                             protocol.text(self.text))

    @staticmethod
    def of(h: Header, buf: np.ndarray) -> "ShardSaved":
        return ShardSaved(h.clock, protocol.text_of(buf))


class Gone(NamedTuple):
    """A server to the others: worker `worker` died; this server holds its pushes of its
    first `clock` clocks."""
    worker: int
    clock: int

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.GONE, clock=self.clock, arg=self.worker))

    @staticmethod
    def of(h: Header) -> "Gone":
        return Gone(h.arg, h.clock)


class Death(NamedTuple):
    """The lead to the others: hand-over number `number`, a dead worker's rows gone to the
    survivors."""
    number: int
    handover: Handover

    def pack(self) -> np.ndarray:
        fields = self.handover.fields()
        return protocol.pack(Header(Op.DEATH, nkeys=fields.shape[0], arg=self.number), fields)

    @staticmethod
    def of(h: Header, buf: np.ndarray) -> "Death":
        """ValueError if the payload holds no hand-over."""
        return Death(h.arg, Handover.of_fields(_ints(buf)))


class Split(NamedTuple):
    """A worker to the lead: it split its rows left with a joining worker (a hand-over whose
    worker is among its survivors)."""
    handover: Handover

    def pack(self) -> np.ndarray:
        fields = self.handover.fields()
        return protocol.pack(Header(Op.SPLIT, nkeys=fields.shape[0]), fields)

    @staticmethod
    def of(buf: np.ndarray) -> "Split":
        """ValueError if the payload holds no hand-over."""
        return Split(Handover.of_fields(_ints(buf)))


class JoinAt(NamedTuple):
    """The lead to the others: worker `worker` trains again from clock `clock`."""
    worker: int
    clock: int

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.JOIN_AT, clock=self.clock, arg=self.worker))

    @staticmethod
    def of(h: Header) -> "JoinAt":
        return JoinAt(h.arg, h.clock)


class MoveAsk(NamedTuple):
    """The lead to the others: say your keys read per range; `hold`: also hold reads past
    the clocks let through so far."""
    hold: bool

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.MOVE_ASK, arg=int(self.hold)))

    @staticmethod
    def of(h: Header) -> "MoveAsk":
        return MoveAsk(bool(h.arg))


class MoveClock(NamedTuple):
    """A server to the lead: the clock past the highest it let a read through for, and its
    keys read per range."""
    clock: int
    load: np.ndarray

    def pack(self) -> np.ndarray:
        load = np.asarray(self.load, np.int64)
        return protocol.pack(Header(Op.MOVE_CLOCK, clock=self.clock, nkeys=load.shape[0]), load)

    @staticmethod
    def of(h: Header, buf: np.ndarray) -> "MoveClock":
        return MoveClock(h.clock, _ints(buf))


class MoveTo(NamedTuple):
    """The lead to the others: the ranges' new owners, one per range (placement `version`):
    copy the ranges to them now."""
    version: int
    owners: np.ndarray

    def pack(self) -> np.ndarray:
        owners = np.asarray(self.owners, np.int64)
        return protocol.pack(Header(Op.MOVE_TO, arg=self.version, nkeys=owners.shape[0]),
                             owners)

    @staticmethod
    def of(h: Header, buf: np.ndarray) -> "MoveTo":
        return MoveTo(h.arg, _ints(buf))


class MoveAt(NamedTuple):
    """The lead to the others: the new owners (one per range) own their ranges from `clock`,
    as placement `version`."""
    version: int
    clock: int
    owners: np.ndarray

    def pack(self) -> np.ndarray:
        owners = np.asarray(self.owners, np.int64)
        return protocol.pack(Header(Op.MOVE_AT, clock=self.clock, arg=self.version,
                                    nkeys=owners.shape[0]), owners)

    @staticmethod
    def of(h: Header, buf: np.ndarray) -> "MoveAt":
        return MoveAt(h.arg, h.clock, _ints(buf))


class Moved(NamedTuple):
    """A server to the lead: a step of a range move, as JSON text."""
    text: str

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.MOVED), protocol.text(self.text))

    @staticmethod
    def of(buf: np.ndarray) -> "Moved":
        return Moved(protocol.text_of(buf))


class CopyHeader(NamedTuple):
    """A range's primary to its new holder: range `range_index`'s `nkeys` keys and state rows
    of `width` columns, as placement `placement` has it (the payload: protocol.unpack and
    copied_positions)."""
    range_index: int
    nkeys: int
    width: int
    placement: int

    def header(self) -> Header:
        return Header(Op.COPY, nkeys=self.nkeys, width=self.width, arg=self.range_index,
                      placement=self.placement)

    @staticmethod
    def of(h: Header) -> "CopyHeader":
        return CopyHeader(h.arg, h.nkeys, h.width, h.placement)


class PlacementAsk(NamedTuple):
    """A worker to the lead, a read refused: what now? It holds placement `version`."""
    version: int

    @staticmethod
    def of(h: Header) -> "PlacementAsk":
        return PlacementAsk(h.arg)


# A worker's messages: the header fields of a push that reuses a pull's keys and of a
# question about the placement, the lead's answer to it, and the lead's notices to a worker.
def same_keys_of(h: Header) -> int:
    """The ts of the pull whose keys a SAME_KEYS push reuses."""
    return h.arg


def same_keys_push(pull_ts: int) -> dict:
    """The header fields of a push of the keys of pull `pull_ts` (flag SAME_KEYS)."""
    return {"arg": pull_ts}


def placement_question(version: int) -> dict:
    """The header fields of PLACEMENT: a read split by placement `version` was refused."""
    return {"arg": version}


class PlacementAnswer(NamedTuple):
    """The lead's answer to PLACEMENT: the job stopped, or key ranges moved (to `assign`,
    with `extra` holders while a move is under way) at `clock`."""
    moved: bool
    version: int
    clock: int
    assign: list
    extra: dict

    @staticmethod
    def buffer(p: Placement) -> np.ndarray:
        """The receive buffer for the answer, given the worker's placement."""
        return np.empty(3 + p.n_ranges * (1 + p.replicas), np.int64)

    @classmethod
    def of(cls, answer: np.ndarray, p: Placement) -> "PlacementAnswer":
        if int(answer[0]) == 0:
            return cls(False, int(answer[1]), int(answer[2]), [], {})
        q = p.n_ranges
        return cls(True, int(answer[1]), int(answer[2]), answer[3:3 + q].tolist(),
                   Placement.extra_of(answer[3 + q:].reshape(q, p.replicas)))


class WorkAsk(NamedTuple):
    """A worker to the lead (--balance dynamic): its next chunk of training rows, in epoch
    `epoch`, at its speed `speed` (rows per busy second), a row of its taking `units` units
    of the file (bytes of text; 1 for binary shards; 0: not measured yet), `held` chunks
    handed to it so far (an ask repeated to the next lead, whose answer died with the lead,
    is answered alike). The answer: `work_answer`."""
    epoch: int
    speed: float
    units: float = 0.0
    held: int = 0

    def fields(self) -> np.ndarray:
        return np.array([self.epoch, round(self.speed * 1000), round(self.units * 1000),
                         self.held], np.int64)

    @staticmethod
    def of(buf: np.ndarray) -> "WorkAsk":
        """ValueError unless the payload holds an epoch, a speed, a row's size and the
        chunks held."""
        fields = _ints(buf)
        if fields.shape[0] != 4:
            raise ValueError(f"{fields.shape[0]} numbers where an epoch, a speed, a row's "
                             f"size and the chunks held go")
        if fields[3] < 0:
            raise ValueError(f"{fields[3]} chunks held")
        return WorkAsk(int(fields[0]), int(fields[1]) / 1000, int(fields[2]) / 1000,
                       int(fields[3]))


class HandOutCopy(NamedTuple):
    """The lead to a server that would lead next (under ULFM, --balance dynamic): copy
    number `number` of the hand-out of training rows, as JSON text (all of it, or what
    changed since the copy before: server.rowhandout)."""
    number: int
    text: str

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.HANDOUT, arg=self.number), protocol.text(self.text))

    @staticmethod
    def of(h: Header, buf: np.ndarray) -> "HandOutCopy":
        return HandOutCopy(h.arg, protocol.text_of(buf))


class HandOutHeld(NamedTuple):
    """A server to the lead: it holds the hand-out's copy number `number`."""
    number: int

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.HANDOUT_HELD, arg=self.number))

    @staticmethod
    def of(h: Header) -> "HandOutHeld":
        return HandOutHeld(h.arg)


def work_answer(chunk) -> np.ndarray:
    """The lead's answer to WORK: a data.balance.Chunk as int64 (epoch, start, stop,
    minibatch rows)."""
    return np.array(tuple(chunk), np.int64)


# Every control op: its message type.
TYPES = {Op.BYE: Bye, Op.ERROR: Error, Op.STOP: Stop, Op.SCORED: Scored, Op.STOP_AT: StopAt,
         Op.CHECKPOINT_AT: CheckpointAt, Op.HAVE: Have, Op.SHARD_SAVED: ShardSaved,
         Op.GONE: Gone, Op.DEATH: Death, Op.SPLIT: Split, Op.JOIN_AT: JoinAt,
         Op.MOVE_ASK: MoveAsk, Op.MOVE_CLOCK: MoveClock, Op.MOVE_TO: MoveTo, Op.MOVE_AT: MoveAt,
         Op.MOVED: Moved, Op.COPY: CopyHeader, Op.PLACEMENT: PlacementAsk,
         Op.HANDOUT: HandOutCopy, Op.HANDOUT_HELD: HandOutHeld}

# The data plane: requests whose payload a server reads as views of the receive buffer
# (server.admission.Request: keys, values, a report), and the requests a worker sends the
# lead for an answer (its clock and ts in the header). Every op is in one of the two.
DATA_PLANE = frozenset({Op.PULL, Op.PUSH, Op.READ, Op.FINISH, Op.DENSE, Op.STATUS,
                        Op.CHUNK, Op.WORK})

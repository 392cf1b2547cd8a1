"""One type per control message: what each op's header slots and payload mean.

The header (protocol.Header) is a fixed frame of eight numbers; its last slot, `arg`, means
something different for each op that uses it (a worker, a range, a placement version, a
hand-over's number ...). Code outside the wire never reads or sets it: a sender builds the
op's message and packs it, a handler reads the message back with `of`, and so names every
number it uses. Pulls, pushes, reads and dense operations, the hot path, keep their header
and payload views in protocol (their one use of `arg` is named there too)."""
from typing import NamedTuple

import numpy as np

from . import protocol
from .handover import Handover
from .protocol import HEADER_BYTES, Header, Op


def _ints(buf: np.ndarray) -> np.ndarray:
    return buf[HEADER_BYTES:].view(np.int64)


class Bye(NamedTuple):
    """The sender will send nothing more."""

    def pack(self) -> np.ndarray:
        return protocol.pack(Header(Op.BYE))


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
                             np.frombuffer(self.text.encode(), np.uint8))

    @staticmethod
    def of(h: Header, buf: np.ndarray) -> "ShardSaved":
        return ShardSaved(h.clock, protocol.error_text(buf))


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
        return protocol.pack(Header(Op.MOVED), np.frombuffer(self.text.encode(), np.uint8))

    @staticmethod
    def of(buf: np.ndarray) -> "Moved":
        return Moved(protocol.error_text(buf))


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


# Every op whose header or payload means more than the frame: its message type.
TYPES = {Op.BYE: Bye, Op.STOP: Stop, Op.SCORED: Scored, Op.STOP_AT: StopAt,
         Op.CHECKPOINT_AT: CheckpointAt, Op.HAVE: Have, Op.SHARD_SAVED: ShardSaved,
         Op.GONE: Gone, Op.DEATH: Death, Op.SPLIT: Split, Op.JOIN_AT: JoinAt,
         Op.MOVE_ASK: MoveAsk, Op.MOVE_CLOCK: MoveClock, Op.MOVE_TO: MoveTo, Op.MOVE_AT: MoveAt,
         Op.MOVED: Moved, Op.COPY: CopyHeader, Op.PLACEMENT: PlacementAsk}

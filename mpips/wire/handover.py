"""A hand-over of a worker's rows, as it travels between ranks and is kept in checkpoints:
a worker that died, left, or split its rows with a worker joining (see data.workplan for
what the rows are and how a work plan applies a hand-over)."""
from dataclasses import asdict, dataclass
from enum import Enum

import numpy as np


class HandoverKind(Enum):
    DEATH = "death"     # the worker died; its rows go to the survivors
    LEAVE = "leave"     # it finished or left (`ctl remove-worker`), and may take shares later
    SPLIT = "split"     # it gives a joiner a share of its rows and keeps the rest


@dataclass(frozen=True)
class Handover:
    """A worker that died, and where it stood on every server: its pushes after `clock`
    clocks were dropped, and its next minibatch started at `offset` (-1: the start) of
    segment `segment` of epoch `epoch`. `taken`: the epochs at which it had itself taken its
    shares of earlier deaths; `survivors`: the workers its rows went to, in order. Not
    `dead`: a worker that finished before shares handed to it reached it, or left, and hands
    them on the same way. `worker` among `survivors`: a split (see the module's docstring);
    `shares`: each survivor's weight (none: equal)."""
    worker: int
    clock: int
    epoch: int
    segment: int
    offset: int
    taken: tuple = ()
    survivors: tuple = ()
    dead: bool = True
    shares: tuple = ()

    @property
    def split(self) -> bool:
        return self.worker in self.survivors

    @property
    def kind(self) -> HandoverKind:
        return (HandoverKind.SPLIT if self.split else
                HandoverKind.DEATH if self.dead else HandoverKind.LEAVE)

    def fields(self) -> np.ndarray:
        """This hand-over as int64, as it travels: worker, clock, epoch, segment, offset, dead
        (1 or 0), the number of epochs it had taken shares at, those epochs, the number of
        survivors, the survivors, then (if weighed) each survivor's share."""
        return np.array([self.worker, self.clock, self.epoch, self.segment, self.offset,
                         int(self.dead), len(self.taken), *self.taken, len(self.survivors),
                         *self.survivors, *self.shares], np.int64)

    @classmethod
    def of_fields(cls, fields: np.ndarray) -> "Handover":
        """The hand-over in `fields` (see `fields`); ValueError if they do not hold one."""
        f = [int(x) for x in fields]
        if len(f) < 8 or f[6] < 0 or len(f) < 8 + f[6] or f[5] not in (0, 1):
            raise ValueError(f"{len(f)} fields do not hold a hand-over")
        taken = tuple(f[7:7 + f[6]])
        rest = f[7 + f[6]:]
        n = rest[0] if rest else -1
        if n < 0 or len(rest) - 1 not in (n, 2 * n) or min(f[:4] + list(taken) + rest) < 0:
            raise ValueError(f"{len(f)} fields do not hold a hand-over")
        survivors, shares = tuple(rest[1:1 + n]), tuple(rest[1 + n:])
        if len(set(survivors)) < n or (shares and min(shares) < 1):
            raise ValueError(f"{len(f)} fields do not hold a hand-over")
        return cls(f[0], f[1], f[2], f[3], f[4], taken, survivors, bool(f[5]), shares)

    def piece(self, start: int, stop: int, survivor: int) -> tuple[int, int]:
        """The piece of [start, stop) that goes to `survivor`."""
        weights = self.shares or (1,) * len(self.survivors)
        k = self.survivors.index(survivor)
        before, total = sum(weights[:k]), sum(weights)
        span = stop - start
        return start + span * before // total, start + span * (before + weights[k]) // total

    def as_dict(self) -> dict:
        return {**asdict(self), "taken": list(self.taken), "survivors": list(self.survivors),
                "shares": list(self.shares)}

    @classmethod
    def from_dict(cls, d: dict) -> "Handover":
        return cls(int(d["worker"]), int(d["clock"]), int(d["epoch"]), int(d["segment"]),
                   int(d["offset"]), tuple(int(e) for e in d.get("taken", ())),
                   tuple(int(w) for w in d["survivors"]), bool(d.get("dead", True)),
                   tuple(int(x) for x in d.get("shares", ())))

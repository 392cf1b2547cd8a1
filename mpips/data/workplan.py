"""Which rows each worker trains in each epoch, as a list of ranges of the training file
(bytes of text, or rows of binary shards). A worker's own part is one range. When a worker
dies (hot failover), the rows it had not trained yet, in this epoch and the later ones, go
to the surviving workers, each range split evenly among them. A pure function of the parts
and the deaths, so every rank, and a job resumed from a checkpoint, computes the same plan.
No MPI, no files.

A survivor learns of a death while it trains; it takes its share at the epoch it is then in
(`taken`): what the dead worker had left of that epoch and of any earlier one is added to
the end of the survivor's current epoch, its later epochs to the survivor's same epochs. So
every row is still trained once for each epoch of the dead worker's.

The same record serves three more hand-overs. A worker that leaves (`mpips ctl
remove-worker`) is a death that is not `dead`: it may take shares later, when it joins
again. A worker that joins takes a share of every training worker's rows: each of those
splits what it has left between itself and the joiner (a record whose worker is among its
survivors, with `shares` weighing the pieces), cutting itself where it stands, and goes on
with its own piece.
"""
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


def remainder(plan: list, death: Handover) -> list:
    """The ranges of `plan` (a list per epoch) not yet trained at the death's place, per
    epoch (empty lists for the epochs before it)."""
    rest: list[list] = [[] for _ in plan]
    if death.epoch >= len(plan):
        return rest
    ranges = plan[death.epoch][death.segment:]
    if ranges and death.offset >= 0:
        ranges = [(max(death.offset, ranges[0][0]), ranges[0][1]), *ranges[1:]]
    rest[death.epoch] = [r for r in ranges if r[0] < r[1]]
    for e in range(death.epoch + 1, len(plan)):
        rest[e] = list(plan[e])
    return rest


def trained(plan: list, death: Handover) -> list:
    """`plan` cut at the death's place: what the dead worker trained."""
    cut = [list(ranges) if e < death.epoch else [] for e, ranges in enumerate(plan)]
    if death.epoch < len(plan):
        ranges = plan[death.epoch]
        cut[death.epoch] = list(ranges[:death.segment])
        if death.offset >= 0 and death.segment < len(ranges):
            start = ranges[death.segment][0]
            if death.offset > start:
                cut[death.epoch].append((start, death.offset))
    return cut


class WorkPlan:
    """`parts[w]`: worker w's own (start, stop); `deaths`: in the order they happened."""

    def __init__(self, parts: list, epochs: int, deaths: tuple = ()):
        self.parts = [tuple(int(x) for x in p) for p in parts]
        self.epochs = epochs
        self.deaths = tuple(deaths)

    def with_death(self, death: Handover) -> "WorkPlan":
        return WorkPlan(self.parts, self.epochs, (*self.deaths, death))

    def shares(self, worker: int) -> list:
        """Indices of the deaths whose rows `worker` got a share of, in order."""
        return [i for i, d in enumerate(self.deaths) if worker in d.survivors]

    def segments(self, worker: int, epoch: int, taken=()) -> list:
        """The ranges `worker` trains in `epoch`, given the epochs at which it took its
        shares (`taken`, in the order of `shares`; shares not taken yet are left out)."""
        return self.plan(worker, tuple(taken))[epoch]

    def plan(self, worker: int, taken=None, upto: int | None = None) -> list:
        """Ranges per epoch of `worker` under the first `upto` deaths (all by default), given
        the epochs at which it took its shares (`taken`; its last departure's record of them
        if that is longer: the record is where they stood when it left)."""
        deaths = self.deaths[:upto]
        gone = [d for d in deaths if d.worker == worker and not d.split]
        taken = list(gone[-1].taken if gone and len(gone[-1].taken) > len(taken or ())
                     else taken or ())
        plan = [[self.parts[worker]] for _ in range(self.epochs)]
        for i, death in enumerate(deaths):
            if death.worker == worker and not death.split:
                plan = trained(plan, death)
                if death.dead:
                    return plan
                continue   # it left: shares it takes when it joins again come after
            if worker not in death.survivors:
                continue
            if not taken:
                break   # shares are taken in order: none after one not taken
            at = taken.pop(0)
            if death.split and death.worker == worker:
                rest, plan = remainder(plan, death), trained(plan, death)
            else:
                rest = remainder(self.plan(death.worker, death.taken, upto=i), death)
            for e, ranges in enumerate(rest):
                for start, stop in ranges:
                    a, b = death.piece(start, stop, worker)
                    if a < b:
                        plan[max(e, at)].append((a, b))
        return plan

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
from ..wire.handover import Handover


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

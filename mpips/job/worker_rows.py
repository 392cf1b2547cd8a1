"""A worker's rows, epoch by epoch, as its work plan says (see workplan): its own part of the
training data, then the shares of other workers' rows it took when they died, left or split
theirs with a worker joining; cut in minibatches.
"""
import logging
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from ..data.textfile import KeyIndexer, Rows
from ..data.workplan import Handover, WorkPlan
from ..ranks.bounded import wait_until
from ..run.config import TrainConfig
from ..wire.notices import GiveNotice
from ..worker.lead_channel import LeadChannel

log = logging.getLogger("mpips")


class Minibatch(NamedTuple):
    """A minibatch of a worker's rows, its keys found."""
    rows: Rows              # the reader's batch (its `start`: a byte offset or row)
    keys: np.ndarray        # sorted unique uint64: what it pulls
    cols: np.ndarray        # each entry's column in the pulled rows
    bias_col: int
    progress: float         # epochs done once it is trained (fractional)
    epoch: int
    segment: int            # the range of the epoch's work plan it is in

    @property
    def start(self) -> int:
        return self.rows.start


class Work:
    """This worker's rows, epoch by epoch, as its work plan says: its own part, then the
    shares of dead workers' rows it took (see `workplan`)."""

    def __init__(self, cfg: TrainConfig, shard, plan: WorkPlan, worker: int, taken: list,
                 reserved: np.ndarray):
        """`reserved`: the model's own rows every minibatch pulls."""
        self.cfg, self.shard, self.plan, self.worker = cfg, shard, plan, worker
        self.reserved = reserved
        self.taken = list(taken)   # the epochs at which it took its shares
        self.epoch = 0             # the epoch and segment of the latest minibatch handed out
        self.segment = 0
        self._told: dict[int, Handover] = {}   # deaths told of out of order, by number
        self._rejoin_at = (0, 0)   # where shares given after it left begin (see leave)

    def catch_up(self, lead: LeadChannel, deaths: int, timeout: float) -> None:
        """Wait (bounded) until the lead's notices of its first `deaths` hand-overs have
        reached this worker, and apply them."""
        def told() -> bool:
            self.apply_notices(lead.notices())
            return len(self.plan.deaths) >= deaths
        wait_until(told, timeout, lambda: f"the lead server's notices of {deaths} dead worker(s)")

    def apply_notices(self, notices: list) -> None:
        """Deaths the lead told of, (number, Handover): each joins the plan in order, and this
        worker takes its share at the epoch it is in."""
        for number, death in notices:
            self._told[number] = death
        while len(self.plan.deaths) in self._told:
            death = self._told.pop(len(self.plan.deaths))
            self.plan = self.plan.with_death(death)
            if self.worker not in death.survivors:
                continue
            self.taken.append(self.epoch)
            if death.worker == self.worker:
                log.info("gave worker %d a share of the rows left", death.survivors[1])
            else:
                log.warning("worker %d %s: this worker takes its share of the rows it had "
                            "left, from epoch %d on", death.worker, "died" if death.dead else
                            "shared its rows" if death.split else "handed its rows on",
                            death.epoch)

    def take_shares_untold(self, epoch: int) -> None:
        """Resuming: the checkpoint records deaths whose notice had not reached this worker by
        its clock (the lead's notice comes between minibatches); it takes their shares now, at
        the epoch it goes on from, as it would have on hearing of them. No notice comes again."""
        untold = len(self.plan.shares(self.worker)) - len(self.taken)
        if untold > 0:
            self.taken += [epoch] * untold
            log.warning("taking shares of %d worker(s)' rows that the checkpoint records as "
                        "handed over, from epoch %d on", untold, epoch)

    def segments(self, epoch: int) -> list:
        return self.plan.segments(self.worker, epoch, self.taken)

    def _after(self, epoch: int, segment: int, offset: int) -> tuple[int, int]:
        """(epoch, segment) where ranges added at `epoch` begin once the plan is cut at the
        place given (see workplan.trained)."""
        return epoch, segment + int(offset > self.segments(epoch)[segment][0])

    def share_with_joiner(self, lead: LeadChannel, clock: int, give: GiveNotice,
                          upcoming: Minibatch, timeout: float):
        """Asked to give a worker that joins one share of its rows left for every
        `give.weight` it keeps: cut them where `upcoming` (the next minibatch) starts, have the
        lead number the split (every worker learns it in order), and return the minibatches of
        the rows it keeps, from there."""
        epoch, segment, offset = upcoming.epoch, upcoming.segment, upcoming.start
        death = Handover(self.worker, clock, epoch, segment, offset, tuple(self.taken),
                         (self.worker, give.joiner), dead=False, shares=(give.weight, 1))
        resume = self._after(epoch, segment, offset)
        lead.report_share(death.fields())

        def numbered() -> bool:
            self.apply_notices(lead.notices())
            return death in self.plan.deaths
        wait_until(numbered, timeout, lambda: "the lead server to number this worker's split "
                                              "of its rows with the worker joining")
        return self.minibatches(*resume)

    def leave(self, upcoming: Minibatch) -> None:
        """Leaving where `upcoming` (the next minibatch) starts: where shares given to it,
        should it join again, begin."""
        self._rejoin_at = self._after(upcoming.epoch, upcoming.segment, upcoming.start)

    def end(self) -> None:
        """Done with its rows: shares given to it, should it join again, come after them."""
        last = self.cfg.solver.epochs - 1
        self._rejoin_at = (last, len(self.segments(last)))

    def rejoin(self, lead: LeadChannel) -> tuple[int, int]:
        """Asked to join again: go on from the clock the lead named; (epoch, segment) where
        the shares given to it begin."""
        lead.rejoin()
        return self._rejoin_at

    def _reader(self, epoch: int, segment: int):
        span = self.segments(epoch)[segment]
        return self.shard if span == self.plan.parts[self.worker] else self.shard.over(*span)

    def resume_point(self, epoch: int, segment: int, offset: int) -> tuple[int, int, int]:
        """(epoch, segment, offset) to go on from, given where a checkpoint says this worker
        stood: the same, unless the data changed since (--allow-changed-data) and the place
        is no longer the start of a row of that part of the data."""
        if epoch >= self.cfg.solver.epochs or segment >= len(self.segments(epoch)):
            return epoch, segment, offset
        reader = self._reader(epoch, segment)
        point = reader.next_row_at(offset)
        if point == offset:
            return epoch, segment, offset
        if offset == self.segments(epoch)[segment][1]:   # at its end: cut there (a leave)
            return epoch, segment + 1, -1
        if point is None:
            log.warning("%s: byte or row %d of the checkpoint is past this part of the changed "
                        "data: going on with the next", reader.path, offset)
            return epoch, segment + 1, -1
        log.warning("%s: the checkpoint's place %d is not a row start of this part of the "
                    "changed data: going on at %d", reader.path, offset, point)
        return epoch, segment, point

    def minibatches(self, first_epoch: int = 0, first_segment: int = 0,
                    offset: int = -1) -> Iterator[Minibatch]:
        """Each Minibatch from `first_epoch` on, starting at `offset` of `first_segment` (a
        byte or row; -1: its beginning). Shares taken meanwhile join the epoch being
        trained."""
        index = KeyIndexer(self.reserved)
        for epoch in range(first_epoch, self.cfg.solver.epochs):
            self.epoch = epoch
            segment = first_segment if epoch == first_epoch else 0
            while segment < len(self.segments(epoch)):
                self.segment = segment
                reader = self._reader(epoch, segment)
                start = offset if (epoch, segment) == (first_epoch, first_segment) else -1
                for batch in reader.minibatches(self.cfg.solver.batch_size,
                                                start if start >= 0 else None):
                    keys, cols, bias_col = index(batch, self.cfg.model.bias, reader.path)
                    yield Minibatch(batch, keys, cols, bias_col,
                                    epoch + self._done(epoch, segment, reader), epoch, segment)
                segment += 1

    def _done(self, epoch: int, segment: int, reader) -> float:
        """The fraction of the epoch's rows handed out (by bytes or rows)."""
        sizes = [b - a for a, b in self.segments(epoch)]
        total = sum(sizes)
        done = sum(sizes[:segment]) + reader.fraction_done * sizes[segment]
        return min(done / total, 1.0) if total > 0 else 1.0

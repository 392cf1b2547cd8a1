"""The lead's notices to a worker, one int64 message each on tags.NOTICE_TAG: leave after
this clock, give a share of the rows left to a worker that joins, train again, a hand-over of
a dead worker's rows. One type per notice; `notice_of` reads one back."""
from typing import NamedTuple

import numpy as np

from . import protocol


class LeaveNotice(NamedTuple):
    """Leave after this clock (mpips ctl remove-worker)."""

    def fields(self) -> np.ndarray:
        return np.array([protocol.LEAVE_NOTICE], np.int64)


class GiveNotice(NamedTuple):
    """Keep `weight` shares of the rows left, give worker `joiner` one."""
    joiner: int
    weight: int

    def fields(self) -> np.ndarray:
        return np.array([protocol.GIVE_NOTICE, self.joiner, self.weight], np.int64)


class JoinNotice(NamedTuple):
    """Train again (shares handed to it), from `clock` + 1."""
    clock: int

    def fields(self) -> np.ndarray:
        return np.array([protocol.JOIN_NOTICE, self.clock], np.int64)


class HandoverNotice(NamedTuple):
    """A hand-over whose rows the worker shares: its number, and DEATH's payload (see
    workplan.Handover.fields)."""
    number: int
    handover: np.ndarray   # Handover.fields()

    def fields(self) -> np.ndarray:
        return np.concatenate([np.array([self.number], np.int64), self.handover])


def notice_of(fields: np.ndarray):
    """The notice that int64 `fields` (one message on tags.NOTICE_TAG) hold."""
    kind = int(fields[0]) if fields.shape[0] else 0
    if kind == protocol.LEAVE_NOTICE and fields.shape[0] == 1:
        return LeaveNotice()
    if kind == protocol.GIVE_NOTICE and fields.shape[0] == 3 and fields[2] > 0:
        return GiveNotice(int(fields[1]), int(fields[2]))
    if kind == protocol.JOIN_NOTICE and fields.shape[0] == 2 and fields[1] >= 0:
        return JoinNotice(int(fields[1]))
    return HandoverNotice(int(fields[0]), fields[1:])

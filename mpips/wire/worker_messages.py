"""A worker's messages whose fields mean something per op, named: the header fields of a
push that reuses a pull's keys and of a question about the placement, the lead's answer to
that question, and the notices the lead sends a worker (see protocol)."""
from typing import NamedTuple

import numpy as np

from . import protocol
from .placement import Placement


def same_keys_push(pull_ts: int) -> dict:
    """The header fields of a push of the keys of pull `pull_ts` (flag SAME_KEYS)."""
    return {"ref": pull_ts}


def placement_question(version: int) -> dict:
    """The header fields of PLACEMENT: a read split by placement `version` was refused."""
    return {"ref": version}


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


class LeaveNotice(NamedTuple):
    """Leave after this clock (mpips ctl remove-worker)."""


class GiveNotice(NamedTuple):
    """Keep `weight` shares of the rows left, give worker `joiner` one."""
    joiner: int
    weight: int


class JoinNotice(NamedTuple):
    """Train again (shares handed to it), from `clock` + 1."""
    clock: int


class HandoverNotice(NamedTuple):
    """A hand-over whose rows the worker shares: its number, and DEATH's payload (see
    workplan.Handover.fields)."""
    number: int
    fields: np.ndarray


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

"""One rank's stage of a pipeline over MPI: it runs its list of the schedule, receiving each
micro-batch's activations from the previous stage and gradients from the next, sending its
own on, and records when each task ran. The numbers are network.Stage's; the order is
schedule's. Messages are numpy buffers (upper-case mpi4py), one per micro-batch, tagged by
micro-batch and direction on the pipeline's own communicator; every wait is bounded."""
import time

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

from ..base.errors import MpipsError
from ..models.network import Stage
from ..ranks.bounded import wait_all
from ..wire.tags import micro_tag
from .schedule import BACKWARD, FORWARD, UPDATE

_ACTIVATION, _GRADIENT = 0, 1

# One row per task this rank ran: seconds from the step's start.
TASK_RECORD = np.dtype([("stage", "<i4"), ("kind", "S1"), ("micro", "<i4"),
                        ("start", "<f8"), ("end", "<f8")])


class StageRank:
    """Stage `comm.rank` of a pipeline whose ranks are `comm`, in order."""

    def __init__(self, comm: MPI.Intracomm, stage: Stage, inputs: int, timeout: float,
                 copies: MPI.Intracomm | None = None):
        """`copies`: this stage's ranks in every data-parallel copy of the pipeline (each
        trains its own rows); their gradients are added in copy order before each update,
        so every copy keeps the same weights, bit for bit, run after run."""
        self.comm, self.stage, self.timeout, self.copies = comm, stage, timeout, copies
        self.index, self.stages = comm.rank, comm.size
        self.inputs = inputs   # the width of the activations this stage receives
        self.outputs = stage.layers[-1].outputs

    def step(self, tasks: list, rows: list, x: np.ndarray | None, labels: np.ndarray | None,
             lr: float = 0.0, apply=None, offsets: np.ndarray | None = None) -> tuple:
        """Run this stage's `tasks` for one minibatch, cut into micro-batches of the given
        row counts. The first stage is given x, the last the labels (and `offsets` to its
        logits). The update is w -= lr * mean gradient, or `apply(stage)` when given (which
        takes the stage's summed gradients elsewhere, such as to the servers). The first
        stage keeps the gradient by its input of each micro-batch in `input_grads`.
        (summed loss on the last stage else 0.0, TASK_RECORD rows)."""
        dtype = self.stage.weights[0][0].dtype
        starts = np.concatenate([[0], np.cumsum(rows)])
        sends, record, t0 = [], [], time.monotonic()
        self.input_grads = {}
        for task in tasks:
            m, began = task.micro, None   # a task starts once what it needs has arrived
            if task.kind == FORWARD:
                if self.index == 0:
                    assert x is not None, "the first stage is given x"
                    given = x[starts[m]:starts[m + 1]]
                else:
                    given = self._receive(m, _ACTIVATION, (rows[m], self.inputs), dtype)
                began = time.monotonic() - t0
                part = slice(starts[m], starts[m + 1])
                out = self.stage.forward(m, given, None if labels is None else labels[part],
                                         None if offsets is None else offsets[part])
                if not self.stage.last:
                    sends.append(self._send(out, m, _ACTIVATION))
            elif task.kind == BACKWARD:
                dout = (None if self.stage.last else
                        self._receive(m, _GRADIENT, (rows[m], self.outputs), dtype))
                began = time.monotonic() - t0
                din = self.stage.backward(m, dout)
                if self.index > 0:
                    sends.append(self._send(din, m, _GRADIENT))
                else:
                    self.input_grads[m] = din
            elif task.kind == UPDATE and apply is not None:
                began = time.monotonic() - t0
                apply(self.stage)
            elif task.kind == UPDATE:
                began = time.monotonic() - t0
                copies = 1 if self.copies is None else self.copies.size
                self.stage.update(lr, int(starts[-1]) * copies,
                                  None if self.copies is None else self._sum_over_copies)
            record.append((self.index, task.kind.encode(), m, began, time.monotonic() - t0))
        wait_all(sends, self.timeout, lambda: f"stage {self.index}'s messages to be taken by "
                                              f"its neighbours")
        loss, self.stage.loss = self.stage.loss, 0.0
        return loss, np.array(record, TASK_RECORD)

    def _sum_over_copies(self, mine: np.ndarray) -> np.ndarray:
        """Every copy's gradients, added in copy order (the same bits on every copy; an
        allreduce's order is the library's to choose)."""
        copies = self.copies
        assert copies is not None, "only a pipeline with copies sums over them"
        every = np.empty((copies.size, mine.shape[0]), mine.dtype)
        wait_all([copies.Iallgather(mine, every)], self.timeout,
                 lambda: f"the gradients of stage {self.index} from every copy of the pipeline")
        return every.sum(axis=0)

    def _send(self, values: np.ndarray, micro: int, direction: int) -> MPI.Request:
        to = self.index + 1 if direction == _ACTIVATION else self.index - 1
        return self.comm.Isend(np.ascontiguousarray(values), to, micro_tag(micro, direction))

    def _receive(self, micro: int, direction: int, shape: tuple, dtype) -> np.ndarray:
        source = self.index - 1 if direction == _ACTIVATION else self.index + 1
        what = "activations" if direction == _ACTIVATION else "gradients"
        return receive(self.comm, shape, dtype, source, micro_tag(micro, direction), self.timeout,
                       f"the {what} of micro-batch {micro} from stage {source}")


class BadStageMessage(MpipsError):
    """A message between stages that is not the size its receiver expects."""


def receive(comm: MPI.Intracomm, shape, dtype, source: int, tag: int, timeout: float,
            what: str, progress=None) -> np.ndarray:
    """One message of exactly `shape` and `dtype` from `source` (bounded wait naming
    `what`); BadStageMessage if it is longer or shorter."""
    buf, status = np.empty(shape, dtype), MPI.Status()
    try:
        wait_all([comm.Irecv(buf, source, tag)], timeout, lambda: what, progress=progress,
                 check_every=2.0, statuses=[status])
    except MPI.Exception as e:
        # (Testall with statuses says ERR_IN_STATUS and leaves the error in the status.)
        code = status.Get_error() if e.Get_error_class() == MPI.ERR_IN_STATUS else e.error_code
        if MPI.Get_error_class(code) != MPI.ERR_TRUNCATE:
            raise
        raise BadStageMessage(f"{what}: more than the {buf.size} values of shape {buf.shape} "
                              f"expected") from None
    got = status.Get_count(from_numpy_dtype(buf.dtype))
    if got != buf.size:
        raise BadStageMessage(f"{what}: {got} values, not the {buf.size} of shape "
                              f"{buf.shape} expected")
    return buf

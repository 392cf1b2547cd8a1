"""A worker's rows under --balance dynamic: chunks of each epoch's rows that the lead hands
out as the worker asks (see data.balance), one at a time, cut in minibatches of the size the
lead gives with each chunk; and the worker's speed, which it says when it asks.

A minibatch's gradient is the mean over its rows (the models' `gradient`); a minibatch of b
rows pushes it times b / --batch-size (`weight`), so that every row weighs 1 / --batch-size
in a clock's update, as under --balance static, however the clock's rows were split.
"""
import logging
from collections.abc import Iterator

import numpy as np

from ..base.errors import InputError, ProtocolError
from ..data.balance import Chunk
from ..data.shards import open_shard, spans
from ..data.textfile import KeyIndexer
from ..run.config import TrainConfig
from ..worker.lead_channel import LeadChannel
from .worker_rows import Minibatch

log = logging.getLogger("mpips")

EMA = 0.3   # the weight of the latest minibatch in the speed


class Speed:
    """Rows per busy second (time not spent waiting for the servers), an exponential moving
    average over minibatches; 0 until measured."""

    def __init__(self):
        self.value = 0.0

    def add(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        now = rows / seconds
        self.value = now if self.value == 0 else (1 - EMA) * self.value + EMA * now


def open_shared(cfg: TrainConfig, lead: LeadChannel, reserved: np.ndarray,
                speed: Speed) -> "SharedWork":
    """SharedWork over the whole training file (`reserved`: the model's own rows every
    minibatch pulls)."""
    try:
        shard = open_shard(cfg.data.train, 0, 1, skip_bad=cfg.data.skip_bad_lines)
        total = spans(cfg.data.train, 1)[0][1]
    except OSError as e:
        raise InputError(f"--train {cfg.data.train}: {e.strerror or e}") from None
    return SharedWork(cfg, shard, lead, reserved, speed, total)


class SharedWork:
    """This worker's chunks of the training rows, as the lead hands them out. `shard`: the
    whole training file. Its `segment` counts the chunks it was handed in this launch (a
    report's place: the chunks done, and where it stands in the next)."""

    def __init__(self, cfg: TrainConfig, shard, lead: LeadChannel, reserved: np.ndarray,
                 speed: Speed, total: int):
        self.cfg, self.shard, self.lead, self.reserved = cfg, shard, lead, reserved
        self.speed, self.total = speed, total
        self.epoch = 0        # the epoch it is in (that of the latest chunk handed out)
        self.segment = -1     # the latest chunk's number
        self.taken: list = []   # (no shares of dead workers' rows: the lead hands them out)
        self.chunks: list[Chunk] = []   # handed to it, in order
        self.batch = cfg.solver.batch_size or 1
        self.units, self.rows = 0, 0   # of the chunks trained: a row's size in the file

    def weight(self, rows: int) -> float:
        """What a minibatch of `rows` rows multiplies its mean gradient by."""
        return rows / self.batch

    def _ask(self, epoch: int) -> Chunk:
        kv = self.lead.kv
        units = self.units / self.rows if self.rows else 0.0
        answer = kv.wait(self.lead.work_chunk(epoch, self.speed.value, units,
                                              len(self.chunks)))
        assert answer is not None, "the lead's answer is its int64 fields"
        chunk = Chunk(*(int(x) for x in answer))
        epochs = self.cfg.solver.epochs
        if chunk.none:
            return chunk
        if not (0 <= chunk.start < chunk.stop <= self.total and 0 <= chunk.epoch < epochs
                and chunk.batch >= 1):
            raise ProtocolError(f"server rank {kv.rank_of(self.lead.server())} handed out "
                                f"chunk [{chunk.start}, {chunk.stop}) of epoch {chunk.epoch} in "
                                f"minibatches of {chunk.batch} rows, of a training file of "
                                f"{self.total} units over {epochs} epochs")
        return chunk

    def minibatches(self, first_epoch: int = 0, *_) -> Iterator[Minibatch]:
        """Each Minibatch of the chunks the lead hands out, from `first_epoch` on, until it
        says none is left."""
        index = KeyIndexer(self.reserved)
        self.epoch = first_epoch
        while self.epoch < self.cfg.solver.epochs:
            chunk = self._ask(self.epoch)
            if chunk.none:
                self.epoch = self.cfg.solver.epochs
                return
            self.epoch = max(self.epoch, chunk.epoch)
            self.chunks.append(chunk)
            self.segment = len(self.chunks) - 1
            reader = self.shard.over(chunk.start, chunk.stop)
            for batch in reader.minibatches(chunk.batch):
                keys, cols, bias_col = index(batch, self.cfg.model.bias, reader.path)
                progress = chunk.epoch + min(batch.start / self.total, 1.0)
                self.rows += len(batch)
                yield Minibatch(batch, keys, cols, bias_col, progress, chunk.epoch,
                                self.segment)
            self.units += chunk.stop - chunk.start

    # What the worker loop asks of its rows (see worker_rows.Work): hand-overs are the lead's.
    def apply_notices(self, notices: list) -> None:
        if notices:
            raise ProtocolError("the lead server told this worker of a hand-over of rows, "
                                "which under --balance dynamic it hands out itself")

    def catch_up(self, lead: LeadChannel, deaths: int, timeout: float) -> None:
        """No hand-over to wait for: the lead hands a dead worker's rows out itself."""

    def end(self) -> None:
        """Done: the lead said no chunk is left."""

    def leave(self, upcoming: Minibatch) -> None:
        """Leaving where `upcoming` starts: the lead hands out the rest of its chunks."""

    def rejoin(self, lead: LeadChannel) -> tuple[int]:
        """Asked to join again: go on from the clock the lead named, asking for chunks of the
        epoch it left in (the last, if it had none left), numbered on from those it was
        handed, as the lead numbers them (see data.balance.Balance.join)."""
        lead.rejoin()
        return (min(self.epoch, self.cfg.solver.epochs - 1),)

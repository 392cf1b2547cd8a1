"""--balance dynamic: the lead's hand-out of each epoch's training rows in chunks, and each
worker's minibatch size, both following the workers' speeds. Pure: no MPI, no files.

Every clock still trains about workers x --batch-size rows, as static BSP does, but a worker's
part of them follows its share of the workers' summed speed (rows per busy second, which it
says when it asks for a chunk): each clock then costs every worker about the same time, so
none is held for a slow one. Each epoch's rows (the whole training file, in bytes of text or
rows of binary shards) form a pool; a chunk is the worker's rows of as many clocks as 1/GUIDE
of the rows left makes (guided self-scheduling, as job.chunks hands out the test file), so
every worker's chunk lasts about as many clocks: at most MOST_CLOCKS (the minibatch sizes
then follow a speed that changes), fewer as the pool runs out, so that the workers end each
epoch together. A worker's first chunk, its speed and rows' size not yet known, is small.

A chunk handed to a worker that dies or leaves goes back, from where its place says it
stood, and is handed out first to the next worker that asks in that epoch or a later one:
every row is trained once per epoch. A worker's place is (the number of its chunks it had
done, where it stood in the next: -1 for its start), as its reports say. A worker that left,
or had none left, may join again: it asks from the epoch it was in, its chunks numbered on
from those it had.
"""
import math
from typing import NamedTuple

GUIDE = 4              # a chunk: the clocks 1/GUIDE of the pool left makes, ...
MOST_CLOCKS = 32       # ... at most this many, ...
LEAST_CLOCKS = 2       # ... and at least this many
FIRST = 128            # a worker's first chunk: its share of 1/FIRST of an epoch's rows
# The least minibatch: 1/LEAST_BATCH of --batch-size. Below it a minibatch's time is mostly
# what a clock costs whatever its rows, and the speed measured on it says little of the
# worker's: a worker slowed for a while would hardly get rows back once fast again.
LEAST_BATCH = 16


class Chunk(NamedTuple):
    """A span [start, stop) of epoch `epoch`'s rows, trained in minibatches of `batch` rows;
    start == stop: none is left, in any epoch."""
    epoch: int
    start: int
    stop: int
    batch: int

    @property
    def none(self) -> bool:
        return self.start >= self.stop


class Refused(ValueError):
    """A request the hand-out cannot take (what is wrong, to be said naming the sender)."""


class Balance:
    """The lead's hand-out of `epochs` epochs of [0, total) to `workers` workers, each
    --batch-size `batch` at equal speeds; chunks in whole `multiple`s but an epoch's last."""

    def __init__(self, total: int, epochs: int, workers: int, batch: int, multiple: int = 1):
        self.total, self.epochs, self.workers = total, epochs, workers
        self.batch, self.multiple = batch, max(1, multiple)
        self.taken = [0] * epochs           # per epoch: rows handed out of [0, total)
        self.returned: list[tuple[int, int, int]] = []   # (epoch, start, stop), by epoch
        self.speed = [0.0] * workers        # rows per busy second, as last said (0: unknown)
        self.units = [0.0] * workers        # units (bytes or rows) per row, as last said
        self.at = [0] * workers             # the epoch each worker is in
        self.handed: list[list[tuple[int, int, int]]] = [[] for _ in range(workers)]
        self.out: set[int] = set()          # workers dead, gone or done: not sharing
        self.abandoned: list[tuple[int, int, int]] = []   # returned when none could take it
        # per worker: its chunks unchanged since the standbys' last copy (see `copy`)
        self._unchanged = [0] * workers

    def ask(self, worker: int, epoch: int, speed: float, units: float = 0.0) -> Chunk:
        """The next chunk for `worker`, in epoch `epoch` (the one it is in), its speed
        `speed` (0: not measured yet) and the units of the file a row of its takes (bytes of
        text, 1 for binary shards; 0: not measured yet); Refused if it is in no such
        epoch."""
        if not 0 <= worker < self.workers:
            raise Refused(f"a chunk for worker {worker}, of {self.workers}")
        if worker in self.out or epoch != self.at[worker]:
            where = ("has no rows left to train" if worker in self.out
                     else f"is in epoch {self.at[worker]}")
            raise Refused(f"a chunk of epoch {epoch}, which it is not in (it {where})")
        if not (math.isfinite(speed) and speed >= 0):
            raise Refused(f"a chunk at a speed of {speed} rows per second")
        if not (math.isfinite(units) and units >= 0):
            raise Refused(f"a chunk of rows of {units} units each")
        if speed > 0:
            self.speed[worker] = speed
        if units > 0:
            self.units[worker] = units
        share = self.share(worker)
        sharing = self.workers - len(self.out - {worker})
        batch = max(math.ceil(self.batch / LEAST_BATCH), round(share * sharing * self.batch))
        given_back = sum(b - a for e, a, b in self.returned if e <= epoch)
        size = self._chunk_size(worker, share, batch, sharing,
                                given_back + self.total - self.taken[epoch])
        span = self._returned(epoch, size) or self._fresh(worker, share, batch, sharing)
        if span is None:
            self.out.add(worker)
            self.at[worker] = self.epochs
            return Chunk(self.epochs, 0, 0, batch)
        self.handed[worker].append(span)
        epoch, start, stop = span
        return Chunk(epoch, start, stop, batch)

    def share(self, worker: int) -> float:
        """`worker`'s part of the speed of the workers sharing the rows (those not measured
        yet count at the mean of those measured)."""
        sharing = [w for w in range(self.workers) if w not in self.out or w == worker]
        known = [self.speed[w] for w in sharing if self.speed[w] > 0]
        mean = sum(known) / len(known) if known else 1.0
        speeds = {w: self.speed[w] or mean for w in sharing}
        return speeds[worker] / sum(speeds.values())

    def _returned(self, epoch: int, size: int):
        """The first piece given back of an epoch up to `epoch` (at most `size` units of it;
        the rest stays given back), if any."""
        for i, (e, start, stop) in enumerate(self.returned):
            if e <= epoch:
                if stop - start > size:
                    self.returned[i] = (e, start + size, stop)
                    return e, start, start + size
                return self.returned.pop(i)
        return None

    def _chunk_size(self, worker: int, share: float, batch: int, sharing: int,
                    left: int) -> int:
        """Units of `worker`'s next chunk, `left` units being left in its epoch's pool."""
        units = self.units[worker]
        if self.speed[worker] == 0 or units == 0:
            return max(1, math.ceil(self.total * share / FIRST))
        clocks = math.ceil(left / units / (GUIDE * sharing * self.batch))
        clocks = min(MOST_CLOCKS, max(LEAST_CLOCKS, clocks))
        return max(1, math.ceil(clocks * batch * units))

    def _fresh(self, worker: int, share: float, batch: int, sharing: int):
        """A new chunk of the worker's epoch, moving it on to the next while its pool is
        empty; None once none is left."""
        while self.at[worker] < self.epochs:
            e = self.at[worker]
            left = self.total - self.taken[e]
            if left > 0:
                size = self._chunk_size(worker, share, batch, sharing, left)
                size = math.ceil(size / self.multiple) * self.multiple
                start, self.taken[e] = self.taken[e], min(self.total, self.taken[e] + size)
                return e, start, self.taken[e]
            self.at[worker] = e + 1
        return None

    def give_back(self, worker: int, done: int, offset: int, gone: bool = True) -> list:
        """`worker` died or left (`gone`; else it goes on, holding no chunk), having done its
        first `done` chunks and the next up to `offset` (-1: none of it): the rest of its
        chunks go back; returns them."""
        back = []
        kept = self.handed[worker][:done]
        for i, (e, start, stop) in enumerate(self.handed[worker]):
            if i < done:
                continue
            if i == done and offset >= 0:
                # The part it trained stays its chunk `done`: a worker that joins again numbers
                # its next chunks on from it, as the places checkpoints keep of it do.
                kept.append((e, start, max(start, min(offset, stop))))
                start = kept[-1][2]
            if start < stop:
                back.append((e, start, stop))
        self.handed[worker] = kept
        self._unchanged[worker] = min(self._unchanged[worker], done)
        self.returned = sorted(self.returned + back)
        if not gone:
            return back
        self.out.add(worker)
        if len(self.out) >= self.workers and self.returned:
            self.abandoned += self.returned
            self.returned = []
        return back

    def rejoin(self, worker: int, epoch: int) -> None:
        """`worker` goes on in a resumed launch, from epoch `epoch`, with no chunk (those of
        this launch numbered from 0)."""
        self.out.discard(worker)
        self.handed[worker] = []
        self._unchanged[worker] = 0
        self.at[worker] = min(epoch, self.epochs)

    def join(self, worker: int) -> int:
        """`worker` trains again (`mpips ctl add-worker`), having left or had none left: it
        asks from the epoch it was in (the last, if it was done), its next chunks numbered on
        from those it was handed. Returns that epoch."""
        self.out.discard(worker)
        self.at[worker] = min(self.at[worker], self.epochs - 1)
        return self.at[worker]

    def left(self) -> int:
        """Rows of every epoch not yet handed out, or given back."""
        return (sum(self.total - t for t in self.taken)
                + sum(b - a for _, a, b in self.returned))

    def state(self) -> dict:
        """What a checkpoint keeps (see `of_state`)."""
        return {**self._numbers(), "handed": [[list(c) for c in h] for h in self.handed]}

    def _numbers(self) -> dict:
        """What a checkpoint keeps but the chunks handed to each worker."""
        return {"total": self.total, "taken": list(self.taken),
                "returned": [list(r) for r in self.returned],
                "at": list(self.at), "speed": list(self.speed)}

    def copy(self, whole: bool = True) -> dict:
        """The hand-out, for the servers that would lead next (`take_copy`): all of it, or
        (not `whole`) each worker's chunks only from the first that changed since `copied`
        (`handed_from`: where its list goes on; the other fields are a few numbers per worker
        or epoch, and go whole). A copy of every change then costs a few chunks, not all
        those of the job so far."""
        since = [0] * self.workers if whole else list(self._unchanged)
        return {**self._numbers(), "units": list(self.units), "out": sorted(self.out),
                "abandoned": [list(r) for r in self.abandoned], "handed_from": since,
                "handed": [[list(c) for c in h[k:]] for h, k in zip(self.handed, since)]}

    def copied(self) -> None:
        """The standbys hold the hand-out as it is now: a copy not whole starts from here."""
        self._unchanged = [len(h) for h in self.handed]

    def take_copy(self, copy: dict) -> None:
        """Become the hand-out `copy` (the lead's `copy()`, whole, or the changes since the
        last one taken); ValueError naming the field that does not fit this job's epochs,
        workers and rows, or the chunks held here (nothing taken then)."""
        def spans(field: str, items) -> list[tuple[int, int, int]]:
            out = [_span(r) for r in items]
            if not all(0 <= e < self.epochs and 0 <= a <= b <= self.total for e, a, b in out):
                raise ValueError(f"{field}: a span outside {self.epochs} epochs of "
                                 f"{self.total} rows")
            return out

        def per_worker(field: str, kind) -> list:
            values = [kind(x) for x in copy[field]]
            if len(values) != self.workers:
                raise ValueError(f"{field}: {len(values)} entries for {self.workers} workers")
            return values

        try:
            if int(copy["total"]) != self.total:
                raise ValueError(f"total: {copy['total']} rows, not {self.total}")
            taken = [int(t) for t in copy["taken"]]
            if len(taken) != self.epochs or not all(0 <= t <= self.total for t in taken):
                raise ValueError(f"taken: {taken} for {self.epochs} epochs of {self.total} rows")
            since = per_worker("handed_from", int)
            if not all(0 <= k <= len(h) for k, h in zip(since, self.handed)):
                raise ValueError(f"handed_from: {since}, past the chunks held here "
                                 f"({[len(h) for h in self.handed]})")
            tails = [spans("handed", h) for h in copy["handed"]]
            if len(tails) != self.workers:
                raise ValueError(f"handed: {len(tails)} entries for {self.workers} workers")
            handed = [h[:k] + tail for h, k, tail in zip(self.handed, since, tails)]
            returned, abandoned = spans("returned", copy["returned"]), spans(
                "abandoned", copy["abandoned"])
            at, speed = per_worker("at", int), per_worker("speed", float)
            units = per_worker("units", float)
            out = {int(w) for w in copy["out"]}
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a hand-out: {type(e).__name__} {e}") from None
        if not out <= set(range(self.workers)):
            raise ValueError(f"out: {sorted(out)} for {self.workers} workers")
        self.taken, self.handed, self.returned, self.abandoned = taken, handed, returned, abandoned
        self.at, self.speed, self.units, self.out = at, speed, units, out

    @classmethod
    def of_state(cls, state: dict, epochs: int, workers: int, batch: int, multiple: int,
                 places: dict) -> "Balance":
        """The hand-out a checkpoint kept, every worker going on from its place there
        (worker -> (epoch, chunks done, offset)): the rest of its chunks given back."""
        b = cls(int(state["total"]), epochs, workers, batch, multiple)
        b.taken = [int(t) for t in state["taken"]][:epochs] + [0] * (epochs - len(state["taken"]))
        b.returned = sorted(_span(r) for r in state["returned"])
        b.handed = [[_span(c) for c in h] for h in state["handed"]]
        b.speed = [float(s) for s in state["speed"]]
        for w in range(workers):
            epoch, done, offset = places.get(w, (0, 0, -1))
            b.give_back(w, done, offset, gone=False)
            b.rejoin(w, epoch)
            if epoch >= epochs:
                b.out.add(w)
        return b


def _span(fields) -> tuple[int, int, int]:
    """(epoch, start, stop) of a checkpoint's list."""
    epoch, start, stop = (int(x) for x in fields)
    return epoch, start, stop

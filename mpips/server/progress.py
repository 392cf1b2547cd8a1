"""Job-wide training progress, as seen by the lead server from the workers' messages."""
import time
from collections.abc import Callable

from ..base.log import say


class Progress:
    """Latest figures per worker; logs a line every `every` seconds, and at each tenth of
    an epoch (the first at once, the others at most twice a second) so short runs show
    progress too."""

    def __init__(self, n_workers: int, epochs: int, every: float):
        self.epochs = epochs
        self.every = every
        # (lists: set from every push, where a numpy array's element is slower to set)
        self.examples = [0] * n_workers
        self.loss = [0.0] * n_workers
        self.done = [0.0] * n_workers   # fractional epochs per worker
        # Each line's figures, for live curves: (examples, recent loss, rate, epochs done).
        self.curves: Callable[[int, float, float, float], None] | None = None
        self.start()

    def start(self, positions: dict | None = None) -> None:
        """Start the clock (when training starts, after set-up), from where each worker
        stands (a resume: its examples and loss so far, which rates leave out)."""
        for w, p in (positions or {}).items():
            self.examples[w], self.loss[w] = p.examples, p.loss
        self._start = time.monotonic()
        self._first = self._last = (self._start, self.examples_sum, float(sum(self.loss)))
        self._tenth = 0

    @property
    def examples_sum(self) -> int:
        return int(sum(self.examples))

    @property
    def epochs_done(self) -> float:
        """Epochs done, the workers' mean."""
        return sum(self.done) / len(self.done)

    def update(self, worker: int, header, say: bool = True) -> None:
        """A worker's latest figures; a line if one is due and `say` (on the lead server:
        every server keeps the figures, to lead if the lead dies)."""
        self.examples[worker] = header.examples
        self.loss[worker] = header.loss
        self.done[worker] = header.progress
        if not say:
            return
        since = time.monotonic() - self._last[0]
        if self._tenth and since < 0.5 and since < self.every:
            return   # no line can be due (asked of every push: the figures are not summed)
        if min(self.done) >= self.epochs:
            return   # all done: the final line follows
        tenth = int(self.epochs_done * 10)
        # The first tenth's line at once, however short the run: every run shows one (once
        # every worker has said where it is: a resumed run's mean starts past zero).
        first = self._tenth == 0 and tenth > 0 and min(self.done) > 0
        if since >= self.every or (tenth > self._tenth and (first or since >= 0.5)):
            self._tenth = tenth
            self.log()

    def log(self, final: bool = False) -> None:
        now = time.monotonic()
        t0, ex0, loss0 = self._last
        examples, loss = self.examples_sum, float(sum(self.loss))
        if examples == ex0 and not final:
            return
        recent = (loss - loss0) / max(examples - ex0, 1)
        rate = (examples - ex0) / max(now - t0, 1e-9)
        if self.curves and examples > ex0:   # the last line's window too: a short run's only
            self.curves(examples, recent, rate, self.epochs_done)
        if final:
            recent = loss / max(examples, 1)
            rate = (examples - self._first[1]) / max(now - self._start, 1e-9)
        say(f"{'trained' if final else 'training'}: epoch {self.epochs_done:.2f}/{self.epochs}"
            f"  {examples:,} examples  {rate / 1e3:,.1f}k examples/s"
            f"  train logloss {recent:.4f}{' (whole run)' if final else ''}")
        self._last = (now, examples, loss)

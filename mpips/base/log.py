"""Logging with the rank and role in every line; progress goes to stdout on rank 0."""
import logging
import sys
import time

_T0 = time.monotonic()


class _Elapsed(logging.Formatter):
    def format(self, record):
        record.elapsed = time.monotonic() - _T0
        return super().format(record)


def setup(who: str, level: str = "INFO") -> logging.Logger:
    """Configure the 'mpips' logger to prefix lines with elapsed time and `who` (e.g.
    'worker 2')."""
    logger = logging.getLogger("mpips")
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Elapsed(f"[%(elapsed)7.1fs] mpips {who}: %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return logger


def elapsed() -> float:
    """Seconds since this process imported mpips."""
    return time.monotonic() - _T0


def say(text: str) -> None:
    """A line for the person watching the job (stdout, flushed at once)."""
    print(f"[{elapsed():7.1f}s] {text}", flush=True)

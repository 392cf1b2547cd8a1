"""Logging with the rank and role in every line; progress goes to stdout on rank 0."""
import logging
import sys
import time
import traceback

_T0 = time.monotonic()


class _Elapsed(logging.Formatter):
    def format(self, record):
        record.elapsed = time.monotonic() - _T0
        return super().format(record)


def setup(who: str, level: str = "INFO") -> logging.Logger:
    """Configure the 'mpips' logger to prefix lines with elapsed time and `who` (e.g. 'worker 2')."""
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


def log_failure(e: Exception) -> str:
    """Log why this rank fails (with a traceback if it is a bug); return a one-line reason."""
    from mpi4py import MPI   # here: importing mpi4py starts MPI, which `inspect` does not want

    from .errors import MpipsError
    from ..ranks.ulfm import CannotFailOver, is_failure, what_died
    if is_failure(e):   # another rank died (under ULFM): the command line says which
        return what_died(MPI.COMM_WORLD, e)
    if isinstance(e, CannotFailOver):   # the command line says it, with how to go on
        return str(e)
    text = str(e) if isinstance(e, MpipsError) else f"{type(e).__name__}: {e}"
    logging.getLogger("mpips").error("%s", text if isinstance(e, MpipsError)
                                     else traceback.format_exc())
    e.reported = True   # the command line does not log it again
    return text

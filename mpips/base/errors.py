"""Errors mpips reports to the user, and how a job fails together."""


class MpipsError(Exception):
    """An error with a message meant for the user (no traceback needed)."""

    # Set where ranks agree which of them prints the error (True: printed or to be printed
    # there, not again by the command line); left unset, the handler decides.
    reported: bool
    # Set where every rank of the job raised it together, having waited for the others
    # (job.ending): they need not wait again before they leave.
    raised_together: bool = False


class ConfigError(MpipsError):
    """Bad command line or input files, detected identically on every rank before work starts."""


class InputError(MpipsError):
    """Malformed training or test data, found by one rank while reading."""


class DamagedFile(MpipsError, ValueError):
    """A file mpips reads back (a model, a snapshot, a checkpoint's shard) is cut short or
    damaged: the message names it and what to do. A ValueError too, as the other errors of
    reading a model are (mpips.load)."""


class ProtocolError(MpipsError):
    """A rank sent something the protocol does not allow (e.g. a clock after FINISH)."""


class WaitTimeout(MpipsError):
    """A bounded wait expired; the message says what was awaited."""


class Interrupted(MpipsError):
    """The job was told to stop (SIGTERM, SIGINT). Every rank gets the signal, so no rank
    waits for the others: each server saves its own shard and exits."""

    exit_status: int   # 128 + the signal's number


class Stopped(MpipsError):
    """The job was asked to stop (Slurm's warning, SIGUSR1, a first SIGTERM or SIGINT): the
    servers wrote a checkpoint and answer no more reads. Exit status 75, resumable."""


class SaveError(MpipsError):
    """A file could not be written (a full disk, a read-only or vanished directory). The
    message is one line: the file, why, and for a full disk the bytes needed and free."""

    disk_full = False   # no space left: waiting for space may help


class CheckpointsFailing(MpipsError):
    """Several checkpoints in a row could not be written: the job stops, keeping its model."""


class Diverged(MpipsError):
    """The training loss stopped being a finite number."""


def said_by(source: str, text: str) -> str:
    """`text` as said by `source` ("worker 1: ..."), naming it once: a text that starts with
    the name already (an error that named its rank, or a reason relayed by another rank)
    is kept as it is."""
    return text if text.startswith(f"{source}: ") else f"{source}: {text}"

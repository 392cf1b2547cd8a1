"""Writing files so that a failure leaves nothing half-written and says why in one line, and
reading HDF5 files back so that a damaged one is named.

Every file goes to a temporary name, is fsynced and renamed (`atomic_file`; `write_bytes`,
`write_json` and `write_hdf5` for what is whole in memory): a reader sees the old file or
the new one. With MPIPS_FSYNC=0 in the environment (scratch runs, test suites) nothing is
fsynced: a rename still shows a whole file or none to every process, even after a process
is killed; only a crash of the node's kernel or its power can then lose what was written. The
variable is read once, as mpips is imported.

When writing fails (a full disk, a quota, a read-only or vanished directory),
the temporary file is removed and SaveError names the file, the reason and, for a full
disk, how many bytes were needed and how many are free. `keep_trying` holds what could
not be written in memory and tries again, for a bounded time, while the user frees space.
"""
import contextlib
import errno
import io
import json
import logging
import os
import re
import time
from collections.abc import Callable

from .errors import ConfigError, DamagedFile, SaveError

log = logging.getLogger("mpips")

_FULL = (errno.ENOSPC, errno.EDQUOT)


FSYNC = "MPIPS_FSYNC"
_SETTING = os.environ.get(FSYNC, "1")   # as mpips was imported: what DURABLE follows
DURABLE = _SETTING != "0"   # files fsynced (check_fsync_setting: 0 or 1)


def check_fsync_setting(value: str = _SETTING) -> None:
    """Refuse a value of MPIPS_FSYNC other than 0 and 1 (by default, the one read as mpips was
    imported), naming it."""
    if value not in ("0", "1"):
        raise ConfigError(f"{FSYNC}={value!r} in the environment: set it to 1 (every file "
                          f"written is fsynced, the default) or 0 (scratch runs, test suites)")


def fsync_dir(path: str) -> None:
    if not DURABLE:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_bytes(directory: str) -> int | None:
    """Bytes this user may still write on the file system holding `directory`."""
    while directory and not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    try:
        st = os.statvfs(directory or ".")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _mb(n: int) -> str:
    """A size for people: 812 bytes, 40.2 KB, 1.3 MB, 2.0 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} bytes"


def _reason(e: BaseException) -> tuple[str, bool]:
    """(why, whether the disk is full) for an error from writing; h5py wraps the errno in
    its text."""
    code = getattr(e, "errno", None)
    text = str(e)
    full = code in _FULL or "No space left" in text or "Disk quota exceeded" in text
    if full:
        return os.strerror(errno.ENOSPC), True
    if code:
        return os.strerror(code), False
    return (text.splitlines() or [type(e).__name__])[0][:200], False


def save_error(path: str, e: BaseException, needed: int | None) -> SaveError:
    """`needed`: the file's size, or None when it was written piece by piece (unknown)."""
    why, full = _reason(e)
    directory = os.path.dirname(os.path.abspath(path))
    text = f"cannot write {path}: {why}"
    if full:
        free = free_bytes(directory)
        text += (f" ({'' if needed is None else f'it needs about {_mb(needed)}; '}"
                 f"{'?' if free is None else _mb(free)} free in {directory})")
    error = SaveError(text)
    error.disk_full = full
    return error


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "wb", tmp: str | None = None, size: int | None = None):
    """A file opened for writing (`mode`) under a temporary name, fsynced and renamed to
    `path` when the block ends: for what is written piece by piece. On any error the
    temporary file is removed; an OSError becomes SaveError naming `path` (`size`: the
    bytes it needs, if known)."""
    tmp = tmp or f"{path}.tmp-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, mode) as f:
            yield f
            f.flush()
            if DURABLE:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        _remove(tmp)
        raise save_error(path, e, size) from None
    except BaseException:
        _remove(tmp)
        raise


def write_bytes(path: str, data, tmp: str | None = None,
                midway: Callable[[], object] | None = None) -> None:
    """Write `data` (bytes-like) to `path` atomically; SaveError if it cannot be done.
    `midway()` is called once half of it is written (a test's point of failure)."""
    with atomic_file(path, "wb", tmp, size=len(data)) as f:
        if midway is None:
            f.write(data)
            return
        half = len(data) // 2
        f.write(data[:half])
        f.flush()
        midway()
        f.write(data[half:])


def write_hdf5(path: str, datasets: dict, attrs: dict,
               midway: Callable[[], object] | None = None) -> None:
    """Write datasets and attributes to `path` atomically; SaveError if it cannot be done
    (`midway` as for write_bytes).

    The HDF5 file is built in memory and written with plain writes: the HDF5 library, when a
    write fails under it, leaves objects it can no longer close and crashes at exit. That
    costs a copy of the file in memory for the moment it is written."""
    import h5py  # not at the top: ranks that open no HDF5 file skip its import (start-up time)
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        for name, data in datasets.items():
            f.create_dataset(name, data=data)
        for name, value in attrs.items():
            # A str enum (a configuration's choice) as its plain string: h5py stores only str.
            f.attrs[name] = str(value) if isinstance(value, str) else value
    write_bytes(path, image.getbuffer(), midway=midway)


@contextlib.contextmanager
def open_hdf5(path: str):
    """`path` opened for reading (an h5py.File), as a context manager; DamagedFile naming it
    and what to do if it cannot be read (h5py's own error names no file)."""
    import h5py  # not at the top: ranks that open no HDF5 file skip its import (start-up time)
    try:
        with h5py.File(path, "r") as f:
            yield f
    except OSError as e:
        raise DamagedFile(_unreadable(path, e)) from None


def _unreadable(path: str, e: OSError) -> str:
    """One line on why HDF5 file `path` could not be read, and what to do."""
    text = str(e)
    short = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", text)
    if short:
        return (f"{path}: cut short ({int(short[1]):,} of its {int(short[2]):,} bytes; a copy "
                f"that did not finish?): copy it again from where it was written")
    if e.errno:
        return f"{path}: {os.strerror(e.errno)}"
    why = "not an HDF5 file" if "file signature not found" in text else \
        f"damaged ({(text.splitlines() or [type(e).__name__])[0][:200]})"
    return f"{path}: {why}: copy it again from where it was written, or write it anew"


def write_json(path: str, value) -> None:
    """Write `value` as JSON to `path` atomically; SaveError if it cannot be done. Numbers
    must be finite (strict JSON)."""
    text = json.dumps(value, indent=2, allow_nan=False) + "\n"
    write_bytes(path, text.encode(), tmp=f"{path}.tmp")


def keep_trying(write, wait_s: float, what: str, every: float = 5.0):
    """Call write() until it succeeds, for at most `wait_s` seconds after the first failure
    (what it writes stays in memory meanwhile); the last SaveError if it never does. Only a
    full disk is worth waiting for: other failures are raised at once."""
    try:
        return write()
    except SaveError as e:
        if not getattr(e, "disk_full", False) or wait_s <= 0:
            raise
        every = min(every, wait_s)
        log.error("%s; %s is kept in memory: free some space, it is tried again every %g s "
                  "for up to %g s", e, what, every, wait_s)
        deadline = time.monotonic() + wait_s
        while True:
            time.sleep(min(every, max(deadline - time.monotonic(), 0)))
            try:
                result = write()
            except SaveError as again:
                if time.monotonic() >= deadline:
                    raise SaveError(
                        f"{again}; gave up after waiting {wait_s:g} s for space") from again
                continue
            log.warning("wrote %s after all", what)
            return result

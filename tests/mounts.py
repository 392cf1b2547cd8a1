"""Real small or read-only file systems for tests of full and read-only disks: tmpfs mounts,
which need root. Where a mount cannot be made the test skips and says why (fails in CI)."""
import contextlib
import os
import subprocess

from support import cannot


@contextlib.contextmanager
def tmpfs(path, size: str = "1m", read_only: bool = False):
    """A tmpfs of `size` mounted at `path` for the duration (read-only if asked)."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        cannot("mounting a small file system needs root")
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        cannot(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory, leave: int) -> str:
    """Fill the file system of `directory` with a ballast file until `leave` bytes are free;
    returns the ballast's path (remove it to free the space)."""
    ballast = os.path.join(directory, "ballast")
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    with open(ballast, "wb") as f:
        f.write(b"\0" * max(free - leave, 0))
    return ballast

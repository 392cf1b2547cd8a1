"""Debian packages some tests need (Slurm and munge, h5dump, Chromium), installed with apt-get
when missing.

`make test` runs this file with the system's python3 beside the test venv's install
(`python3 tests/debian.py`): one `apt-get update` and one install of every package missing,
so that no test waits for apt-get on a new machine (three of them, each with its own update,
took a minute or more of the suite there). A test still installs what it needs itself where
that was not done (pytest run by hand), one of these apt-gets at a time.

Where installing cannot be done (not root, no apt-get), the test skips and says why; with
MPIPS_REQUIRE_SYSTEM_TESTS=1 (set by .ci/run) it fails instead, so CI cannot skip them."""
import fcntl
import os
import shutil
import subprocess
import sys

# (the commands a test runs, the packages that give them)
SLURM = (("slurmctld", "slurmd", "munged"), ("slurm-wlm", "munge"))
H5DUMP = (("h5dump",), ("hdf5-tools",))
CHROMIUM = (("chromium",), ("chromium",))
NEEDED = (SLURM, H5DUMP, CHROMIUM)
# How long an apt-get waits for another one's lock (make test's, while a test asks).
LOCK_WAIT_S = 900
LOCK_FILE = "/tmp/mpips-tests-apt.lock"


def _missing(commands) -> list:
    return [c for c in commands if not shutil.which(c)]


def _why_not() -> str | None:
    """Why apt-get cannot install here, or None."""
    if os.geteuid() != 0:
        return "installing needs root"
    if not shutil.which("apt-get"):
        return "apt-get is not available"
    return None


def _apt(packages) -> None:
    """apt-get update, then install `packages`, one apt-get of these tests' at a time (a lock
    file: apt-get's own lock makes `update` fail at once rather than wait); RuntimeError with
    apt-get's words if either fails."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ("-o", f"DPkg::Lock::Timeout={LOCK_WAIT_S}")
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for cmd in (["apt-get", *wait, "update", "-qq"],
                    ["apt-get", *wait, "install", "-y", "-qq", *packages]):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=LOCK_WAIT_S + 900)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")


def ensure(needed: tuple) -> None:
    """Make the commands of `needed` (one of NEEDED) available, installing its packages if
    any is missing; skip (or fail, in CI) where that cannot be done."""
    commands, packages = needed
    if not _missing(commands):
        return
    from support import cannot
    missing = ", ".join(_missing(commands))
    why = _why_not()
    if why:
        cannot(f"{missing} not installed, and {why} to install {' '.join(packages)}")
    _apt(packages)
    still = _missing(commands)
    if still:
        raise RuntimeError(f"installed {' '.join(packages)}, but {', '.join(still)} still "
                           f"missing")


def install_all() -> int:
    """Every package of NEEDED that is missing, in one apt-get run (or, if that fails, one
    run for each set, so that one package this system lacks costs only its own tests); says
    what it did. Exit status 0 whatever happens: a test that needs a package says why it is
    missing."""
    wanted = [pkgs for commands, pkgs in NEEDED if _missing(commands)]
    if not wanted:
        return 0
    packages = [p for pkgs in wanted for p in pkgs]
    why = _why_not()
    if why:
        print(f"tests/debian.py: {' '.join(packages)} not installed ({why}): the tests that "
              f"need them will skip, or fail with MPIPS_REQUIRE_SYSTEM_TESTS=1")
        return 0
    print(f"tests/debian.py: installing {' '.join(packages)} with apt-get", flush=True)
    for attempt in ([packages], wanted) if len(wanted) > 1 else ([packages],):
        failed = []
        for some in attempt:
            try:
                _apt(some)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failed.append(f"{e}")
        if not failed:
            return 0
    print("tests/debian.py: " + "\n".join(failed) +
          "\n(the tests that need them will try again and say why)")
    return 0


if __name__ == "__main__":
    sys.exit(install_all())

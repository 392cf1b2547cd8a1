"""Debian packages some tests need (Slurm, munge, h5dump), installed with apt-get when missing.

Where that cannot be done (not root, no apt-get), the test skips and says why; with
MPIPS_REQUIRE_SYSTEM_TESTS=1 (set by .ci/run) it fails instead, so CI cannot skip them."""
import os
import shutil
import subprocess

from support import cannot


def ensure(commands: list, packages: list) -> None:
    """Make `commands` available, installing `packages` if any is missing; skip otherwise."""
    if all(shutil.which(c) for c in commands):
        return
    missing = ", ".join(c for c in commands if not shutil.which(c))
    if os.geteuid() != 0:
        cannot(f"{missing} not installed, and installing {' '.join(packages)} needs root")
    if not shutil.which("apt-get"):
        cannot(f"{missing} not installed, and apt-get is not available to install "
               f"{' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", *packages]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    still = [c for c in commands if not shutil.which(c)]
    assert not still, f"installed {' '.join(packages)}, but {', '.join(still)} still missing"

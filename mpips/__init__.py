"""mpips: parameter-server training for HPC clusters, on MPI.

`mpips.load(path)` opens a trained model or a checkpoint in one process; `mpips.train(...)`
runs a training job from a script under mpiexec (see mpips.api).
"""
__version__ = "0.1.0"


def load(path):
    """A trained model (a run, its model directory, or a checkpoint), its checksums verified:
    see mpips.api.Model (mpips.api.FullBatchModel for --solver lbfgs)."""
    from .api import load as load_model
    return load_model(path)


def train(**options):
    """A training job from a script under mpiexec: see mpips.api.train."""
    from .api import train as run
    return run(**options)

"""mpips: parameter-server training for HPC clusters, on MPI.

What a user imports comes from here:
- a job from a script: `mpips.train(**options)` (the options of `python -m mpips train`);
- a trained model: `mpips.load(path)`;
- the parameter server by hand, after ps-lite: `mpips.split` (roles), `mpips.serve` (a
  server's loop), `mpips.KVWorker` (pull, push, wait), `mpips.DenseClient` (dense tables),
  `mpips.Optimizer`;
- the errors: `mpips.MpipsError` and its kinds.

Names are imported on first use, so that `import mpips` stays cheap for every rank; the
packages below (`mpips.worker`, `mpips.server`, ...) are the implementation and may move.
"""
from .base.version import __version__

_PUBLIC = {
    "KVWorker": "worker.kvworker",
    "DenseClient": "worker.dense_client",
    "serve": "server.loop",
    "split": "ranks.roles",
    "Roles": "ranks.roles",
    "Optimizer": "models.optimizer",
    "load": "api",
    "train": "api",
    "Model": "api",
    "FullBatchModel": "api",
    **dict.fromkeys(("MpipsError", "ConfigError", "InputError", "DamagedFile", "ProtocolError",
                     "WaitTimeout", "Interrupted", "Stopped", "SaveError", "CheckpointsFailing",
                     "Diverged"), "base.errors"),
}

__all__ = [*sorted(_PUBLIC), "__version__"]


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mpips' has no attribute {name!r}")
    from importlib import import_module
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__

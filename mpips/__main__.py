import gc
import os
import sys

# numba asks, as it loads, whether scipy's BLAS is there (for np.dot in jitted code) by
# importing scipy.linalg: a quarter of a second for every rank of every launch, and for every
# `score`, when scipy is installed. No mpips kernel calls BLAS (the network's layers use
# numpy's), and no command uses anything of scipy.
if "scipy.linalg.cython_blas" not in sys.modules:
    sys.modules["scipy.linalg.cython_blas"] = None  # type: ignore[assignment]  # None: not importable
# numba imports yaml (10 ms) only to read a .numba_config.yaml in the working directory, if
# there is one: where there is none, it need not be importable.
if "yaml" not in sys.modules and not os.path.isfile(".numba_config.yaml"):
    sys.modules["yaml"] = None  # type: ignore[assignment]
if sys.argv[1:2] == ["train"]:
    # Start-up makes about 150,000 objects that live as long as the process (numba's above
    # all), and the cyclic collector would go over them again and again: 40 ms of a rank's
    # 0.4 s. It stays off until startup.ready, which keeps them out of later collections.
    gc.disable()
    # numpy's OpenBLAS starts a thread for every core as it loads (about 40 ms of each rank's
    # start), and ranks that fill the cores then share them with each other's BLAS threads,
    # which spin: the power iteration on the defaults' sample took 0.3 s instead of 0.04.
    # A rank's BLAS gets its share of its node's cores (OPENBLAS_NUM_THREADS, if set, wins).
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or os.environ.get("MPI_LOCALNRANKS")
    if local and local.isdigit() and not {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"} & set(
            os.environ):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        os.environ["OPENBLAS_NUM_THREADS"] = str(max(1, cores // max(int(local), 1)))

from .cli.main import main

main()

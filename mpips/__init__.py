"""mpips: parameter-server training for HPC clusters, on MPI."""
__version__ = "0.1.0"

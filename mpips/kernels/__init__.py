"""numba kernels: pure functions over numpy arrays. Nothing in here talks MPI."""

"""numba kernels: pure functions over numpy arrays. Nothing in here talks MPI, and nothing
imports the rest of mpips. `jit` says how they are compiled: ahead of time by `make kernels`,
or by numba as a process first calls them."""

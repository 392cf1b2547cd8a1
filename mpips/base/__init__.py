"""Foundations with no MPI in them: the errors mpips reports, logging, atomic file writes,
the memory budget, a rank's timeline of figures, and the operating system's view of a
process. May import: nothing of mpips but kernels (and nothing else in base imports MPI)."""

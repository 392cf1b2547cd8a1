"""What workers and servers agree on, with no MPI in it: the message format and its ops, the
MPI tags, where each key lives (placement), the clocks of consistency, and how dense tables
are cut in blocks. May import: kernels, base."""

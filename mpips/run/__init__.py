"""What every rank of one run shares: the configuration and its options, start-up checks and
numba warm-up, stop signals, test events, and the summary of a finished job.
May import: every package below job (kernels, base, ranks, wire, data, storage, models,
pipeline, worker, recovery, membership, server)."""

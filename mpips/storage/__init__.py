"""What a job leaves on disk: the run directory and its lock, checkpoints, model files and
dense-table files, all plain HDF5 or JSON written atomically.
May import: base, ranks, wire, data."""

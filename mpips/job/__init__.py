"""A training job, rank by rank: the part each role plays (server, worker, full-batch worker,
pipeline stage), scoring the test rows, and failing together.
May import: every package below it (run and everything run may import)."""

"""What workers and servers agree on: the message format and its ops, where each key lives
(placement), the clocks of consistency, and how dense tables are cut in blocks.
May import: kernels, base."""

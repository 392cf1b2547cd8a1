"""Training data: text and binary-shard readers, conversion, synthetic data, which rows each
worker trains (work plans and hand-overs), and fingerprints of inputs.
May import: kernels, base, wire, ranks."""

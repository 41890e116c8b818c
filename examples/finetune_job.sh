#!/bin/bash
# A job script as researchers write them: go to the submit directory, set up,
# run the training under torchrun (2 workers here; one per GPU on a real node).
#
#   gbroker submit examples/finetune_job.toml
#
# Nothing in it is there for gbroker. gbroker's batch script runs it in a
# process group of its own and sends the time-limit warning to the whole
# group, this shell included: bash dies of it at once, while torchrun (told
# by PET_SIGNALS_TO_HANDLE, which gbroker sets) passes it on to its workers,
# which save, record the save with reason "signal" and exit 75. gbroker waits
# for the whole group, sees the mark the save left for this attempt, and runs
# the next attempt from that checkpoint even though torchrun turned 75 into 1.
set -u
cd "${SLURM_SUBMIT_DIR:-.}"

PY=${GBROKER_ML_PYTHON:-/opt/gbroker/venv-ml/bin/python}
echo "finetune_job.sh: attempt ${GBROKER_ATTEMPT:-1} of job ${GBROKER_JOB_ID:-?} (Slurm job ${SLURM_JOB_ID:-none}, restart ${SLURM_RESTART_COUNT:-0}) in $PWD"
"$PY" -m torch.distributed.run --standalone --nproc-per-node=2 examples/torchrun_finetune.py "$@"

#!/bin/bash
# A job script as researchers write them: go to the submit directory, set up,
# run the training under torchrun (2 workers here; one per GPU on a real
# node), and tell gbroker what happened through the exit status.
#
#   gbroker submit examples/finetune_job.toml
#
# Three things make it work under gbroker:
#  * The warning signal comes to the whole process group, this shell
#    included. A plain bash killed by it would end the job while the workers
#    are still saving, so the shell traps it (a trap with a command, not '':
#    an ignored signal would stay ignored in every program started below).
#  * torchrun forwards SIGTERM to its workers by default; SIGUSR1 only when
#    listed in --signals-to-handle (it is here).
#  * torchrun ends with 1 when a worker ends with 75, so the script asks the
#    manifest whether this attempt stopped after saving on the signal, and
#    then exits 75 itself ("resume me").
# A single-process job needs none of this: end the script with
#   exec /opt/gbroker/venv-ml/bin/python train.py
# and the program itself gets the signal and gives the exit status.
set -u
cd "${SLURM_SUBMIT_DIR:-.}"

PY=${GBROKER_ML_PYTHON:-/opt/gbroker/venv-ml/bin/python}
trap 'echo "finetune_job.sh: got SIGUSR1, the workers are saving" >&2' USR1
trap 'echo "finetune_job.sh: got SIGTERM, the workers are saving" >&2' TERM

echo "finetune_job.sh: attempt ${GBROKER_ATTEMPT:-1} of job ${GBROKER_JOB_ID:-?} (Slurm job ${SLURM_JOB_ID:-none}, restart ${SLURM_RESTART_COUNT:-0}) in $PWD"
# In the foreground: bash runs a trap only once torchrun has ended.
"$PY" -m torch.distributed.run --standalone --nproc-per-node=2 \
    --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
    examples/torchrun_finetune.py "$@"
status=$?

if [ "$status" -ne 0 ] && "$PY" -m broker.checkpoint stopped-on-signal; then
    echo "finetune_job.sh: saved on the signal; exit 75 so gbroker resumes the next attempt from it"
    exit 75
fi
exit "$status"

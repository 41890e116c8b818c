#!/bin/bash
# gbroker batch script. Generated; every Slurm option is given on the sbatch command line.
set -u
export GBROKER_JOB_ID=j-000009
export GBROKER_ATTEMPT=$(( 1 + ${SLURM_RESTART_COUNT:-0} ))
export GBROKER_CHECKPOINT_DIR=/scratch/ck/j9
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then export GBROKER_RESUME_FROM="$GBROKER_CHECKPOINT_DIR"; fi
export GBROKER_WARNING_SECONDS=90
export GBROKER_WARNING_SIGNAL=USR1
export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
mkdir -p -- "$GBROKER_CHECKPOINT_DIR"
script_file=$(mktemp "${TMPDIR:-/tmp}/gbroker-script.XXXXXX")
trap 'rm -f -- "$script_file"' EXIT
printf '%s' IyEvYmluL2Jhc2gKI1NCQVRDSCAtLXBhcnRpdGlvbj1vbmRlbWFuZAplY2hvICJpdCdzICRHQlJPS0VSX0pPQl9JRCIK | base64 -d > "$script_file"

note() { printf '=== gbroker: %s (%s) ===\n' "$*" "$(date -u +%Y-%m-%dT%H:%M:%SZ)"; }
note "job $GBROKER_JOB_ID attempt $GBROKER_ATTEMPT starts: Slurm job ${SLURM_JOB_ID:-?}, restart ${SLURM_RESTART_COUNT:-0}, on $(hostname)"

# Run the program in a process group of its own, so signals reach all of it.
child=0
interrupted=0
warned=0
early=""
# To the program's process group. Just after the start, setsid may not have made it yet (it
# runs in the child), and a signal sent to the child then can land before the child has
# dropped the script's traps, and be lost: wait for the group, up to a second.
send() {
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        kill -s "$1" -- "-$child" 2>/dev/null && return 0
        kill -0 "$child" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -s "$1" "$child" 2>/dev/null || true
}
forward() {
    interrupted=1
    if [ "$1" = "${GBROKER_WARNING_SIGNAL:-}" ]; then
        warned=1
    fi
    if [ "$child" -ne 0 ]; then
        note "SIG$1 ($2) sent to the job"
        send "$1"
    else
        # Between starting the program and learning its pid: sent just after.
        early="$1 $2"
    fi
}
trap 'forward USR1 "time-limit warning"' USR1
trap 'forward TERM "Slurm stops the job"' TERM

setsid /bin/bash "$script_file" &
child=$!
if [ -n "$early" ]; then
    forward "${early%% *}" "${early#* }"
fi

# A trapped signal makes `wait` return early (status > 128) while the program
# still runs; wait again until it has really exited and keep its status.
status=0
while :; do
    interrupted=0
    wait "$child"
    rc=$?
    if [ "$rc" -eq 127 ] && [ "$status" -gt 128 ]; then
        rc=$status
    fi
    status=$rc
    if [ "$interrupted" -eq 1 ] && [ "$rc" -gt 128 ] && kill -0 "$child" 2>/dev/null; then
        continue
    fi
    if [ "$interrupted" -eq 1 ] && [ "$rc" -gt 128 ]; then
        # The program ended while we were forwarding; collect its real status.
        wait "$child" 2>/dev/null
        rc=$?
        if [ "$rc" -ne 127 ]; then
            status=$rc
        fi
    fi
    break
done
# The rest of its group may still run: a trainer saving after the wrapper that started it died.
while kill -0 -- "-$child" 2>/dev/null; do
    sleep 1
done
if [ "$status" -gt 128 ]; then
    note "the program was ended by signal $((status - 128))"
fi
if [ "$status" -eq 75 ] || [ -e "$GBROKER_CHECKPOINT_DIR/.gbroker-stopped-$GBROKER_ATTEMPT" ]; then
    note "the program saved and asks to go on in a new run"
    status=75
elif [ "$warned" -eq 1 ] && [ "$status" -ne 0 ] && [ -e "$GBROKER_CHECKPOINT_DIR/.gbroker-finished-$GBROKER_ATTEMPT" ]; then
    note "the program had done all its work when the time-limit warning came (status $status): completed"
    status=0
elif [ "$warned" -eq 1 ] && [ "$status" -ne 0 ]; then
    note "the program ended (status $status) after the time-limit warning: it ran out of time"
    status=124
fi
exit "$status"

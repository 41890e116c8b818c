#!/bin/bash
# gbroker batch script. Generated; every Slurm option is given on the sbatch command line.
set -u
export GBROKER_JOB_ID=j-000009
export GBROKER_ATTEMPT=$(( 1 + ${SLURM_RESTART_COUNT:-0} ))
export GBROKER_CHECKPOINT_DIR=/scratch/ck/j9
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then export GBROKER_RESUME_FROM="$GBROKER_CHECKPOINT_DIR"; fi
export GBROKER_WARNING_SECONDS=90
mkdir -p -- "$GBROKER_CHECKPOINT_DIR"
script_file=$(mktemp "${TMPDIR:-/tmp}/gbroker-script.XXXXXX")
trap 'rm -f -- "$script_file"' EXIT
printf '%s' IyEvYmluL2Jhc2gKI1NCQVRDSCAtLXBhcnRpdGlvbj1vbmRlbWFuZAplY2hvICJpdCdzICRHQlJPS0VSX0pPQl9JRCIK | base64 -d > "$script_file"

# Run the program in the background so this shell can forward signals to it.
child=0
interrupted=0
forward() {
    interrupted=1
    if [ "$child" -ne 0 ]; then
        kill -s "$1" "$child" 2>/dev/null || true
    fi
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

/bin/bash "$script_file" &
child=$!

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
exit "$status"

#!/bin/bash
# Stop what slurm/ci/setup_slurm.sh started, as recorded in its STATE_FILE:
#
#   slurm/ci/teardown_slurm.sh [STATE_FILE]      # default /run/cast-slurm-ci.started
#
# slurm: cancel the remaining jobs, `scontrol shutdown` (stops slurmctld and every slurmd), wait
# for them by their pid files (/run/slurmd-NODE.pid, one per node), clear the spool state.
# munged: stopped by its pid file.
set -uo pipefail
STATE=${1:-/run/cast-slurm-ci.started}
[ -f "$STATE" ] || exit 0
started=$(sort -u "$STATE" | tr '\n' ' ')

stop_pid_file() { # stop_pid_file FILE: wait up to 10 s for the process to end, then SIGTERM it
    local pid deadline=$((SECONDS + 10))
    pid=$(cat "$1" 2>/dev/null) || return 0
    [ -n "$pid" ] || return 0
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill "$pid"
    return 0
}

if grep -qx slurm "$STATE"; then
    scancel --user="$(id -un)" 2>/dev/null
    scontrol shutdown 2>/dev/null
    for pid_file in /run/slurmctld.pid /run/slurmd.pid /run/slurmd-*.pid; do
        [ -e "$pid_file" ] && stop_pid_file "$pid_file"
        rm -f "$pid_file"
    done
    rm -rf /var/spool/slurmctld/* /var/spool/slurmd/*
fi
if grep -qx munged "$STATE"; then
    pid=$(cat /run/munge/munged.pid 2>/dev/null) && kill "$pid" 2>/dev/null
fi
rm -f "$STATE"
echo "teardown_slurm: stopped ${started:-nothing}"

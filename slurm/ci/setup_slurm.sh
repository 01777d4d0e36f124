#!/bin/bash
# Start a two-node Slurm on this one machine for tests and CI: slurm-wlm + munge from Debian's
# packages, daemons started by hand (no systemd, no cgroups, no accounting). Follows the tested
# recipe in shared/notes/slurm.md. Run as root:
#
#   slurm/ci/setup_slurm.sh [STATE_FILE]        # then slurm/ci/teardown_slurm.sh [STATE_FILE]
#
# The partition `debug` has two nodes, n1 and n2, both on this host: one slurmctld and two slurmd
# (`slurmd -N n1`, `slurmd -N n2`), each with its own port and its own spool dir, pid file and log
# (the `%n` paths in slurm.conf). Each node offers all of the host's CPUs, so the CPUs are
# overcommitted two to one; a job on one node gets what a one-node Slurm would give it.
# Installs the packages only when slurmctld is missing. Starts only what is not already
# running, and records what it started (munged, slurm) in STATE_FILE
# [/run/cast-slurm-ci.started] so that teardown_slurm.sh stops exactly that. Writes
# /etc/slurm/slurm.conf only when there is none or it is one this script wrote.
# Exit status 77: Slurm cannot be set up here (not root, no apt-get, or the install failed).
set -euo pipefail
STATE=${1:-/run/cast-slurm-ci.started}
MARKER="# written by cast_rl slurm/ci/setup_slurm.sh"
NODES=(n1 n2)
export DEBIAN_FRONTEND=noninteractive

say() { echo "setup_slurm: $*"; }
unavailable() {
    say "$*"
    exit 77
}
wait_for() { # wait_for SECONDS COMMAND...: poll COMMAND every half second
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

[ "$(id -u)" -eq 0 ] || unavailable "needs root (it installs packages and starts daemons)"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || unavailable "slurm-wlm is not installed and there is no apt-get"
    say "installing slurm-wlm and munge"
    { apt-get update -q && apt-get install -y -q slurm-wlm munge; } ||
        unavailable "apt-get could not install slurm-wlm and munge"
fi
touch "$STATE"

# --- munge: the key comes with the package's postinst; /run/munge does not exist without systemd
munge_ok() { munge -n | unmunge; }
if ! munge_ok >/dev/null 2>&1; then
    [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    echo munged >>"$STATE"
    wait_for 10 munge_ok || {
        say "munged did not answer"
        exit 1
    }
fi

# --- slurmctld + slurmd
if timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; then
    say "a Slurm controller is already running; using it"
else
    conf=/etc/slurm/slurm.conf
    if [ ! -e "$conf" ] || grep -qF "$MARKER" "$conf"; then
        host=$(hostname -s)
        addr=""
        # Both nodes live on this host: NodeHostname is `hostname -s`; where that name does not
        # resolve, give the loopback address explicitly.
        getent hosts "$host" >/dev/null || addr=127.0.0.1
        mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
        node_lines=""
        for i in "${!NODES[@]}"; do
            node_lines+="NodeName=${NODES[$i]} NodeHostname=$host${addr:+ NodeAddr=$addr} Port=$((6818 + i))"
            node_lines+=" CPUs=$(nproc) RealMemory=$((mem * 9 / 10)) State=UNKNOWN"$'\n'
        done
        mkdir -p /etc/slurm
        cat >"$conf" <<CONF
$MARKER
ClusterName=ci
SlurmctldHost=${host}${addr:+($addr)}
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
${node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    else
        say "keeping the existing $conf (not written by this script); one slurmd for this host"
        NODES=("")
    fi
    install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm
    echo slurm >>"$STATE"
    slurmctld # the daemons fork into the background and write their pid files
    for node in "${NODES[@]}"; do
        if [ -n "$node" ]; then
            install -d "/var/spool/slurmd/$node"
            slurmd -N "$node"
        else
            slurmd
        fi
    done
fi

nodes_idle() { # every node up; resume the ones that came up down or drained
    local node state ok=0
    while read -r node state; do
        case "$state" in
        idle | mix | alloc) ;;
        down* | drain* | drng*)
            scontrol update nodename="$node" state=resume
            ok=1
            ;;
        *) ok=1 ;;
        esac
    done < <(sinfo -h -N -o '%N %t' 2>/dev/null)
    [ -n "$(sinfo -h -N -o %N 2>/dev/null)" ] && return $ok
}
if ! wait_for 30 nodes_idle; then
    say "the Slurm nodes did not become idle:"
    sinfo -N -l || true
    tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd*.log || true
    exit 1
fi
sinfo

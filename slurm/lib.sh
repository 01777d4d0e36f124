# shellcheck shell=bash
# Functions shared by cast_single_node.sbatch and cast_multinode.sbatch; sourced, never run.
#
# The pattern (tested on slurm-wlm 22.05 + Ray 2.60, see slurm/README.md): every Ray node is one
# `srun --overlap ... ray start --block` step, so Slurm tracks all of its processes; the batch
# script waits for the head and for every node, submits the cast_rl job with `ray job submit`,
# exits with the job's status, and at exit stops Ray (`ray stop`, optional) and ends the steps
# (SIGTERM to srun makes Slurm kill the step, and nothing is left behind).
#
# Globals set here: CAST_SRUN_PIDS (srun steps to end at exit), CAST_HEAD_PID, CAST_HEAD_IP,
# CAST_DASHBOARD_URL, CAST_NODES (every node of the Ray cluster, head first).

CAST_SRUN_PIDS=()
CAST_NODES=()
CAST_HEAD_PID=""
CAST_HEAD_IP=""
CAST_TORN_DOWN=0

cast_log() {
    printf '[cast %(%H:%M:%S)T] %s\n' -1 "$*"
}

# Fill every configuration variable the caller left unset with its documented default.
cast_set_defaults() {
    : "${CAST_REPO:=${SLURM_SUBMIT_DIR:-$PWD}}"
    : "${CAST_VENV:=$CAST_REPO/.venv}"
    : "${CAST_ENTRY:=launchers.pipeline}"
    : "${CAST_CONFIG:=configs/quickstart.yaml}"
    : "${CAST_ARGS:=}"
    : "${CAST_RUN_DIR=$CAST_REPO/runs/slurm-${SLURM_JOB_ID:-local}}"
    : "${CAST_LOG_DIR:=$CAST_REPO/runs/slurm-${SLURM_JOB_ID:-local}}"
    : "${CAST_EXCLUDES:=.git .venv runs wandb **/__pycache__ .pytest_cache .ruff_cache .mypy_cache .hypothesis *.egg-info build dist}"
    : "${RAY_PORT:=6379}"
    : "${DASHBOARD_HOST:=127.0.0.1}"
    : "${DASHBOARD_PORT:=8265}"
    : "${RAY_NUM_CPUS:=${SLURM_CPUS_PER_TASK:-}}"
    : "${RAY_NUM_GPUS:=${SLURM_GPUS_PER_TASK:-}}"
    : "${RAY_OBJECT_STORE_BYTES:=}"
    : "${RAY_OBJECT_MANAGER_PORT:=}"
    : "${RAY_NODE_MANAGER_PORT:=}"
    : "${RAY_TMP_DIR:=}"
    : "${RAY_HEAD_IP:=}"
    : "${RAY_HEAD_EXTRA_ARGS:=}"
    : "${RAY_WORKER_EXTRA_ARGS:=}"
    : "${RAY_AUTH_MODE:=token}"
    : "${RAY_STOP_ON_EXIT:=1}"
    : "${WAIT_TIMEOUT_S:=300}"
    local host=$DASHBOARD_HOST
    case "$host" in "" | 0.0.0.0 | "::") host=127.0.0.1 ;; esac
    CAST_DASHBOARD_URL="http://$host:$DASHBOARD_PORT"
}

# Put the venv's python and ray first on PATH; every srun step and the job inherit it.
cast_activate() {
    if [ -n "$CAST_VENV" ]; then
        if [ ! -f "$CAST_VENV/bin/activate" ]; then
            cast_log "CAST_VENV=$CAST_VENV has no bin/activate; create it (make setup) or set CAST_VENV"
            return 1
        fi
        # shellcheck disable=SC1091
        source "$CAST_VENV/bin/activate"
    fi
    if ! command -v ray >/dev/null; then
        cast_log "no 'ray' command on PATH; install cast_rl into CAST_VENV (make setup)"
        return 1
    fi
    export RAY_USAGE_STATS_ENABLED=0
    mkdir -p "$CAST_LOG_DIR"
}

# Ray 2.60 token authentication: the head, every worker and every client must hold the same
# token. One token goes to all of them through the environment (srun passes it on): the
# caller's RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, else a
# fresh one for this job, saved (mode 600) as $CAST_LOG_DIR/ray_auth_token for clients such as
# `ray job logs`. RAY_AUTH_MODE=disabled turns authentication off.
cast_setup_auth() {
    export RAY_AUTH_MODE
    [ "$RAY_AUTH_MODE" = token ] || return 0
    if [ -z "${RAY_AUTH_TOKEN:-}" ]; then
        local file=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}
        if [ -s "$file" ]; then
            RAY_AUTH_TOKEN=$(<"$file")
        else
            RAY_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(32))')
            (
                umask 077
                printf '%s\n' "$RAY_AUTH_TOKEN" >"$CAST_LOG_DIR/ray_auth_token"
            )
            cast_log "fresh Ray auth token in $CAST_LOG_DIR/ray_auth_token"
        fi
    fi
    export RAY_AUTH_TOKEN
    unset RAY_AUTH_TOKEN_PATH # the token travels in the environment only
}

# The head's address as the other nodes reach it: RAY_HEAD_IP, else this host's address
# (skipping loopback, which /etc/hosts often gives for the host name).
cast_head_ip() {
    if [ -n "$RAY_HEAD_IP" ]; then
        echo "$RAY_HEAD_IP"
        return 0
    fi
    local ip
    ip=$(hostname --ip-address 2>/dev/null | awk '{print $1}')
    case "$ip" in "" | 127.* | ::1) ip=$(hostname -I 2>/dev/null | awk '{print $1}') ;; esac
    echo "$ip"
}

# Options of one srun step that runs a Ray node on node $1 (one task with the job's CPUs).
_cast_srun_args() {
    CAST_SRUN_ARGS=(--overlap --nodes=1 --ntasks=1 --nodelist="$1")
    # slurm 22.05's srun no longer reads SLURM_CPUS_PER_TASK: pass it, or Ray gets one CPU.
    if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
        CAST_SRUN_ARGS+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
    fi
}

# Options every `ray start` on node $2 gets; $1 holds extra options (RAY_HEAD_EXTRA_ARGS/
# RAY_WORKER_EXTRA_ARGS). `%n` in RAY_TMP_DIR becomes the node's name, so that Ray nodes sharing
# one host (several slurmd on one machine) keep their sessions and sockets apart.
_cast_ray_node_args() {
    CAST_RAY_ARGS=(--block --disable-usage-stats)
    [ -n "$RAY_NUM_CPUS" ] && CAST_RAY_ARGS+=(--num-cpus="$RAY_NUM_CPUS")
    [ -n "$RAY_NUM_GPUS" ] && CAST_RAY_ARGS+=(--num-gpus="$RAY_NUM_GPUS")
    [ -n "$RAY_OBJECT_STORE_BYTES" ] && CAST_RAY_ARGS+=(--object-store-memory="$RAY_OBJECT_STORE_BYTES")
    [ -n "$RAY_OBJECT_MANAGER_PORT" ] && CAST_RAY_ARGS+=(--object-manager-port="$RAY_OBJECT_MANAGER_PORT")
    [ -n "$RAY_NODE_MANAGER_PORT" ] && CAST_RAY_ARGS+=(--node-manager-port="$RAY_NODE_MANAGER_PORT")
    [ -n "$RAY_TMP_DIR" ] && CAST_RAY_ARGS+=(--temp-dir="${RAY_TMP_DIR//%n/$2}")
    local extra=()
    read -r -a extra <<<"$1"
    CAST_RAY_ARGS+=("${extra[@]}")
}

# Start the Ray head on node $1 as a background srun step; its log is $CAST_LOG_DIR/ray-head.log.
cast_start_head() {
    local node=$1 ip_args=()
    _cast_srun_args "$node"
    _cast_ray_node_args "$RAY_HEAD_EXTRA_ARGS" "$node"
    [ -n "$CAST_HEAD_IP" ] && ip_args=(--node-ip-address="$CAST_HEAD_IP")
    cast_log "ray head on $node (GCS port $RAY_PORT, dashboard $DASHBOARD_HOST:$DASHBOARD_PORT)"
    srun "${CAST_SRUN_ARGS[@]}" --job-name=ray-head \
        ray start --head --port="$RAY_PORT" \
        --dashboard-host="$DASHBOARD_HOST" --dashboard-port="$DASHBOARD_PORT" \
        "${ip_args[@]}" "${CAST_RAY_ARGS[@]}" >"$CAST_LOG_DIR/ray-head.log" 2>&1 &
    CAST_HEAD_PID=$!
    CAST_SRUN_PIDS+=("$CAST_HEAD_PID")
    CAST_NODES+=("$node")
}

# Start a Ray worker on node $1 that joins the head at $CAST_HEAD_IP:$RAY_PORT.
cast_start_worker() {
    local node=$1
    _cast_srun_args "$node"
    _cast_ray_node_args "$RAY_WORKER_EXTRA_ARGS" "$node"
    cast_log "ray worker on $node -> $CAST_HEAD_IP:$RAY_PORT"
    srun "${CAST_SRUN_ARGS[@]}" --job-name="ray-worker-$node" \
        ray start --address="$CAST_HEAD_IP:$RAY_PORT" "${CAST_RAY_ARGS[@]}" \
        >"$CAST_LOG_DIR/ray-worker-$node.log" 2>&1 &
    CAST_SRUN_PIDS+=("$!")
    CAST_NODES+=("$node")
}

# One look at the cluster through the dashboard: prints the ALIVE node count, or "0 <why>".
_cast_alive_nodes() {
    python - "$CAST_DASHBOARD_URL" 2>/dev/null <<'PY'
import sys

url = sys.argv[1]
try:
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_nodes

    JobSubmissionClient(url).list_jobs()  # the job API answers and accepts our token
    nodes = list_nodes(address=url, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
    print(len(nodes))
except Exception as exc:  # not up yet; the caller retries until WAIT_TIMEOUT_S
    print(0, type(exc).__name__, (str(exc).splitlines() or [""])[0][:200])
PY
}

# Wait until the dashboard answers and $1 nodes are ALIVE; fail early if a Ray step exits,
# give up after WAIT_TIMEOUT_S seconds.
cast_wait_nodes() {
    local want=$1 deadline=$((SECONDS + WAIT_TIMEOUT_S)) seen="" pid
    while :; do
        for pid in "${CAST_SRUN_PIDS[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                cast_log "a Ray node step ended before the cluster was up; logs: $CAST_LOG_DIR/ray-*.log"
                tail -n 20 "$CAST_LOG_DIR"/ray-*.log
                return 1
            fi
        done
        seen=$(_cast_alive_nodes)
        if [ "${seen%% *}" -ge "$want" ] 2>/dev/null; then
            cast_log "ray cluster up: ${seen%% *}/$want nodes after ${SECONDS}s"
            return 0
        fi
        if ((SECONDS >= deadline)); then
            cast_log "timed out after ${WAIT_TIMEOUT_S}s waiting for $want Ray nodes (last seen: ${seen:-nothing})"
            return 1
        fi
        sleep 2
    done
}

# Submit the cast_rl job and wait for it; returns its exit status (0 only for SUCCEEDED).
# The job runs `python -m $CAST_ENTRY $CAST_CONFIG cluster.address=auto [run_dir=$CAST_RUN_DIR]
# $CAST_ARGS` in an uploaded copy of CAST_REPO (minus CAST_EXCLUDES).
cast_submit_job() {
    local args=() excludes=() run_dir=() env_json id="cast-${SLURM_JOB_ID:-local}" rc status code
    read -r -a args <<<"$CAST_ARGS"
    read -r -a excludes <<<"$CAST_EXCLUDES"
    [ -n "$CAST_RUN_DIR" ] && run_dir=("run_dir=$CAST_RUN_DIR")
    env_json=$(python -c 'import json, sys; print(json.dumps({"excludes": sys.argv[1:]}))' "${excludes[@]}")
    cast_log "submitting $id: python -m $CAST_ENTRY $CAST_CONFIG ${run_dir[*]} $CAST_ARGS"
    ray job submit --address "$CAST_DASHBOARD_URL" --submission-id "$id" \
        --working-dir "$CAST_REPO" --runtime-env-json "$env_json" -- \
        python -m "$CAST_ENTRY" "$CAST_CONFIG" cluster.address=auto "${run_dir[@]}" "${args[@]}"
    rc=$?
    # `ray job submit` exits 1 only for FAILED (0 for STOPPED, or when its log stream drops while
    # the job still runs), so ask the job itself: wait for its end, take the driver's exit code.
    if ! read -r status code < <(_cast_job_result "$id"); then
        cast_log "job $id: no status from the cluster (ray job submit exited $rc)"
        return $((rc == 0 ? 1 : rc))
    fi
    cast_log "job $id: $status, exit code $code"
    return "$code"
}

# Wait for job $1 to end; prints "STATUS EXIT_CODE".
_cast_job_result() {
    python - "$CAST_DASHBOARD_URL" "$1" <<'PY'
import sys
import time

from ray.job_submission import JobStatus, JobSubmissionClient

client = JobSubmissionClient(sys.argv[1])
info = client.get_job_info(sys.argv[2])
while not info.status.is_terminal():  # bounded by the Slurm time limit
    time.sleep(5)
    info = client.get_job_info(sys.argv[2])
code = info.driver_exit_code
if info.status == JobStatus.SUCCEEDED:
    code = 0
elif code is None or code == 0:
    code = 1
elif code < 0:  # killed by a signal
    code = 128 - code
print(info.status.value, min(code, 255))
PY
}

# Stop Ray and end the srun steps; safe to call twice (it runs from the EXIT trap).
cast_teardown() {
    [ "$CAST_TORN_DOWN" = 1 ] && return 0
    CAST_TORN_DOWN=1
    [ "${#CAST_SRUN_PIDS[@]}" -gt 0 ] || return 0
    local n=${#CAST_NODES[@]} nodelist pid deadline
    if [ "$RAY_STOP_ON_EXIT" = 1 ]; then
        # `ray stop` stops every Ray process of this user on the node, not only this cluster's.
        nodelist=$(
            IFS=,
            echo "${CAST_NODES[*]}"
        )
        cast_log "ray stop on $nodelist"
        timeout 120 srun --overlap --nodes="$n" --ntasks="$n" --ntasks-per-node=1 \
            --nodelist="$nodelist" --job-name=ray-stop ray stop >>"$CAST_LOG_DIR/ray-stop.log" 2>&1
    fi
    # `ray start --block` outlives `ray stop`; SIGTERM to srun makes Slurm kill the whole step.
    kill -TERM "${CAST_SRUN_PIDS[@]}" 2>/dev/null
    deadline=$((SECONDS + 60))
    for pid in "${CAST_SRUN_PIDS[@]}"; do
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
            sleep 0.5
        done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    cast_log "ray steps ended"
}

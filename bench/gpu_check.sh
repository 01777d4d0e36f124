#!/usr/bin/env bash
# The device check in one command (``make gpu-check``): on a machine with CUDA GPUs, install the
# GPU extra into .venv-gpu and run, within 8 minutes, the ``gpu`` tests, the end-to-end GPU path
# (bench/gpu_check.py: vLLM engine on a GPU, bf16 FSDP2 step, one collective weight sync that
# changes the greedy answer), and the learner and weight-sync benchmarks (the collective path with
# LoRA adapter sync, then vLLM's weight-transfer API); the last line is one
# JSON object with every figure.  On a machine without CUDA GPUs it says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no CUDA GPU on this machine; nothing run"
  echo '{"gpu_check": "skipped", "reason": "no CUDA GPU"}'
  exit 0
fi

VENV=${GPU_VENV:-.venv-gpu}
PY=$VENV/bin/python
LOG=${GPU_CHECK_LOG:-runs/gpu-check}
mkdir -p "$LOG"
deadline=$((SECONDS + 480))
left() { echo $((deadline - SECONDS > 10 ? deadline - SECONDS : 10)); }

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
  # uv under pip's settings, as make setup installs (launchers/install.py): the CUDA stack's
  # gigabytes in a fraction of pip's time, which the device's minutes are counted in
  "$PY" -m launchers.install -e '.[gpu,dev]' > "$LOG/install.log" 2>&1 || { echo "gpu-check: install failed, see $LOG/install.log"; exit 1; }
fi
install_s=$SECONDS

timeout "$(left)" "$PY" -m pytest -q -m gpu tests > "$LOG/pytest-gpu.log" 2>&1
gpu_tests_rc=$?
gpu_tests=$(tail -1 "$LOG/pytest-gpu.log")

timeout "$(left)" "$PY" bench/gpu_check.py > "$LOG/gpu_check.log" 2>&1
e2e_rc=$?
e2e=$(tail -1 "$LOG/gpu_check.log")

timeout "$(left)" "$PY" bench/learner_throughput.py --workers 1 > "$LOG/learner.log" 2>&1
learner=$(tail -1 "$LOG/learner.log")

# the collective path and, with it, LoRA: the adapter alone into an engine serving adapters
timeout "$(left)" "$PY" bench/weight_sync.py --gpus --dtype bfloat16 --reps 2 > "$LOG/weight_sync.log" 2>&1
sync=$(tail -1 "$LOG/weight_sync.log")
# vLLM's own weight-transfer API (rollout.weight_sync=vllm_api) on the GPU pin
timeout "$(left)" "$PY" bench/weight_sync.py --gpus --dtype bfloat16 --reps 1 --path vllm_api --lora-rank 0 \
  > "$LOG/weight_sync_vllm_api.log" 2>&1
sync_api=$(tail -1 "$LOG/weight_sync_vllm_api.log")

"$PY" - "$install_s" "$gpu_tests_rc" "$gpu_tests" "$e2e_rc" "$e2e" "$learner" "$sync" "$sync_api" "$SECONDS" <<'PY'
import json, sys
install_s, tests_rc, tests, e2e_rc, e2e, learner, sync, sync_api, total = sys.argv[1:]
def parse(line):
    try:
        return json.loads(line)
    except ValueError:
        return {"error": line[-300:]}
print(json.dumps({"install_s": int(install_s), "gpu_tests": {"rc": int(tests_rc), "summary": tests},
                  "e2e": {"rc": int(e2e_rc), **parse(e2e)}, "learner_bench": parse(learner),
                  "weight_sync_bench": parse(sync), "weight_sync_vllm_api_bench": parse(sync_api),
                  "total_s": int(total)}))
PY
[ "$gpu_tests_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ]

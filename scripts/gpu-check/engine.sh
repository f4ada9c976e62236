#!/usr/bin/env bash
# GPU check for the inference_engine role: the real vLLM (CUDA build) serving a tiny
# random Llama with exactly the `vllm serve` arguments the role renders for
# accelerator nvidia, tensor-parallel over every visible GPU. Self-contained, < 10 min.
#
#   scripts/gpu-check/engine.sh            (from the repository root, on a GPU machine)
#
# Steps: a fresh virtualenv (with --system-site-packages, so a machine that already has
# torch/vLLM reuses them) + `pip install vllm==<role's version> ansible-core`; the tiny
# model; the arguments from the role's own unit, rendered by Ansible (ansible-playbook,
# through tests/unit/engine_render.py); serve; /health, /v1/models, a greedy completion;
# the KV-cache capacity line vLLM logs.
# Logs and a summary go to $OUT (or a temporary folder). Exit 0 only if all passed.
#
# Knobs (environment): VLLM_VERSION (default: the role's inference_engine_version),
# CHECK_PYTHON (an interpreter that already has vLLM and ansible-core: skips the venv
# and pip), PIP_INDEX_URL / PIP_FIND_LINKS (pip's own), PORT (default 18000).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
START=$(date +%s)
WORK=$(mktemp -d /tmp/inferfleet-gpu-engine.XXXXXX)
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT"
PORT=${PORT:-18000}
SUMMARY=$OUT/summary.txt
SERVER_PID=""

log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$SUMMARY"; }
fail() { log "FAIL: $*"; exit 1; }

cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  if [ -f "$OUT/engine.log" ]; then tail -n 40 "$OUT/engine.log" > "$OUT/engine.tail.log"; fi
}
trap cleanup EXIT

# VLLM_VERSION, install_vllm, tiny_model
# shellcheck source=scripts/gpu-check/common.sh
. "$ROOT/scripts/gpu-check/common.sh"


# 1. GPUs
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this check needs an NVIDIA GPU machine"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
NGPU=$(nvidia-smi --list-gpus | grep -c '^GPU ' || true)
[ "$NGPU" -ge 1 ] || fail "nvidia-smi lists no GPU"
log "GPUs: $NGPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs))"

# 2. vLLM in a fresh virtualenv (scripts/gpu-check/common.sh)
install_vllm

# 3. The tiny model, with enough attention heads to split over every GPU
tiny_model "$WORK/model" "$NGPU"

# 4. The arguments, from the role's own unit (accelerator nvidia, TP = all GPUs), rendered
#    by Ansible (render_engine, scripts/gpu-check/common.sh)
render_engine "$OUT/inferfleet-engine" \
  inference_engine_accelerator=nvidia \
  "inference_engine_model_path=$WORK/model" \
  inference_engine_served_model_name=tiny \
  inference_engine_host=127.0.0.1 \
  "inference_engine_port=$PORT" \
  "__inference_engine_tensor_parallel_size=$NGPU" \
  inference_engine_max_model_len=2048 \
  inference_engine_gpu_memory_utilization=0.5 \
  inference_engine_max_num_seqs=16 \
  'inference_engine_extra_args=[--enforce-eager]' \
  || fail "rendering the role's unit failed"
mapfile -t ARGS < <("$PY" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))))' \
  "$OUT/inferfleet-engine.args.json")
[ "${#ARGS[@]}" -gt 1 ] || fail "no serve arguments in the rendered unit"
log "vllm serve ${ARGS[*]}"

# 5. Serve, and wait until the model answers
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
"$VLLM_BIN" serve "${ARGS[@]}" > "$OUT/engine.log" 2>&1 &
SERVER_PID=$!
URL=http://127.0.0.1:$PORT
for _ in $(seq 1 150); do
  kill -0 "$SERVER_PID" 2>/dev/null || { tail -n 40 "$OUT/engine.log" | tee -a "$SUMMARY"; fail "vLLM exited before it was healthy"; }
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health" || true)" = 200 ] && break
  sleep 2
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health" || true)" = 200 ] || fail "/health not 200 within 300 s"
log "healthy"

curl -sf "$URL/v1/models" > "$OUT/models.json" || fail "/v1/models failed"
grep -q '"id":"tiny"' "$OUT/models.json" || fail "/v1/models does not list tiny: $(cat "$OUT/models.json")"

BODY='{"model":"tiny","prompt":"The quick brown fox","max_tokens":16,"temperature":0,"ignore_eos":true}'
for i in 1 2; do
  curl -sf "$URL/v1/completions" -H 'Content-Type: application/json' -d "$BODY" > "$OUT/completion$i.json" \
    || fail "completion $i failed"
done
"$PY" - "$OUT/completion1.json" "$OUT/completion2.json" <<'EOF' | tee -a "$SUMMARY" || fail "completion check failed"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["usage"]["completion_tokens"] == 16, a
assert a["choices"][0]["text"] == b["choices"][0]["text"], (a, b)
print("completion ok, greedy output repeatable:", repr(a["choices"][0]["text"]))
EOF

curl -sf "$URL/metrics" | grep -E '^vllm:(num_requests_running|kv_cache_usage_perc)' | head -n 4 >> "$SUMMARY" \
  || fail "/metrics lacks vLLM's gauges"

# 6. The KV-cache capacity line (the capacity planner is checked against it)
KV_LINE=$(grep -E 'KV cache size' "$OUT/engine.log" | head -n 1 || true)
[ -n "$KV_LINE" ] || fail "vLLM logged no KV cache size line"
log "KV cache: ${KV_LINE#*] }"
log "PASS in $(( $(date +%s) - START )) s (logs: $OUT)"

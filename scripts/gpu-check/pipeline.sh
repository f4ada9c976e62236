#!/usr/bin/env bash
# GPU check for multi-node instances (inference_engine, group backend native): two
# "nodes" on one host form one vLLM instance with pipeline parallelism 2 (rank 0 serves,
# rank 1 runs --headless), started with exactly the `vllm serve` arguments and the group
# environment the role renders for each rank. Self-contained, < 10 min.
#
#   scripts/gpu-check/pipeline.sh          (from the repository root, on a GPU machine)
#
# Steps: a fresh virtualenv (with --system-site-packages) + `pip install vllm==<role's
# version> ansible-core`; the tiny model; each rank's arguments (the words after `serve`
# on the role's unit) and EnvironmentFile values (VLLM_HOST_IP, NCCL_SOCKET_IFNAME,
# GLOO_SOCKET_IFNAME), rendered by Ansible from the role; both ranks pinned to their own
# GPUs (>= 2 GPUs: halves, TP = GPUs per half; 1 GPU: both on GPU 0, TP 1,
# --gpu-memory-utilization 0.4 each); /health, /v1/models, a greedy completion; rank 1's
# established connection to rank 0's master port (what the group watchdog relies on);
# then rank 1 is SIGKILLed and rank 0's behaviour for 30 s is recorded (never fails the
# check); finally one single-node server on one GPU must give the same greedy text as
# the pipeline.
# Logs and a summary go to $OUT (or a temporary folder). Exit 0 only if all passed.
#
# Knobs (environment): VLLM_VERSION (default: the role's inference_engine_version),
# CHECK_PYTHON (an interpreter that already has vLLM and ansible-core: skips the venv
# and pip), PIP_INDEX_URL / PIP_FIND_LINKS (pip's own), PORT, MASTER_PORT, REF_PORT
# (default: free ports), HEALTH_TIMEOUT (seconds for the group to answer, default 600),
# DTYPE (default bfloat16, the tiny model's own).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
START=$(date +%s)
WORK=$(mktemp -d /tmp/inferfleet-gpu-pipeline.XXXXXX)
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-600}
DTYPE=${DTYPE:-bfloat16}
# Process groups (each server runs under setsid: its pid is its process group's id).
RANK0_PG=""
RANK1_PG=""
REF_PG=""

log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$SUMMARY"; }
fail() {
  log "FAIL: $*"
  if grep -qs 'Duplicate GPU detected' "$OUT"/rank*.log; then
    log "NCCL refused two ranks of one communicator on the same GPU ('Duplicate GPU detected'):" \
        "the two ranks need GPUs of their own, so this check needs a machine with >= 2 GPUs"
  fi
  exit 1
}

group_alive() { [ -n "$1" ] && kill -0 -- "-$1" 2>/dev/null; }

# SIGTERM a server's process group, then SIGKILL whatever is left after 30 s.
stop_group() {
  local pg=$1
  group_alive "$pg" || return 0
  kill -TERM -- "-$pg" 2>/dev/null || true
  for _ in $(seq 1 30); do group_alive "$pg" || break; sleep 1; done
  kill -KILL -- "-$pg" 2>/dev/null || true
  for _ in $(seq 1 10); do group_alive "$pg" || break; sleep 1; done
  wait "$pg" 2>/dev/null || true
}

cleanup() {
  stop_group "$RANK1_PG"
  stop_group "$RANK0_PG"
  stop_group "$REF_PG"
  local name
  for name in rank0 rank1 reference; do
    if [ -f "$OUT/$name.log" ]; then tail -n 40 "$OUT/$name.log" > "$OUT/$name.tail.log"; fi
  done
}
trap cleanup EXIT

# VLLM_VERSION, install_vllm, tiny_model
# shellcheck source=scripts/gpu-check/common.sh
. "$ROOT/scripts/gpu-check/common.sh"


# 1. GPUs (and the tools the check uses)
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this check needs an NVIDIA GPU machine"
for tool in curl ss setsid python3; do
  command -v "$tool" >/dev/null || fail "$tool not found: this check needs it"
done
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
NGPU=$(nvidia-smi --list-gpus | grep -c '^GPU ' || true)
[ "$NGPU" -ge 1 ] || fail "nvidia-smi lists no GPU"
log "GPUs: $NGPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs))"

if [ "$NGPU" -ge 2 ]; then
  TP=$(( NGPU / 2 ))
  GPUS0=$(seq -s, 0 $(( TP - 1 )))
  GPUS1=$(seq -s, "$TP" $(( 2 * TP - 1 )))
  MEM_UTIL=0.5
  log "layout: rank 0 on GPUs $GPUS0, rank 1 on GPUs $GPUS1 (TP $TP per rank, PP 2)"
else
  TP=1
  GPUS0=0
  GPUS1=0
  MEM_UTIL=0.4
  log "layout: 1 GPU only: both ranks share GPU 0 (TP 1, PP 2), --gpu-memory-utilization 0.4" \
      "each; NCCL may refuse two ranks on one GPU ('Duplicate GPU detected')"
fi

# 2. vLLM in a fresh virtualenv (scripts/gpu-check/common.sh)
install_vllm

# 3. The tiny model (4 layers: 2 per pipeline stage), heads divisible by each rank's TP
tiny_model "$WORK/model" "$TP"

# 4. Ports, and each server's arguments and environment from the role
read -r FREE1 FREE2 FREE3 < <("$PY" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))') || fail "could not pick free ports"
PORT=${PORT:-$FREE1}
MASTER_PORT=${MASTER_PORT:-$FREE2}
REF_PORT=${REF_PORT:-$FREE3}

COMMON=(
  inferfleet_accelerator=nvidia
  "inference_engine_model_path=$WORK/model"
  inference_engine_served_model_name=tiny
  inference_engine_host=127.0.0.1
  inference_engine_max_model_len=2048
  inference_engine_max_num_seqs=16
  "inference_engine_dtype=$DTYPE"
  'inference_engine_extra_args=[--enforce-eager]'
)

# render NAME VAR=YAML...: NAME.service (the role's unit), NAME.args.json (the words after
# `serve` on its ExecStart) and NAME.env (the role's EnvironmentFile values, one KEY=VALUE
# a line), rendered by Ansible (render_engine, scripts/gpu-check/common.sh).
render() {
  local name=$1
  shift
  render_engine "$OUT/$name" "$@" || fail "rendering $name's unit and environment failed"
}

for R in 0 1; do
  render "rank$R" "${COMMON[@]}" \
    "inference_engine_gpu_count=$TP" \
    "inference_engine_tensor_parallel_size=$TP" \
    inference_engine_pipeline_parallel_size=2 \
    "inference_engine_gpu_memory_utilization=$MEM_UTIL" \
    "__inference_engine_group={\"size\": 2, \"rank\": $R, \"master_addr\": \"127.0.0.1\", \"address\": \"127.0.0.1\", \"interface\": \"lo\"}" \
    "inference_engine_master_port=$MASTER_PORT" \
    "inference_engine_port=$PORT"
done
render reference "${COMMON[@]}" \
  inference_engine_gpu_count=1 \
  inference_engine_tensor_parallel_size=1 \
  inference_engine_gpu_memory_utilization=0.5 \
  "inference_engine_port=$REF_PORT"

"$PY" - "$OUT" <<'EOF' || fail "the rendered arguments are not what a native pipeline group needs"
import json, sys
out = sys.argv[1]
r0, r1, ref = (json.load(open(f"{out}/{n}.args.json")) for n in ("rank0", "rank1", "reference"))
def value(args, flag):
    return args[args.index(flag) + 1] if flag in args else None
for rank, args in ((0, r0), (1, r1)):
    assert value(args, "--pipeline-parallel-size") == "2", args
    assert value(args, "--nnodes") == "2" and value(args, "--node-rank") == str(rank), args
    assert value(args, "--master-addr") == "127.0.0.1" and value(args, "--master-port"), args
    assert ("--headless" in args) == (rank == 1), args
    env = dict(l.split("=", 1) for l in open(f"{out}/rank{rank}.env").read().splitlines())
    for key, want in (("VLLM_HOST_IP", "127.0.0.1"), ("NCCL_SOCKET_IFNAME", "lo"),
                      ("GLOO_SOCKET_IFNAME", "lo")):
        assert env.get(key) == want, (rank, env)
for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"):
    assert flag not in ref, ref
assert value(ref, "--pipeline-parallel-size") in (None, "1"), ref
assert value(ref, "--dtype") == value(r0, "--dtype"), (ref, r0)
EOF

# launch NAME GPUS: `vllm serve` with NAME's arguments and environment in a process group
# of its own; sets LAUNCHED to its pid (= the group's id).
launch() {
  local name=$1 gpus=$2
  local args=() envs=()
  mapfile -t args < <("$PY" -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))))' \
    "$OUT/$name.args.json")
  mapfile -t envs < "$OUT/$name.env"
  [ "${#args[@]}" -gt 1 ] || fail "no serve arguments rendered for $name"
  log "$name: CUDA_VISIBLE_DEVICES=$gpus ${envs[*]} vllm serve ${args[*]}"
  setsid env "${envs[@]}" CUDA_VISIBLE_DEVICES="$gpus" NCCL_DEBUG=WARN \
    "$VLLM_BIN" serve "${args[@]}" > "$OUT/$name.log" 2>&1 &
  LAUNCHED=$!
}

health() { curl -s -m 5 -o /dev/null -w '%{http_code}' "$1/health" || true; }

# complete URL FILE: the fixed greedy completion (16 tokens) into FILE; prints its text.
BODY='{"model":"tiny","prompt":"The quick brown fox","max_tokens":16,"temperature":0,"ignore_eos":true,"logprobs":1}'
complete() {
  curl -sf -m 60 "$1/v1/completions" -H 'Content-Type: application/json' -d "$BODY" > "$2" \
    || return 1
  "$PY" - "$2" <<'EOF'
import json, sys
answer = json.load(open(sys.argv[1]))
assert answer["usage"]["completion_tokens"] == 16, answer
print(repr(answer["choices"][0]["text"]))
EOF
}

# wait_healthy URL TIMEOUT WHAT NAME:PGID...: until URL/health answers 200; fails at once
# (with the last lines of NAME.log) when one of the processes exits, or after TIMEOUT s.
wait_healthy() {
  local url=$1 timeout=$2 what=$3 start pair
  shift 3
  start=$(date +%s)
  while :; do
    for pair in "$@"; do
      kill -0 "${pair#*:}" 2>/dev/null \
        || { tail -n 40 "$OUT/${pair%%:*}.log" | tee -a "$SUMMARY"; fail "${pair%%:*} exited before $what was healthy"; }
    done
    [ "$(health "$url")" = 200 ] && break
    [ $(( $(date +%s) - start )) -lt "$timeout" ] || fail "$what: /health not 200 within $timeout s"
    sleep 2
  done
  log "$what healthy after $(( $(date +%s) - start )) s"
}

# 5. The pipeline group: both ranks, then rank 0's API
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
launch rank0 "$GPUS0"
RANK0_PG=$LAUNCHED
launch rank1 "$GPUS1"
RANK1_PG=$LAUNCHED
URL=http://127.0.0.1:$PORT
wait_healthy "$URL" "$HEALTH_TIMEOUT" "the pipeline group" "rank0:$RANK0_PG" "rank1:$RANK1_PG"

curl -sf "$URL/v1/models" > "$OUT/models.json" || fail "/v1/models failed"
grep -q '"id":"tiny"' "$OUT/models.json" || fail "/v1/models does not list tiny: $(cat "$OUT/models.json")"
PIPE_TEXT=$(complete "$URL" "$OUT/pipeline-completion.json") || fail "the pipeline's completion failed"
log "pipeline completion: $PIPE_TEXT"

# 6. Rank 1's connection to rank 0's master port (the group watchdog relies on it)
ss -tnp state established "( sport = :$MASTER_PORT or dport = :$MASTER_PORT )" > "$OUT/master-port.ss.txt" 2>&1 || true
log "established TCP connections on master port $MASTER_PORT:"
tee -a "$SUMMARY" < "$OUT/master-port.ss.txt"
ESTABLISHED=$(ss -Htn state established "( sport = :$MASTER_PORT or dport = :$MASTER_PORT )" | grep -c . || true)
[ "$ESTABLISHED" -ge 1 ] || fail "no established connection on rank 0's master port $MASTER_PORT"
# Which of them rank 1's processes hold (client side: destination port = master port).
FROM_RANK1=0
OWNERS=0
for pid in $( (ss -Htnp state established "( dport = :$MASTER_PORT )" || true) \
               | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u || true); do
  OWNERS=$(( OWNERS + 1 ))
  if [ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$RANK1_PG" ]; then
    FROM_RANK1=$(( FROM_RANK1 + 1 ))
  fi
done
if [ "$OWNERS" -eq 0 ]; then
  log "master port: $ESTABLISHED established connection(s); ss names no owning processes, so rank 1's share is unknown"
else
  log "master port: $ESTABLISHED established connection(s); $FROM_RANK1 process(es) of rank 1 connected to it"
  [ "$FROM_RANK1" -ge 1 ] || fail "no process of rank 1 holds a connection to rank 0's master port $MASTER_PORT"
fi

# 7. Rank 1 dies: what rank 0 does (recorded, never fails the check)
log "SIGKILL to rank 1's process group ($RANK1_PG)"
kill -KILL -- "-$RANK1_PG" 2>/dev/null || true
wait "$RANK1_PG" 2>/dev/null || true
KILLED_AT=$(date +%s)
( rc=0
  code=$(curl -s -m 20 -o "$OUT/after-kill-completion.json" -w '%{http_code}' "$URL/v1/completions" \
          -H 'Content-Type: application/json' -d "$BODY") || rc=$?
  echo "http ${code:-000}, curl exit $rc" > "$OUT/after-kill-completion.txt" ) &
PROBE_PID=$!
HEALTH_SEEN=""
while [ $(( $(date +%s) - KILLED_AT )) -lt 30 ]; do
  state=$(kill -0 "$RANK0_PG" 2>/dev/null && echo up || echo exited)
  HEALTH_SEEN="$HEALTH_SEEN t+$(( $(date +%s) - KILLED_AT ))s:$(health "$URL")/$state"
  sleep 3
done
wait "$PROBE_PID" 2>/dev/null || true
log "after rank 1's death, rank 0's /health (code/process) over 30 s:$HEALTH_SEEN"
AFTER=$(cat "$OUT/after-kill-completion.txt" 2>/dev/null || echo "no result")
case "$AFTER" in
  *"curl exit 28") log "after rank 1's death, a completion hung: no answer within 20 s ($AFTER)" ;;
  *) log "after rank 1's death, a completion returned: $AFTER" ;;
esac
log "rank 0 still running 30 s after rank 1's death: $(kill -0 "$RANK0_PG" 2>/dev/null && echo yes || echo no)"
stop_group "$RANK0_PG"
RANK0_PG=""

# 8. The reference: one single-node server on one GPU, same model and dtype
launch reference 0
REF_PG=$LAUNCHED
REF_URL=http://127.0.0.1:$REF_PORT
wait_healthy "$REF_URL" 300 "the single-node server" "reference:$REF_PG"
REF_TEXT=$(complete "$REF_URL" "$OUT/reference-completion.json") || fail "the single-node completion failed"
log "single-node completion: $REF_TEXT"
log "pipeline completion:    $PIPE_TEXT"
if [ "$REF_TEXT" != "$PIPE_TEXT" ]; then
  "$PY" - "$OUT/pipeline-completion.json" "$OUT/reference-completion.json" <<'EOF' | tee -a "$SUMMARY" || true
import json, sys
a, b = (json.load(open(p))["choices"][0]["logprobs"] for p in sys.argv[1:3])
for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])):
    if x != y:
        print(f"first difference at token {i}: pipeline {x!r} (top {a['top_logprobs'][i]}), "
              f"single-node {y!r} (top {b['top_logprobs'][i]})")
        break
EOF
  fail "the pipeline's greedy text differs from the single-node server's"
fi
stop_group "$REF_PG"
REF_PG=""
log "PASS in $(( $(date +%s) - START )) s (logs: $OUT)"

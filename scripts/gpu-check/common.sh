# shellcheck shell=bash
# Shared by the GPU checks (engine.sh, pipeline.sh); sourced from the repository root
# after they define log, fail, WORK and OUT.

# The CLI's sources and the collection (this checkout, linked as ansible_collections/
# inferfleet/fleet) on the Python path of the checks' own Python code, where Ansible
# finds the collection too.
mkdir -p "$WORK/collections/ansible_collections/inferfleet"
ln -sfn "$PWD" "$WORK/collections/ansible_collections/inferfleet/fleet"
export PYTHONPATH="$PWD/src:$WORK/collections"

# render_engine PREFIX VAR=YAML...: what the inference_engine role renders for these
# inventory values, rendered by Ansible itself (tests/unit/engine_render.py runs the
# role's preflight and its templates through ansible-playbook, on a local connection):
# PREFIX.service (the unit), PREFIX.args.json (the words after `serve` on its ExecStart)
# and PREFIX.env (its environment file's values, KEY=VALUE a line). Needs PY with
# ansible-core (install_vllm installs it beside vLLM).
render_engine() {
  local prefix=$1
  if ! "$PY" tests/unit/engine_render.py "$@" > "$prefix.render.log" 2>&1; then
    tail -n 20 "$prefix.render.log" | tee -a "$SUMMARY"
    return 1
  fi
}

# vLLM's version: VLLM_VERSION, else the role's inference_engine_version.
VLLM_VERSION=${VLLM_VERSION:-$(sed -n 's/^inference_engine_version: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' \
  roles/inference_engine/defaults/main.yml)}
[ -n "$VLLM_VERSION" ] || fail "could not read inference_engine_version from the role's defaults"

# vLLM in a fresh virtualenv (with --system-site-packages, so a machine that already has
# torch/vLLM reuses them), or CHECK_PYTHON's. Sets PY and VLLM_BIN.
install_vllm() {
  if [ -n "${CHECK_PYTHON:-}" ]; then
    PY=$CHECK_PYTHON
    log "using CHECK_PYTHON=$PY"
  else
    python3 -m venv --system-site-packages "$WORK/venv" || fail "python3 -m venv failed"
    PY=$WORK/venv/bin/python
    log "pip install vllm==$VLLM_VERSION (fresh venv $WORK/venv)"
    if ! timeout 360 "$PY" -m pip install --disable-pip-version-check -q \
          "vllm==$VLLM_VERSION" "ansible-core>=2.19,<2.20" > "$OUT/pip.log" 2>&1; then
      tail -n 20 "$OUT/pip.log" | tee -a "$SUMMARY"
      fail "pip install vllm==$VLLM_VERSION failed (no index reachable? set PIP_INDEX_URL or PIP_FIND_LINKS, or CHECK_PYTHON)"
    fi
  fi
  VLLM_BIN=$(dirname "$PY")/vllm
  [ -x "$VLLM_BIN" ] || fail "$VLLM_BIN missing after the install"
  log "vLLM $("$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))'), torch $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
}

# The tiny random Llama in DIR (4 layers), with attention heads and MLP width divisible
# by TP (vLLM needs that; head_dim stays 64).
tiny_model() {
  local dir=$1 tp=$2 heads kv_heads
  heads=$(( tp > 4 ? tp : 4 ))
  heads=$(( (heads + tp - 1) / tp * tp ))
  kv_heads=$(( heads / 2 ))
  "$PY" - "$dir" "$heads" "$kv_heads" <<'PYEOF' || fail "could not generate the tiny model"
import sys
from pathlib import Path
from inferfleet.lab.tinymodel import generate
heads, kv = int(sys.argv[2]), int(sys.argv[3])
generate(Path(sys.argv[1]), seed=0, shape={"num_attention_heads": heads,
         "num_key_value_heads": kv, "hidden_size": 64 * heads,
         "intermediate_size": 128 * heads})
PYEOF
  log "tiny model: $heads heads, $kv_heads KV heads, 4 layers, in $dir"
}

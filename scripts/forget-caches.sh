#!/usr/bin/env bash
# Make this machine look, to the project, like one that never ran it: remove the lab and
# every container and network of the project, its Docker images (the Debian and Ubuntu
# node images and their bases) and Docker's build cache, its caches under ~/.cache (the
# wheelhouse, the lab's tiny models, molecule's and ansible-compat's state), pip's cache,
# copies of the inferfleet.fleet collection that tools installed, and the checkout's .venv. The next `make test` (or `make demo`) then rebuilds every
# image, wheelhouse and cache from the registries, so a broken download fails there
# rather than hiding behind a cache. System packages (docker.io, debootstrap, haproxy,
# ...) stay: apt's own steps are the same on any machine.
#
# `make test-fresh` is this followed by `make test`; .ci/run calls it before the test
# command, so every landing proves a fresh machine (docs/development.md).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "inferfleet: forget-caches: $*"; }

if [ -x .venv/bin/inferfleet ]; then
  .venv/bin/inferfleet lab down >/dev/null 2>&1 || true
fi

# Docker's state lives on even while no engine runs: start one to clear it.
if docker info >/dev/null 2>&1 || { command -v dockerd >/dev/null 2>&1 && scripts/ensure-docker.sh; }; then
  ours() { grep -E '^inferfleet-' || true; }
  containers=$(docker ps -a --format '{{.Names}}' | ours)
  [ -z "$containers" ] || { say "removing containers: $(echo $containers)"; docker rm -f $containers >/dev/null; }
  networks=$(docker network ls --format '{{.Name}}' | ours)
  [ -z "$networks" ] || { say "removing networks: $(echo $networks)"; docker network rm $networks >/dev/null; }
  images=$(docker images --format '{{.Repository}}:{{.Tag}}' | ours)
  [ -z "$images" ] || { say "removing images: $(echo $images)"; docker rmi -f $images >/dev/null; }
  docker builder prune -af >/dev/null 2>&1
fi

caches=("$HOME/.cache/inferfleet" "$HOME/.cache/molecule" "$HOME/.cache/ansible-compat" .venv
        .ansible "$HOME/.ansible/collections/ansible_collections/inferfleet")
pip_cache=$(python3 -m pip cache dir 2>/dev/null || true)
[ -z "$pip_cache" ] || caches+=("$pip_cache")
for dir in "${caches[@]}"; do
  if [ -e "$dir" ]; then
    say "removing $dir"
    rm -rf "$dir"
  fi
done

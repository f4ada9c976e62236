#!/usr/bin/env bash
# Set up everything the lab and the tests need on a fresh machine: the system packages,
# the virtualenv .venv with inferfleet and its tools, and a Docker engine that answers.
set -euo pipefail
cd "$(dirname "$0")/.."

# System tools: debootstrap builds the node image; haproxy and nginx validate rendered
# configurations in the unit tests; promtool (Debian's prometheus) tests the alert rules;
# nft (nftables) checks the firewall's rendered rules. Installed only where missing, only
# as root on Debian.
missing=()
for tool in debootstrap:debootstrap haproxy:haproxy nginx:nginx-light promtool:prometheus nft:nftables; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "inferfleet: missing ${missing[*]}; install them (Debian/Ubuntu: apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "inferfleet: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # the packages start their services; the lab does not want them on the controller
  systemctl disable --now haproxy nginx prometheus prometheus-node-exporter >/dev/null 2>&1 || true
  pkill -x haproxy 2>/dev/null || true; pkill -x nginx 2>/dev/null || true
  pkill -x prometheus 2>/dev/null || true; pkill -f prometheus-node-exporter 2>/dev/null || true
fi

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "inferfleet: needs Python >= 3.11 (found $("$python" --version 2>&1)); set PYTHON=..." >&2
  exit 1
fi
stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "inferfleet: creating .venv"
  "$python" -m venv .venv
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[test]'
  touch "$stamp"
fi
# The checkout is the inferfleet.fleet collection: the virtualenv finds it (Ansible through
# sys.path, Python for `ansible_collections.inferfleet.fleet...` imports) at
# .venv/collections/ansible_collections/inferfleet/fleet, a link to this folder. A built
# wheel carries a copy there instead (setup.py).
collections=.venv/collections/ansible_collections/inferfleet
if [ "$(readlink "$collections/fleet" 2>/dev/null)" != "$PWD" ]; then
  mkdir -p "$collections"
  ln -sfn "$PWD" "$collections/fleet"
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/.venv/collections" >"$site/inferfleet-collection.pth"

scripts/ensure-docker.sh

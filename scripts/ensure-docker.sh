#!/usr/bin/env bash
# Make sure a Docker engine answers. On Debian/Ubuntu as root, install Debian's docker.io
# and start dockerd by hand when none runs (CI and fresh machines have only a client).
set -euo pipefail

if docker info >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "inferfleet: no Docker engine answers and this is not a Debian/Ubuntu machine run as root." >&2
    echo "Install and start a Docker engine (docker info must answer), then run this again." >&2
    exit 1
  fi
  echo "inferfleet: installing Debian's docker.io (the machine has no Docker engine)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi

log=/var/log/inferfleet-dockerd.log
echo "inferfleet: starting dockerd (log: $log)"
nohup dockerd >"$log" 2>&1 &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "inferfleet: dockerd did not answer within 60 s; see $log" >&2
exit 1

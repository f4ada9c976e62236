#!/usr/bin/env bash
# The gpu_host scenario's Ubuntu 24.04 node: the lab node's recipe (systemd as PID 1,
# python3, the host's extra CA certificates) on an Ubuntu root made with debootstrap,
# since no registry is reachable. Prints the tag; rebuilds only when this recipe or the
# host's CA certificates change (the hash is kept in an image label).
#
# The archive's signing key is fetched from the archive and accepted only if it holds
# the pinned fingerprint of "Ubuntu Archive Automatic Signing Key (2018)".
set -euo pipefail

TAG=${INFERFLEET_UBUNTU_NODE_IMAGE:-inferfleet-node-ubuntu:noble}
SUITE=noble
MIRROR=${INFERFLEET_UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
ARCHIVE_KEY_FPR=F6ECB3762474EDA9D21B7022871920D1991BC93C
CA_DIR=/usr/local/share/ca-certificates

recipe_hash() {
  { cat "$0"; find "$CA_DIR" -name '*.crt' -type f 2>/dev/null | sort | xargs -r cat; } \
    | sha256sum | cut -c1-12
}
HASH=$(recipe_hash)
if [ "$(docker image inspect -f '{{ index .Config.Labels "inferfleet.recipe" }}' "$TAG" 2>/dev/null)" = "$HASH" ]; then
  echo "$TAG"
  exit 0
fi

command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
WORK=$(mktemp -d /tmp/inferfleet-ubuntu-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The archive key, checked against the pinned fingerprint.
curl -fsS -o "$WORK/archive-keys.gpg" "$MIRROR/project/ubuntu-archive-keyring.gpg"
export GNUPGHOME="$WORK/gnupg"
mkdir -m 0700 "$GNUPGHOME"
gpg -q --import "$WORK/archive-keys.gpg" 2>/dev/null
gpg -q --export "$ARCHIVE_KEY_FPR" >"$WORK/keyring.gpg"
gpg --show-keys --with-colons "$WORK/keyring.gpg" | grep -q "^fpr:*$ARCHIVE_KEY_FPR:" \
  || { echo "the archive's key does not have the pinned fingerprint $ARCHIVE_KEY_FPR" >&2; exit 1; }

# debootstrap releases older than noble lack its script; noble uses the common one.
SCRIPT=/usr/share/debootstrap/scripts/$SUITE
[ -e "$SCRIPT" ] || SCRIPT=/usr/share/debootstrap/scripts/gutsy
debootstrap --variant=minbase --keyring="$WORK/keyring.gpg" --include=python3,ca-certificates \
  "$SUITE" "$WORK/root" "$MIRROR" "$SCRIPT" >"$WORK/debootstrap.log" 2>&1 \
  || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
tar -C "$WORK/root" -c . | docker import - "inferfleet-base-ubuntu:$SUITE" >/dev/null

mkdir -p "$WORK/ctx/ca"
find "$CA_DIR" -name '*.crt' -type f -exec cp {} "$WORK/ctx/ca/" \; 2>/dev/null || true
cat >"$WORK/ctx/Dockerfile" <<EOF
FROM inferfleet-base-ubuntu:$SUITE
ENV container=docker DEBIAN_FRONTEND=noninteractive
COPY ca/ /usr/local/share/ca-certificates/
RUN rm -f /etc/apt/sources.list \\
 && printf 'Types: deb\nURIs: $MIRROR\nSuites: $SUITE $SUITE-updates $SUITE-security\nComponents: main restricted universe multiverse\nSigned-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n' \\
      >/etc/apt/sources.list.d/ubuntu.sources \\
 && apt-get update \\
 && apt-get install -y --no-install-recommends \\
      systemd systemd-sysv dbus python3 python3-apt sudo ca-certificates iproute2 procps curl \\
 && update-ca-certificates \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* \\
 && systemctl mask getty.target systemd-logind.service console-getty.service \\
      systemd-udevd.service systemd-modules-load.service sys-kernel-config.mount \\
 && systemctl set-default multi-user.target
LABEL inferfleet.recipe=$HASH
STOPSIGNAL SIGRTMIN+3
CMD ["/sbin/init"]
EOF
docker build -q -t "$TAG" "$WORK/ctx" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log" >&2; exit 1; }
echo "$TAG"

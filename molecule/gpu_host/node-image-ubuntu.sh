#!/usr/bin/env bash
# The gpu_host scenario's Ubuntu 24.04 node: the lab node's recipe (systemd as PID 1,
# python3, the host's extra CA certificates) on an Ubuntu root made with debootstrap,
# since no registry is reachable. Prints the tag; rebuilds only when this recipe or the
# host's CA certificates change (the hash is kept in an image label).
#
# The archive's signing key comes from the archive's own ubuntu-keyring package (found
# through the suite's package index; the archive serves no bare key file) and is accepted
# only if it holds the pinned fingerprint of "Ubuntu Archive Automatic Signing Key
# (2018)". Every failed step prints one line first: "inferfleet: cannot build ...: what
# failed; what to check" (the molecule test shows such lines at the top of its failure).
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

fail() {
  echo "inferfleet: cannot build $TAG: $*" >&2
  exit 1
}
fetch() { # URL FILE
  curl -fsS --retry 2 -o "$2" "$1" 2>"$WORK/curl.err" \
    || fail "download of $1 failed ($(tail -1 "$WORK/curl.err")); check that this machine reaches the Ubuntu archive, or set INFERFLEET_UBUNTU_MIRROR to a mirror"
}
command -v debootstrap >/dev/null || fail "debootstrap is missing; run make setup (or apt-get install debootstrap)"
WORK=$(mktemp -d /tmp/inferfleet-ubuntu-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The archive key: ubuntu-keyring's .deb, located in the suite's package index, unpacked,
# and its key checked against the pinned fingerprint (the index itself is not trusted
# yet: the fingerprint is what is trusted).
fetch "$MIRROR/dists/$SUITE/main/binary-amd64/Packages.gz" "$WORK/Packages.gz"
deb_path=$(zcat "$WORK/Packages.gz" \
  | awk '/^Package: /{p = ($2 == "ubuntu-keyring")} p && !f && /^Filename: /{f = $2} END{print f}')
[ -n "$deb_path" ] || fail "$MIRROR/dists/$SUITE/main/binary-amd64/Packages.gz lists no ubuntu-keyring package; check INFERFLEET_UBUNTU_MIRROR"
fetch "$MIRROR/$deb_path" "$WORK/ubuntu-keyring.deb"
dpkg-deb -x "$WORK/ubuntu-keyring.deb" "$WORK/keyring-pkg" 2>"$WORK/dpkg.err" \
  || fail "$MIRROR/$deb_path is no Debian package ($(tail -1 "$WORK/dpkg.err")); check INFERFLEET_UBUNTU_MIRROR"
export GNUPGHOME="$WORK/gnupg"
mkdir -m 0700 "$GNUPGHOME"
gpg -q --import "$WORK/keyring-pkg/usr/share/keyrings/ubuntu-archive-keyring.gpg" 2>/dev/null || true
gpg -q --export "$ARCHIVE_KEY_FPR" >"$WORK/keyring.gpg" 2>/dev/null
gpg --show-keys --with-colons "$WORK/keyring.gpg" 2>/dev/null | grep -q "^fpr:*$ARCHIVE_KEY_FPR:" \
  || fail "the ubuntu-keyring package at $MIRROR/$deb_path holds no key with the pinned fingerprint $ARCHIVE_KEY_FPR; check INFERFLEET_UBUNTU_MIRROR (a mirror that is not Ubuntu's archive?)"

# debootstrap releases older than noble lack its script; noble uses the common one.
SCRIPT=/usr/share/debootstrap/scripts/$SUITE
[ -e "$SCRIPT" ] || SCRIPT=/usr/share/debootstrap/scripts/gutsy
debootstrap --variant=minbase --keyring="$WORK/keyring.gpg" --include=python3,ca-certificates \
  "$SUITE" "$WORK/root" "$MIRROR" "$SCRIPT" >"$WORK/debootstrap.log" 2>&1 \
  || { tail -20 "$WORK/debootstrap.log" >&2
       fail "debootstrap $SUITE from $MIRROR failed ($(grep -m1 -E '^[EW]: ' "$WORK/debootstrap.log" || tail -1 "$WORK/debootstrap.log")); check that the archive answers"; }
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
docker build -q -t "$TAG" "$WORK/ctx" >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log" >&2
       fail "docker build over $SUITE failed ($(grep -m1 -E '^(E|Err):' "$WORK/build.log" || tail -1 "$WORK/build.log")); check that the archive answers from a container"; }
echo "$TAG"

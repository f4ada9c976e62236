#!/usr/bin/env bash
# Builds the GPU check bundle: one folder, under 64 MiB, that runs the shipped code on a
# GPU machine without network, Ansible or vLLM (python3 with PyTorch and transformers is
# all it needs there). docs/gpu-validation.md says what each of its steps proves.
#
#   scripts/gpu-check/bundle.sh [DEST]        (default: build/gpu-check-bundle)
#
# DEST gets: run.sh (the one entry command), measure.py, wheels/ (ansible-core and what
# it needs, for CPython GPU_CHECK_PYTHONS, default "3.11 3.12", on x86_64 Linux),
# collections/ (this collection's tarball from `ansible-galaxy collection build`, and
# community.general, which gpu_driver uses, packed from the virtualenv's copy).
# Run it from a checkout after scripts/setup.sh (it uses .venv); it needs PyPI (or
# pip's configured index) for the wheels.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-build/gpu-check-bundle}
PYTHONS=${GPU_CHECK_PYTHONS:-3.11 3.12}
LIMIT_MIB=64
VENV=.venv
[ -x "$VENV/bin/ansible-galaxy" ] || { echo "bundle.sh: $VENV is missing: run scripts/setup.sh first" >&2; exit 2; }

core=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("ansible-core"))')
general=$("$VENV/bin/python" -c 'import ansible_collections.community.general as g; print(g.__path__[0])')
[ -f "$general/MANIFEST.json" ] || { echo "bundle.sh: community.general not found in $VENV ($general)" >&2; exit 2; }

rm -rf "$DEST"
mkdir -p "$DEST/wheels" "$DEST/collections"
for version in $PYTHONS; do
  "$VENV/bin/pip" download --quiet --dest "$DEST/wheels" --only-binary=:all: \
    --implementation cp --python-version "$version" \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 \
    "ansible-core==$core"
done
"$VENV/bin/ansible-galaxy" collection build --force --output-path "$DEST/collections" . >/dev/null
tar -czf "$DEST/collections/community-general.tar.gz" \
  -C "$(dirname "$(dirname "$(dirname "$general")")")" \
  --exclude='__pycache__' --exclude='tests' ansible_collections/community/general
cp scripts/gpu-check/bundle-run.sh "$DEST/run.sh"
cp scripts/gpu-check/measure.py "$DEST/measure.py"
chmod 0755 "$DEST/run.sh"
echo "$core" > "$DEST/ansible-core.version"

size=$(du -sm "$DEST" | cut -f1)
echo "bundle.sh: $DEST is ${size} MiB (ansible-core $core, $(ls "$DEST/wheels" | wc -l) wheels)"
if [ "$size" -ge "$LIMIT_MIB" ]; then
  echo "bundle.sh: $DEST is over the device machine's $LIMIT_MIB MiB" >&2
  exit 1
fi

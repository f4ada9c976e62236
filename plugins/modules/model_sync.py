#!/usr/bin/python
# Copyright: inferfleet contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module model_sync: a content-verified, versioned local cache of model weights.

A thin shell over the collection's module_utils: the transfer engine
(model_sync_transfer.py) and the cache and its Syncer (model_sync_cache.py)."""

from __future__ import annotations

import time
import traceback

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible_collections.inferfleet.fleet.plugins.module_utils.manifest import ManifestError
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_cache import Syncer
from ansible_collections.inferfleet.fleet.plugins.module_utils.model_sync_transfer import (
    SyncError,
    _os_error,
)
from ansible_collections.inferfleet.fleet.plugins.module_utils.s3 import S3Error

DOCUMENTATION = r"""
---
module: model_sync
short_description: Fetch a model version into a content-verified local cache
description:
  - Reads the version's C(manifest.json) (see docs/model-sync.md), downloads the files that
    the local cache does not already hold with parallel ranged GETs, hashing every byte as
    it arrives, into a temporary folder on the cache's filesystem.
  - Every file's size and SHA-256 are verified and the files fsynced before the folder is
    renamed to C(CACHE_ROOT/NAME/VERSION); only then is C(CACHE_ROOT/NAME/current)
    switched, atomically, to the new version.
  - A re-run on a complete version (its marker file holds the manifest digest) downloads
    and hashes nothing and reports no change.
  - Any failure removes the temporary files and leaves C(current) as it was.
  - Runs on the node with the Python standard library only.
version_added: "0.1.0"
author: inferfleet contributors
attributes:
  check_mode:
    support: full
    description: Reports what it would fetch and prune; writes nothing.
  diff_mode:
    support: full
    description: The version switch and the files that differ from the previous current version.
  platform:
    platforms: posix
options:
  name:
    description: Model name (the second to last segment of the version's location).
    type: str
    required: true
  version:
    description: Model version (the last segment of the version's location).
    type: str
    required: true
  cache_root:
    description:
      - Local folder holding one sub-folder per model. Must exist and be on a local
        filesystem (see O(allow_remote_cache)).
    type: path
    required: true
  source:
    description:
      - C(s3) reads C(s3://S3_BUCKET/S3_PREFIX/NAME/VERSION/); C(path) reads
        C(PATH_SOURCE/NAME/VERSION/) on a mounted filesystem (NFS, Lustre, ...).
      - For what the nodes make themselves (vLLM's compile cache, see docs/engine.md), with
        no object store behind it. C(folder) publishes the folder O(path_source) of this
        node as NAME/VERSION, offered to O(peers); it has no manifest, so its files are
        hashed into one, and nothing but this node vouches for them. C(peers) takes
        NAME/VERSION only from O(peers), with the manifest of the first that holds it
        whole (pinned by O(manifest_digest) when given) and every piece checked against
        it; a piece that no peer holds fails the run.
    type: str
    choices: [s3, path, folder, peers]
    default: s3
  s3_endpoint:
    description: S3 endpoint URL, C(http(s)://HOST[:PORT]). Path-style addressing is used.
    type: str
  s3_bucket:
    description: Bucket holding the models.
    type: str
  s3_prefix:
    description: Key prefix above C(NAME/VERSION), without leading or trailing slash.
    type: str
    default: ""
  access_key:
    description: S3 access key; empty for anonymous access.
    type: str
    default: ""
  secret_key:
    description: S3 secret key.
    type: str
    default: ""
  session_token:
    description: Temporary-credential session token.
    type: str
    default: ""
  region:
    description: Region used in request signatures.
    type: str
    default: us-east-1
  validate_certs:
    description: Verify the endpoint's TLS certificate.
    type: bool
    default: true
  ca_bundle:
    description: CA bundle file for the endpoint's certificate (default the system's).
    type: path
  path_source:
    description:
      - With O(source=path), the folder that holds C(NAME/VERSION/manifest.json); with
        O(source=folder), the folder to publish.
    type: path
  use_in_place:
    description:
      - With O(source=path), verify the shared copy once and point C(current) at it instead
        of copying it. The verification is remembered (manifest digest plus each file's
        size and modification time) and redone only when one of them changes.
    type: bool
    default: false
  manifest_digest:
    description:
      - Expected manifest digest. The source's manifest must match it, and a local
        complete copy with this digest is used without contacting the source at all.
    type: str
  keep_versions:
    description: Previous versions kept besides the current one; older ones are removed.
    type: int
    default: 2
  activate:
    description:
      - Switch C(current) to this version once it is complete. With C(false) the version
        is only fetched and verified (a rolling update's pre-fetch while the old version
        serves); C(current) and the other versions are left alone, nothing is pruned.
    type: bool
    default: true
  concurrency:
    description: Parallel ranged GETs (or reads, for a path source).
    type: int
    default: 8
  part_size_mb:
    description:
      - Size of one ranged GET in MiB. The transfer holds at most 2 x O(concurrency)
        parts in memory while they wait to be hashed in order.
    type: int
    default: 16
  direct_io:
    description:
      - Write parts with O_DIRECT (no page-cache copy, so the fsync has little left to
        write). Filesystems without O_DIRECT fall back to buffered writes by themselves.
    type: bool
    default: true
  min_free_mb:
    description: Free space (MiB) that must remain on the cache filesystem after the download.
    type: int
    default: 0
  timeout:
    description: Seconds to wait on one network operation.
    type: int
    default: 60
  lock_timeout:
    description: Seconds to wait for another run on this node to release the model's lock.
    type: int
    default: 3600
  owner:
    description: Owner of the files and folders created (default the user running the module).
    type: str
  group:
    description: Group of the files and folders created.
    type: str
  file_mode:
    description: Mode of the model files.
    type: str
    default: "0644"
  dir_mode:
    description: Mode of the folders created.
    type: str
    default: "0755"
  peers:
    description:
      - The engine nodes that take part in sharing this model's pieces (this one may be
        among them), as C(name) and C(url) (C(http://ADDRESS:PORT) of their peer server).
        With peers and a format 2 manifest, each piece comes from a peer that holds it,
        else from the store (only the piece's owner among the nodes fetching the same
        version asks it), and every piece is checked against the manifest's SHA-256
        before it is written or offered; a peer whose piece fails is dropped for the run.
        The node offers what it verified in C(CACHE_ROOT/NAME/.peer-VERSION.json), for
        the role's peer server. See docs/model-sync.md, "Between nodes".
    type: list
    elements: dict
  peer_name:
    description: This node's name among O(peers); required with them.
    type: str
  peer_token:
    description: The bearer token the peer servers ask for (empty for none).
    type: str
    default: ""
  peer_stall_timeout:
    description:
      - Seconds a node waits on a peer that fetches a piece from the store without any
        progress before it fetches the piece itself.
    type: int
    default: 30
  allow_remote_cache:
    description:
      - Accept a cache root on a network filesystem (NFS, Lustre, CIFS, ...). Locks,
        renames and fsync are not reliable there; see docs/model-sync.md.
    type: bool
    default: false
notes:
  - Supports check mode (reports what it would fetch and prune) and diff mode (version,
    manifest digest and file list before and after).
"""

EXAMPLES = r"""
- name: Sync the model from S3
  model_sync:
    name: tiny-llama
    version: v3
    cache_root: /var/lib/inferfleet/models
    s3_endpoint: https://s3.example.internal
    s3_bucket: models
    s3_prefix: llm
    access_key: "{{ vault_s3_access_key }}"
    secret_key: "{{ vault_s3_secret_key }}"
    concurrency: 16
  register: synced

- name: Use a Lustre copy in place, verified once
  model_sync:
    name: tiny-llama
    version: v3
    cache_root: /var/lib/inferfleet/models
    source: path
    path_source: /lustre/models
    use_in_place: true
"""

RETURN = r"""
path:
  description: Folder of the version in the cache (a symlink to the shared copy when used in place).
  type: str
  returned: always
  sample: /var/lib/inferfleet/models/tiny-llama/v3
current_path:
  description: The C(current) symlink of the model, which points at RV(path) after a run.
  type: str
  returned: always
manifest_digest:
  description: Digest of the version's manifest.
  type: str
  returned: always
  sample: sha256:0f4c...
version:
  description: The version synced.
  type: str
  returned: always
previous_version:
  description: The version C(current) pointed at before the run (empty if none).
  type: str
  returned: always
bytes_downloaded:
  description: Bytes of model files fetched from the source (the manifest itself not counted).
  type: int
  returned: always
bytes_hashed:
  description: Bytes hashed on this node during the run.
  type: int
  returned: always
bytes_reused:
  description: Bytes taken from versions already in the cache (hard links) instead of fetched.
  type: int
  returned: always
files_fetched:
  description: Paths of the files fetched (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
files_added:
  description: Paths in this version that the previous current version lacked.
  type: list
  elements: str
  returned: always
files_changed:
  description: Paths whose size or hash differ from the previous current version.
  type: list
  elements: str
  returned: always
pruned:
  description: Versions removed (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
in_place:
  description: Whether the version is used in place on the shared filesystem.
  type: bool
  returned: always
bytes_from_store:
  description: Bytes of model files read from the source (the object store) in this run.
  type: int
  returned: always
bytes_from_peers:
  description: Bytes of model files read from each peer in this run, by peer name.
  type: dict
  returned: always
peers_dropped:
  description: Peers dropped during the run (a piece that failed its SHA-256), with why.
  type: dict
  returned: always
seconds:
  description: Seconds the module took.
  type: float
  returned: always
"""

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    version=dict(type="str", required=True),
    cache_root=dict(type="path", required=True),
    source=dict(type="str", choices=["s3", "path", "folder", "peers"], default="s3"),
    s3_endpoint=dict(type="str", fallback=(env_fallback, ["AWS_ENDPOINT_URL"])),
    s3_bucket=dict(type="str"),
    s3_prefix=dict(type="str", default=""),
    access_key=dict(type="str", default="", no_log=True,
                    fallback=(env_fallback, ["AWS_ACCESS_KEY_ID"])),
    secret_key=dict(type="str", default="", no_log=True,
                    fallback=(env_fallback, ["AWS_SECRET_ACCESS_KEY"])),
    session_token=dict(type="str", default="", no_log=True,
                       fallback=(env_fallback, ["AWS_SESSION_TOKEN"])),
    region=dict(type="str", default="us-east-1"),
    validate_certs=dict(type="bool", default=True),
    ca_bundle=dict(type="path"),
    path_source=dict(type="path"),
    use_in_place=dict(type="bool", default=False),
    manifest_digest=dict(type="str"),
    keep_versions=dict(type="int", default=2),
    activate=dict(type="bool", default=True),
    concurrency=dict(type="int", default=8),
    part_size_mb=dict(type="int", default=16),
    direct_io=dict(type="bool", default=True),
    min_free_mb=dict(type="int", default=0),
    timeout=dict(type="int", default=60),
    lock_timeout=dict(type="int", default=3600),
    owner=dict(type="str"),
    group=dict(type="str"),
    file_mode=dict(type="str", default="0644"),
    dir_mode=dict(type="str", default="0755"),
    allow_remote_cache=dict(type="bool", default=False),
    peers=dict(type="list", elements="dict", options=dict(
        name=dict(type="str", required=True), url=dict(type="str", required=True),
        address=dict(type="str"))),
    peer_name=dict(type="str"),
    peer_token=dict(type="str", default="", no_log=True),
    peer_stall_timeout=dict(type="int", default=30),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = dict(module.params)
    for key in ("concurrency", "part_size_mb", "peer_stall_timeout"):
        if params[key] < 1:
            module.fail_json(msg=f"{key} must be at least 1, got {params[key]}")
    for key in ("keep_versions", "min_free_mb"):
        if params[key] < 0:
            module.fail_json(msg=f"{key} must not be negative, got {params[key]}")
    started = time.monotonic()
    syncer = None
    try:
        syncer = Syncer(params, check_mode=module.check_mode)
        result = syncer.run()
    except (SyncError, ManifestError, S3Error) as exc:
        _fail(module, syncer, str(exc), started)
    except OSError as exc:
        where = exc.filename or params["cache_root"]
        _fail(module, syncer, str(_os_error(exc, "write", where)), started,
              traceback.format_exc())
    except Exception as exc:  # an unexpected bug: keep the trace for the report
        _fail(module, syncer, f"model_sync failed unexpectedly: {exc}", started,
              traceback.format_exc())
    for warning in syncer.warnings:
        module.warn(warning)
    if module._diff and result["changed"]:
        module.exit_json(diff=syncer.diff, **result)
    module.exit_json(**result)


def _fail(module, syncer, msg: str, started: float, trace: str = None) -> None:
    current = syncer.cache.current_version() if syncer else ""
    where = syncer.cache.current_link if syncer else ""
    if current:
        msg += f"; nothing changed: {where} still points to {current}"
    else:
        msg += "; nothing changed"
    extra = {"seconds": round(time.monotonic() - started, 3)}
    if trace:
        extra["exception"] = trace
    module.fail_json(msg=msg, **extra)


if __name__ == "__main__":
    main()

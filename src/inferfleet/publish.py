"""Publish a model version to S3-compatible storage: files first, ``manifest.json`` last.

A version is complete exactly when its manifest exists, so readers (the node-side
model_sync module) never mistake a half-published version for a whole one. The
manifest carries each file's SHA-256 (not the multipart ETag, which is no checksum).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ansible_collections.inferfleet.fleet.plugins.module_utils.manifest import (
    MANIFEST_FILE,
    PIECE_SIZE,
    ManifestError,
    check_name,
    dumps,
    scan,
)

MiB = 1024 * 1024


class PublishError(Exception):
    """A publish that cannot go ahead; the message says what to do."""


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # the key prefix above NAME/VERSION ("" when none)
    name: str
    version: str

    @property
    def version_prefix(self) -> str:
        return "/".join(p for p in (self.prefix, self.name, self.version) if p) + "/"

    def key(self, rel: str) -> str:
        return self.version_prefix + rel

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.version_prefix}"


def parse_s3_url(url: str, name: str | None = None, version: str | None = None) -> S3Location:
    """``s3://BUCKET/PREFIX/NAME/VERSION``; with name and version given, the URL may
    stop at the prefix (``s3://BUCKET/PREFIX``) and they are appended."""
    if not url.startswith("s3://"):
        raise PublishError(f"{url!r} is not an s3:// URL (s3://BUCKET/PREFIX/NAME/VERSION)")
    bucket, _, path = url[len("s3://"):].partition("/")
    if len(bucket) < 3:
        raise PublishError(f"{url!r}: the bucket name must have at least 3 characters")
    parts = [p for p in path.split("/") if p]
    if name and version and parts[-2:] != [name, version]:
        parts += [name, version]
    if len(parts) < 2:
        raise PublishError(f"{url!r} must end in NAME/VERSION (or pass --name and --version)")
    *prefix, url_name, url_version = parts
    if (name and name != url_name) or (version and version != url_version):
        raise PublishError(f"{url!r} ends in {url_name}/{url_version}, but --name/--version "
                           f"say {name or url_name}/{version or url_version}")
    try:
        check_name(url_name, "name")
        check_name(url_version, "version")
    except ManifestError as exc:
        raise PublishError(str(exc)) from None
    return S3Location(bucket, "/".join(prefix), url_name, url_version)


def make_client(endpoint_url: str | None = None, access_key: str | None = None,
                secret_key: str | None = None, region: str | None = None):
    """A boto3 S3 client; unset arguments fall back to the usual AWS environment."""
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": "path"},
        retries={"max_attempts": 5, "mode": "standard"},
        # Third-party stores (SeaweedFS, Ceph, MinIO) differ in the newer default
        # checksums; the manifest's SHA-256 is what we rely on.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        max_pool_connections=64,
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
        aws_access_key_id=access_key or None,
        aws_secret_access_key=secret_key or None,
        region_name=region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        config=config,
    )


@dataclass
class PublishResult:
    location: S3Location
    manifest: dict
    files_uploaded: int
    bytes_uploaded: int
    seconds: float
    removed: list[str] = field(default_factory=list)


def _exists(client, bucket: str, key: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        client.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def _existing_keys(client, loc: S3Location) -> set[str]:
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket,
                                                                 Prefix=loc.version_prefix):
        keys.update(obj["Key"] for obj in page.get("Contents", []))
    return keys


def publish(local_dir: str | Path, url: str, *, client=None, endpoint_url: str | None = None,
            access_key: str | None = None, secret_key: str | None = None,
            region: str | None = None, force: bool = False, name: str | None = None,
            version: str | None = None, concurrency: int = 8, part_size_mb: int = 64,
            log=None) -> PublishResult:
    """Hash ``local_dir``, upload its files in parallel, then the manifest.

    Refuses to replace a published version (its manifest exists) unless ``force``;
    with ``force`` the old manifest is deleted first, so the version reads as
    incomplete until the new manifest lands, and objects the new version lacks are
    removed before that.
    """
    started = time.monotonic()
    say = log or (lambda _msg: None)
    root = Path(local_dir)
    if not root.is_dir():
        raise PublishError(f"{root} is not a folder")
    loc = parse_s3_url(url, name, version)
    client = client or make_client(endpoint_url, access_key, secret_key, region)
    manifest_key = loc.key(MANIFEST_FILE)

    if _exists(client, loc.bucket, manifest_key) and not force:
        raise PublishError(f"{loc.url} is already published (its {MANIFEST_FILE} exists); "
                           "versions are immutable: publish a new version, or pass --force "
                           "to replace it")

    say(f"hashing {root}")
    try:
        manifest = scan(str(root), loc.name, loc.version, piece_size=PIECE_SIZE)
    except ManifestError as exc:
        raise PublishError(str(exc)) from None
    if not manifest["files"]:
        raise PublishError(f"{root} holds no files to publish")
    stats = {f["path"]: _stat(root, f["path"]) for f in manifest["files"]}

    if force:
        client.delete_object(Bucket=loc.bucket, Key=manifest_key)  # incomplete from here on

    from boto3.s3.transfer import TransferConfig

    part = max(5, part_size_mb) * MiB
    transfer = TransferConfig(multipart_threshold=part, multipart_chunksize=part,
                              max_concurrency=max(1, concurrency), use_threads=True)

    def upload(entry: dict) -> int:
        path = root.joinpath(*entry["path"].split("/"))
        client.upload_file(str(path), loc.bucket, loc.key(entry["path"]),
                           ExtraArgs={"Metadata": {"sha256": entry["sha256"]}},
                           Config=transfer)
        if _stat(root, entry["path"]) != stats[entry["path"]]:
            raise PublishError(f"{path} changed while it was being published; publish again")
        size = client.head_object(Bucket=loc.bucket, Key=loc.key(entry["path"]))["ContentLength"]
        if size != entry["size"]:
            raise PublishError(f"{loc.key(entry['path'])} is {size} bytes in the store after "
                               f"upload, {entry['size']} expected")
        return entry["size"]

    total = sum(f["size"] for f in manifest["files"])
    say(f"uploading {len(manifest['files'])} files ({total / MiB:.1f} MiB) to {loc.url}")
    # Largest first, so the long uploads start early.
    ordered = sorted(manifest["files"], key=lambda f: -f["size"])
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(ordered)))) as pool:
        uploaded = sum(pool.map(upload, ordered))

    wanted = {loc.key(f["path"]) for f in manifest["files"]}
    stale = sorted(k for k in _existing_keys(client, loc) if k not in wanted
                   and k != manifest_key)
    for key in stale:  # left by an earlier (forced or interrupted) publish of this version
        client.delete_object(Bucket=loc.bucket, Key=key)

    client.put_object(Bucket=loc.bucket, Key=manifest_key, Body=dumps(manifest).encode("utf-8"),
                      ContentType="application/json")
    return PublishResult(loc, manifest, len(ordered), uploaded,
                         round(time.monotonic() - started, 3), stale)


def _stat(root: Path, rel: str) -> tuple[int, int]:
    st = root.joinpath(*rel.split("/")).stat()
    return st.st_size, st.st_mtime_ns
